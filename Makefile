# The two set-up commands of the README: `make demo` and `make test`.
PYTHON ?= python3
VENV   := .venv
PY     := $(VENV)/bin/python
# torch first, pinned (an unpinned torch pulls the newest multi-GB CUDA build). Where pip's
# index is plain PyPI, torch==2.13.0 on Linux is the CUDA build too; for the CPU build:
#   make demo TORCH="torch==2.13.0 --index-url https://download.pytorch.org/whl/cpu"
TORCH  ?= torch==2.13.0
STAMP  := $(VENV)/.installed

.PHONY: demo test test-fast lab install clean benchmarks

$(PY):
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip

$(STAMP): $(PY) pyproject.toml
	$(PY) -c "import torch" 2>/dev/null || $(PY) -m pip install --quiet $(TORCH)
	$(PY) -m pip install --quiet -e ".[dev]"
	touch $(STAMP)

install: $(STAMP)

demo: $(STAMP)
	$(VENV)/bin/kit demo

test: $(STAMP)
	$(PY) -m pytest -q -p no:cacheprovider --nbval-lax --nbval-current-env tests notebooks

test-fast: $(STAMP)
	$(PY) -m pytest -q -x -m "not browser and not slow" tests

lab: $(STAMP)
	$(VENV)/bin/jupyter lab notebooks/

benchmarks: $(STAMP)
	for b in benchmarks/*.py; do echo "== $$b"; $(PY) $$b || exit 1; done

clean:
	rm -rf $(VENV) build *.egg-info
