# gnncompile: `make demo` (environment + build + main job) and `make test` (the tests).
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.gnncompile-installed
SOURCES := pyproject.toml CMakeLists.txt scripts/setup_env.sh \
	$(wildcard native/*.cpp native/*/*.h native/*/*.cpp native/*/*.cuh native/*/*.cu) \
	$(wildcard gnncompile/*.py gnncompile/*/*.py tuner/*.py tuner/*/*.py)

.PHONY: demo test test-all env install bench bench-memory cuda-check clean

# Creates .venv and (re)installs gnncompile whenever a source file changed.
$(STAMP): $(SOURCES)
	PYTHON=$(PYTHON) VENV=$(VENV) bash scripts/setup_env.sh
	touch $@

env install: $(STAMP)

# The main job, on graphs the project generates itself: train a model eagerly and compiled
# (speedup + explain report), then the fused ops against their peers.
demo: $(STAMP)
	$(PY) -m gnncompile.demo
	$(PY) benchmarks/ops.py --quick

# Tests run against the installed package (pytest's entry point does not put the repository
# root on sys.path, so the source tree cannot shadow the built module).
test: $(STAMP)
	$(VENV)/bin/pytest -q -m "not slow"

test-all: $(STAMP)
	$(VENV)/bin/pytest -q

bench: $(STAMP)
	$(PY) benchmarks/ops.py --memory

# Compiles every CUDA kernel with nvcc (no GPU needed); the glue files need torch's headers,
# taken from the project's environment.
cuda-check: $(STAMP)
	PYTHON=$(PY) bash scripts/cuda_check.sh

clean:
	rm -rf build $(VENV) .pytest_cache .hypothesis
