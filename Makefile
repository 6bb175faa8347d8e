# Two commands on a fresh machine: `make workbook` (the main job) and `make test`.
PYTHON ?= python3
VENV   := .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.installed
PARAMS ?=

.PHONY: workbook test bench clean

$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install -q --upgrade pip
	$(BIN)/python -m pip install -q -e '.[test]'
	$(BIN)/python -m ipykernel install --sys-prefix --name python3 >/dev/null
	touch $@

workbook: $(STAMP)
	$(BIN)/python -m helpers workbook $(if $(PARAMS),--params $(PARAMS))

test: $(STAMP)
	$(BIN)/python -m pytest -q

clean:
	rm -rf $(VENV) reports runs
