#!/usr/bin/env bash
# Creates the project's virtual environment and installs gnncompile into it, editable
# (`pip install --no-build-isolation -e .`): Python sources are imported from the checkout, and
# importing gnncompile rebuilds the native module when a C++/CUDA source changed.
#   - torch: the one already installed for $PYTHON if there is one (the venv then sees the
#     system site-packages); otherwise a CPU build (torch==$TORCH_CPU_VERSION) on a machine
#     with no NVIDIA GPU, or the default (CUDA) build where `nvidia-smi` finds a GPU.
#   - the native module is compiled against that torch (--no-build-isolation), never a second one.
set -euo pipefail
PYTHON=${PYTHON:-python3}
VENV=${VENV:-.venv}
TORCH_CPU_VERSION=${TORCH_CPU_VERSION:-2.13.0}

if [ ! -x "$VENV/bin/python" ]; then
  if "$PYTHON" -c "import torch" >/dev/null 2>&1; then
    echo "setup: using the torch installed for $PYTHON ($("$PYTHON" -c 'import torch; print(torch.__version__)'))"
    "$PYTHON" -m venv --system-site-packages "$VENV"
  else
    "$PYTHON" -m venv "$VENV"
  fi
fi
PY="$VENV/bin/python"
"$PY" -m pip install -q --upgrade pip

if ! "$PY" -c "import torch" >/dev/null 2>&1; then
  if command -v nvidia-smi >/dev/null 2>&1 && nvidia-smi -L >/dev/null 2>&1; then
    echo "setup: GPU found, installing torch (CUDA build)"
    "$PY" -m pip install -q torch
  else
    echo "setup: no GPU, installing the CPU build torch==$TORCH_CPU_VERSION"
    "$PY" -m pip install -q "torch==$TORCH_CPU_VERSION"
  fi
fi

# Build tools and the packages the tests and benchmarks use (optuna-dashboard, psycopg2-binary
# and pgserver, whose PostgreSQL binaries tests/tuner/test_tuner_storage.py runs, are for the tuner's
# storage tests; lightning is for tests/compiler/test_ecosystem.py). Of these only lightning and its
# dependencies pytorch-lightning and torchmetrics require torch (lightning 2.6: torch>=2.1,<4.0),
# and pip keeps an already-installed torch that satisfies a requirement (no --upgrade here).
# The constraint pins the torch chosen above anyway, so that pip fails rather than replace it.
TORCH_PIN="$(mktemp)"
trap 'rm -f "$TORCH_PIN"' EXIT
"$PY" -c 'import torch; print("torch==" + torch.__version__)' > "$TORCH_PIN"
"$PY" -m pip install -q -c "$TORCH_PIN" "scikit-build-core>=1.0" "pybind11>=2.12" cmake ninja numpy \
  "torch_geometric>=2.5" scipy "pytest>=7" "pytest-xdist>=3.5" "hypothesis>=6" matplotlib "optuna>=3.5" tqdm onnx onnxruntime onnxscript \
  optuna-dashboard psycopg2-binary pgserver lightning

"$PY" -m pip install -q --no-build-isolation --no-deps -e .
# Check from outside the repository that the installed package loads its native kernels.
PY_ABS="$(cd "$(dirname "$PY")" && pwd)/$(basename "$PY")"
(cd / && "$PY_ABS" -c "import gnncompile, json; i = gnncompile.info(); print(json.dumps(i, indent=1)); raise SystemExit(0 if i['native'] else 'setup: the native module did not load')")
