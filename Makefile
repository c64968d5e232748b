# On a fresh clone, `make check` and `make test` do everything: the first one
# run creates the virtualenv, installs the package with its dev extras and the
# TLA+ Jupyter kernel spec, then does its job.

VENV ?= .venv
PYTHON ?= python3
HYPOTHESIS_PROFILE ?= ci
export HYPOTHESIS_PROFILE

BIN := $(VENV)/bin
# `make check` keeps each finished TLC run here, keyed by a digest of every
# input (modules, cfg, options, jar, java); `make test`'s model tests read
# the same directory, so in CI (`make check` then `make test`) every model
# TLC has just checked is not run a second time, only its verdict re-checked
# (reference/toolledger/check/tlccache.py). `make check TLC_CACHE=` turns it off.
TLC_CACHE ?= $(CURDIR)/build/tlc-cache
# Rebuilt whenever pyproject.toml changes (dependencies, entry points) or the
# kernel module does (the installed kernel.json names its module path).
SETUP := $(VENV)/.installed
NOTEBOOKS := $(wildcard notebooks/*.ipynb)
NOTEBOOKS_HTML ?= build/notebooks-html

.PHONY: help setup check test lint typecheck pytest bench deep notebooks notebooks-html clean distclean

help:
	@echo "make check      model-check every model in model/manifest.toml (toolledger check)"
	@echo "make test       ruff, mypy --strict, pytest and the notebooks (HYPOTHESIS_PROFILE=$(HYPOTHESIS_PROFILE))"
	@echo "make bench      run benchmarks/run_all.py"
	@echo "make deep       sample the deep model with TLC's random simulation (toolledger deep)"
	@echo "make notebooks  re-execute notebooks/*.ipynb in place"
	@echo "make notebooks-html  render the committed notebooks, code hidden, into $(NOTEBOOKS_HTML)/"
	@echo "make setup      only create $(VENV) and install into it (the others do this first)"
	@echo "make clean      remove caches and build output; make distclean also removes $(VENV)"

setup: $(SETUP)

$(SETUP): pyproject.toml reference/toolledger/notebook/kernel.py
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --upgrade pip
	$(BIN)/python -m pip install -e '.[dev]'
	$(BIN)/python -m toolledger.notebook.kernel install --sys-prefix
	touch $@

check: $(SETUP)
	$(BIN)/toolledger check $(if $(TLC_CACHE),--tlc-cache $(TLC_CACHE))

test: lint typecheck pytest

lint: $(SETUP)
	$(BIN)/ruff check .

typecheck: $(SETUP)
	$(BIN)/mypy --strict

# The notebooks run under nbmake with the tests: a notebook whose TLA+ parse
# or model check fails fails `make test` (see toolledger/notebook/kernel.py).
# Only the plugins the suite needs are loaded: auto-loading every installed
# pytest11 plugin (the integrations' dependencies bring several) cost ~10 s
# of every start. Hypothesis' plugin and nbmake are named here; the connector
# kit's plugin (toolledger.extra.pytest) is loaded by the tests whose subject
# it is (tests/test_extra_pytest.py). The same set collects the same tests.
PYTEST_PLUGIN_ARGS := -p _hypothesis_pytestplugin -p nbmake -p xdist
# The tests and notebooks run on every core (pytest-xdist), a test file per
# worker at a time (--dist loadfile: a module's fixtures, such as the
# TwoCalls state graph of test_conformance, are built once). Every test is
# derandomized (HYPOTHESIS_PROFILE=ci), so which worker runs it changes
# nothing; `make pytest PYTEST_WORKERS=0` runs them in one process.
PYTEST_WORKERS ?= auto
pytest: $(SETUP)
	PYTEST_DISABLE_PLUGIN_AUTOLOAD=1 TOOLLEDGER_TLC_CACHE=$(TLC_CACHE) $(BIN)/python -m pytest $(PYTEST_PLUGIN_ARGS) -n $(PYTEST_WORKERS) --dist loadfile tests $(if $(NOTEBOOKS),--nbmake $(NOTEBOOKS))

bench: $(SETUP)
	$(BIN)/python benchmarks/run_all.py

# On demand, not in CI: 3 calls, 3 crashes, 3 attempts, expiring keys, too
# big to enumerate; TLC samples DEEP_TRACES behaviours (toolledger/check/deep.py).
DEEP_TRACES ?= 20000
deep: $(SETUP)
	$(BIN)/toolledger deep --traces $(DEEP_TRACES)

# jupyter-execute stops at the first failing cell and exits non-zero; the TLA+
# kernel makes a failed parse or model check such a failure.
notebooks: $(SETUP)
ifeq ($(NOTEBOOKS),)
	@echo "no notebooks in notebooks/"
else
	$(BIN)/jupyter-execute --inplace $(NOTEBOOKS)
endif

# For reviewers who do not run Jupyter: the notebooks as committed (not re-run), code
# inputs hidden; refuses a notebook whose outputs name a machine path.
notebooks-html: $(SETUP)
	$(BIN)/python -m toolledger.notebook.html --out $(NOTEBOOKS_HTML) $(NOTEBOOKS)

clean:
	rm -rf build dist reference/*.egg-info .mypy_cache .ruff_cache .pytest_cache .hypothesis
	find . -path ./$(VENV) -prune -o -type d -name __pycache__ -prune -exec rm -rf {} +

distclean: clean
	rm -rf $(VENV)
