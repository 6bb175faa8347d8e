# Two commands on a fresh machine: `make workbook` (the main job) and `make test`.
PYTHON ?= python3
VENV   := .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.installed
PARAMS ?=
JS_DIR := $(VENV)/share/workbook-js
JS_STAMP := $(JS_DIR)/.installed

.PHONY: workbook test test-fast bench clean chromium npm kernels cross

# Native CPU kernels (MindSpore AOT custom ops, model.kernels=native|auto), compiled for the compiler's own target:
# x86-64-v3 (AVX2+FMA: vectorised on any x86 CPU from about 2015 on, without tying the library to this machine's
# CPU as -march=native would) or armv8-a (the Kunpeng CPUs of Ascend hosts); another target gets portable code.
# sources.sha256 beside the library records what it was built from; helpers/run/kernels.py refuses a stale one.
# Without g++, or when the compile fails, this prints a note and goes on: model.kernels=auto (the default) then uses
# MindSpore's own ops.
CXX          ?= g++
NATIVE_SRC   := $(sort $(wildcard native/*.cc native/*.h))
NATIVE_LIB   ?= native/build/libwbkernels.so
NATIVE_TARGET = $(shell $(CXX) -dumpmachine 2>/dev/null)
NATIVE_ARCH   = $(if $(findstring x86_64,$(NATIVE_TARGET)),-march=x86-64-v3,$(if $(findstring aarch64,$(NATIVE_TARGET)),-march=armv8-a))
NATIVE_FLAGS ?= -O3 $(NATIVE_ARCH) -fno-math-errno -fopenmp-simd -shared -fPIC -Wall -Wextra

kernels: $(NATIVE_LIB)

$(NATIVE_LIB): $(NATIVE_SRC) Makefile
	@mkdir -p $(dir $@)
	@if ! command -v $(CXX) >/dev/null; then \
	  echo "note: $(CXX) not found; native kernels not built (model.kernels=auto uses MindSpore's ops;" \
	    "model.kernels=native fails until \`make kernels\` succeeds)"; \
	elif $(CXX) $(NATIVE_FLAGS) -o $@.tmp native/wb_kernels.cc; then \
	  mv $@.tmp $@ && cat $(NATIVE_SRC) | sha256sum > $(dir $@)sources.sha256 && \
	  echo "built $@ for $(or $(NATIVE_TARGET),an unknown target)"; \
	else rm -f $@.tmp; echo "note: $(CXX) could not compile native/wb_kernels.cc for $(or $(NATIVE_TARGET),its target)" \
	  "(above); native kernels not built (model.kernels=auto uses MindSpore's ops)"; fi

$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install -q --upgrade pip
	$(BIN)/python -m pip install -q -e '.[test]'
	$(BIN)/python -m ipykernel install --sys-prefix --name python3 >/dev/null
	touch $@

# Local copies of require.js and the widget HTML manager, so widgets in the HTML reports render offline.
$(JS_STAMP): | $(STAMP)
	@if command -v npm >/dev/null; then \
	  rm -rf $(JS_DIR) && mkdir -p $(JS_DIR)/html-manager && cd $(JS_DIR) && \
	  npm pack --silent @jupyter-widgets/html-manager@1.0.15 requirejs@2.3.8 >/dev/null && \
	  tar -xzf jupyter-widgets-html-manager-1.0.15.tgz --strip-components=2 -C html-manager package/dist && \
	  tar -xzf requirejs-2.3.8.tgz --strip-components=1 package/require.js && rm -f *.tgz && touch .installed; \
	else echo "note: npm not found; widgets in HTML reports will need internet to render"; fi

# npm for the widget JS above (Debian package). Without it the widget test skips, and CI fails such a skip.
npm:
	@command -v npm >/dev/null || { apt-get update -qq && apt-get install -y -qq npm >/dev/null; } \
	  || echo "note: could not install npm; widgets in HTML reports will need internet to render"

# Headless Chromium for tests/test_browser.py (Debian package; the test skips, saying why, without it — under
# CI=true, as .ci/run sets, that skip fails the run).
chromium:
	@command -v chromium >/dev/null || { apt-get update -qq && apt-get install -y -qq chromium >/dev/null; } \
	  || echo "note: could not install chromium; the browser test will be skipped"

# Debian's aarch64 cross compiler, for tests/test_native_build.py: the kernels' rule must build for an Ascend host's
# CPU too. Without it that test skips, and CI fails such a skip.
cross:
	@command -v aarch64-linux-gnu-g++ >/dev/null || { apt-get update -qq && \
	  apt-get install -y -qq g++-aarch64-linux-gnu >/dev/null; } \
	  || echo "note: could not install g++-aarch64-linux-gnu; the cross-build test will be skipped"

workbook: $(STAMP) $(JS_STAMP) kernels
	$(BIN)/python -m helpers workbook $(if $(PARAMS),--params $(PARAMS)) $(if $(CONFIG),--config $(CONFIG))

bench: $(STAMP) kernels
	$(BIN)/python bench/bench.py all

test: $(STAMP) npm $(JS_STAMP) chromium cross kernels
	$(BIN)/python -m pytest -q

# The inner loop: the tests not marked slow (no rounds, no notebook runs; about a minute on two workers). CI runs
# `make test`.
test-fast: $(STAMP) kernels
	$(BIN)/python -m pytest -q -m "not slow"

clean:
	rm -rf $(VENV) reports runs native/build
