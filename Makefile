# gnncompile: `make demo` (environment + build + main job) and `make test` (the tests).
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.gnncompile-installed
# gnncompile is installed editable: an edited .py takes effect at the next import, and importing
# gnncompile rebuilds the native module when a C++/CUDA source changed. Only the build
# configuration needs a reinstall.
SOURCES := pyproject.toml CMakeLists.txt scripts/setup_env.sh

.PHONY: demo test test-fast test-all env install bench cuda-check clean

# Creates .venv and installs gnncompile (editable) into it.
$(STAMP): $(SOURCES)
	PYTHON=$(PYTHON) VENV=$(VENV) bash scripts/setup_env.sh
	touch $@

env install: $(STAMP)

# The main job, on graphs the project generates itself: train a model eagerly and compiled
# (speedup + explain report), then the fused ops against their peers.
demo: $(STAMP)
	$(VENV)/bin/gnncompile demo
	$(PY) -m benchmarks ops --quick

# Every test (what CI runs), on every core: pytest-xdist workers, each taking whole files (a
# file's tests run in order in one process, sharing its fixtures). test-fast leaves out the tests
# marked slow (each over 0.4 s in its last measurement, tests/slow_list.py; none the only cover for its behaviour): a few minutes, for
# the edit-test loop.
test: $(STAMP)
	$(VENV)/bin/python -m pytest -q -n auto --dist loadfile

test-fast: $(STAMP)
	$(VENV)/bin/python -m pytest -q -n auto --dist loadfile -m "not slow"

test-all: test

bench: $(STAMP)
	$(PY) -m benchmarks ops --memory

# Compiles every CUDA kernel with nvcc (no GPU needed); the glue files need torch's headers,
# taken from the project's environment.
cuda-check: $(STAMP)
	PYTHON=$(PY) bash scripts/cuda_check.sh

clean:
	rm -rf build $(VENV) .pytest_cache .hypothesis
