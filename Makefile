# Two commands on a fresh machine: `make workbook` (the main job) and `make test`.
PYTHON ?= python3
VENV   := .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.installed
PARAMS ?=
JS_DIR := $(VENV)/share/workbook-js
JS_STAMP := $(JS_DIR)/.installed

.PHONY: workbook test test-fast bench clean chromium npm kernels

# Native CPU kernels (MindSpore AOT custom ops, model.kernels=native|auto). x86-64-v3 = AVX2+FMA: vectorised on
# any x86 CPU from about 2015 on, without tying the library to this machine's CPU as -march=native would.
# sources.sha256 records what the library was built from; helpers/run/kernels.py refuses a stale one.
# Without g++ this prints a note and goes on: model.kernels=auto (the default) then uses MindSpore's own ops.
CXX          ?= g++
NATIVE_SRC   := $(sort $(wildcard native/*.cc native/*.h))
NATIVE_LIB   := native/build/libwbkernels.so
NATIVE_FLAGS ?= -O3 -march=x86-64-v3 -fno-math-errno -fopenmp-simd -shared -fPIC -Wall -Wextra

kernels: $(NATIVE_LIB)

$(NATIVE_LIB): $(NATIVE_SRC) Makefile
	@mkdir -p native/build
	@if command -v $(CXX) >/dev/null; then \
	  $(CXX) $(NATIVE_FLAGS) -o $@.tmp native/wb_kernels.cc && mv $@.tmp $@ && \
	  cat $(NATIVE_SRC) | sha256sum > native/build/sources.sha256 && echo "built $@"; \
	else echo "note: $(CXX) not found; native kernels not built (model.kernels=auto uses MindSpore's ops;" \
	  "model.kernels=native fails until \`make kernels\` succeeds)"; fi

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

workbook: $(STAMP) $(JS_STAMP) kernels
	$(BIN)/python -m helpers workbook $(if $(PARAMS),--params $(PARAMS))

bench: $(STAMP) kernels
	$(BIN)/python bench/bench.py all

test: $(STAMP) npm $(JS_STAMP) chromium kernels
	$(BIN)/python -m pytest -q

# The inner loop: the tests not marked slow (no rounds, no notebook runs; about a minute on two workers). CI runs
# `make test`.
test-fast: $(STAMP) kernels
	$(BIN)/python -m pytest -q -m "not slow"

clean:
	rm -rf $(VENV) reports runs native/build
