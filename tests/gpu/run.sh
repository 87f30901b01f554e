#!/usr/bin/env bash
# The GPU check, from a fresh copy of the repository on a CUDA machine (no network needed):
#
#   bash tests/gpu/run.sh OUTDIR
#
#   1. installs gnncompile against the installed torch with its CUDA kernels required
#      (pip --no-build-isolation --no-deps, GNNCOMPILE_CUDA=ON, only the local GPU's
#      architecture unless TORCH_CUDA_ARCH_LIST says otherwise) and copies the compiled module
#      into gnncompile/ as scripts/setup_env.sh does; if that fails, builds the same sources
#      with torch.utils.cpp_extension instead;
#   2. runs `pytest tests -x` (everything but tests/gpu) and then `pytest tests/gpu`;
#   3. runs benchmarks/gpu_ops.py (spmm sum, F=128, 1M-node / 10M-edge power-law graph).
#
# Everything lands in OUTDIR, eight files at most: env.txt, build.log, tests.log,
# gpu_tests.log, bench.log, gpu_ops.json, gpu_ops.txt, summary.txt. Exit status: 0 when the
# build, both test runs and the benchmark's agreement check pass. Sized for ~5 minutes on an
# H200 (16 CPU cores); each phase has a time limit so the whole stays under ~9 minutes.
set -u -o pipefail

OUT="${1:?usage: tests/gpu/run.sh OUTDIR}"
mkdir -p "$OUT"
OUT="$(cd "$OUT" && pwd)"
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
cd "$ROOT"
PY="${PYTHON:-python3}"
export PYTHONUNBUFFERED=1
JOBS="$(nproc 2>/dev/null || echo 8)"
SUMMARY="$OUT/summary.txt"
: > "$SUMMARY"
STATUS=0
T_START=$(date +%s)

note() { echo "$*" | tee -a "$SUMMARY"; }
phase() {  # phase NAME LIMIT LOG cmd...: runs cmd with a time limit, records rc and duration
  local name="$1" limit="$2" log="$3"; shift 3
  local t0 rc
  t0=$(date +%s)
  timeout --signal=INT --kill-after=15 "$limit" "$@" >>"$log" 2>&1
  rc=$?
  note "$(printf '%-12s rc=%-3s %4ss  (log: %s)' "$name" "$rc" "$(( $(date +%s) - t0 ))" "$(basename "$log")")"
  return $rc
}

# ---------------------------------------------------------------------------- environment
{
  echo "== date"; date -u
  echo "== nvidia-smi"; nvidia-smi 2>&1 | head -20
  echo "== nvcc"; (nvcc --version || /usr/local/cuda/bin/nvcc --version) 2>&1 | tail -2
  echo "== python / torch"
  "$PY" - <<'PYEOF' 2>&1
import sys, torch
print(sys.version)
print("torch", torch.__version__, "cuda", torch.version.cuda, "available", torch.cuda.is_available())
print(torch.cuda.get_device_properties(0))
print("capability", torch.cuda.get_device_capability(0))
PYEOF
  echo "== packages"; "$PY" -m pip list 2>/dev/null | grep -i -E "^(torch|torch.geometric|pybind11|scikit-build-core|cmake|ninja|pytest|hypothesis|numpy) " 
} > "$OUT/env.txt" 2>&1

if [ -z "${TORCH_CUDA_ARCH_LIST:-}" ]; then
  TORCH_CUDA_ARCH_LIST="$("$PY" -c 'import torch; a, b = torch.cuda.get_device_capability(0); print(f"{a}.{b}")' 2>/dev/null || echo 9.0)"
  export TORCH_CUDA_ARCH_LIST
fi
note "gnncompile GPU run: $(date -u); arch list $TORCH_CUDA_ARCH_LIST; $JOBS jobs; root $ROOT"

# ---------------------------------------------------------------------------- 1. build
# As scripts/setup_env.sh does: install the package against this torch (no build isolation, no
# dependency downloads), with the CUDA kernels required, then place the compiled module in the
# source tree too, so Python started from the repository root (python -m pytest) loads it.
LOG="$OUT/build.log"
: > "$LOG"
rm -f "$ROOT"/gnncompile/_C*.so
export CMAKE_BUILD_PARALLEL_LEVEL="$JOBS"
if ! command -v nvcc >/dev/null 2>&1 && [ -x /usr/local/cuda/bin/nvcc ]; then
  export PATH="/usr/local/cuda/bin:$PATH"
fi
[ -z "${CUDACXX:-}" ] && command -v nvcc >/dev/null 2>&1 && export CUDACXX="$(command -v nvcc)"
build_pip() {
  "$PY" -m pip install -v --no-build-isolation --no-deps --no-index \
      --config-settings=cmake.define.GNNCOMPILE_CUDA=ON "$ROOT" &&
  so="$(cd / && "$PY" -c 'import gnncompile._C as c; print(c.__file__)')" &&
  cp -f "$so" "$ROOT/gnncompile/"
}
build_cpp_extension() {  # fallback: the same sources through torch's own extension builder
  "$PY" - "$ROOT" "$ROOT/build/gpu-check-ext" <<'PYEOF'
import glob, os, shutil, sys
from torch.utils import cpp_extension
root, bdir = sys.argv[1], sys.argv[2]
os.makedirs(bdir, exist_ok=True)
n = os.path.join(root, "native")
sources = [os.path.join(n, "module.cpp")] + sorted(glob.glob(os.path.join(n, "cpu", "*.cpp"))) \
    + sorted(glob.glob(os.path.join(n, "cuda", "*.cu")))
mod = cpp_extension.load(name="_C", sources=sources, extra_include_paths=[n], build_directory=bdir,
                         extra_cflags=["-O3", "-fopenmp", "-DGNNCOMPILE_WITH_CUDA=1"],
                         extra_cuda_cflags=["-O3", "--expt-relaxed-constexpr"],
                         extra_ldflags=["-fopenmp"], verbose=True)
shutil.copy(mod.__file__, os.path.join(root, "gnncompile", os.path.basename(mod.__file__)))
print("built", mod.__file__)
PYEOF
}
export ROOT PY
export -f build_pip build_cpp_extension
if ! phase build-pip 300 "$LOG" bash -c build_pip; then
  echo "== pip build failed; trying torch.utils.cpp_extension (tests that check the installed" \
       "distribution will fail)" >> "$LOG"
  phase build-ext 240 "$LOG" bash -c build_cpp_extension || STATUS=1
fi
echo "== gnncompile.info() after the build (from the repository root)" >> "$OUT/env.txt"
if ! "$PY" -c 'import json, gnncompile; i = gnncompile.info(); print(json.dumps(i, indent=1, default=str)); raise SystemExit(0 if i["cuda_kernels"] else 1)' >> "$OUT/env.txt" 2>&1; then
  note "gnncompile does not report CUDA kernels after the build (see env.txt, build.log)"
  STATUS=1
fi

# ---------------------------------------------------------------------------- 2. tests
phase tests 100 "$OUT/tests.log" "$PY" -m pytest tests -x -q -rs -p no:cacheprovider --ignore=tests/gpu || STATUS=1
phase gpu-tests 150 "$OUT/gpu_tests.log" "$PY" -m pytest tests/gpu -q -rs -p no:cacheprovider --durations=15 || STATUS=1
if grep -q -E "^SKIPPED .*needs a CUDA device" "$OUT/gpu_tests.log"; then
  note "tests/gpu were SKIPPED: the CUDA kernels were not loaded"
  STATUS=1
fi

# ---------------------------------------------------------------------------- 3. benchmark
phase benchmark 120 "$OUT/bench.log" "$PY" benchmarks/gpu_ops.py --out "$OUT" || STATUS=1
[ -f "$OUT/gpu_ops.txt" ] && cat "$OUT/gpu_ops.txt" >> "$SUMMARY"

note "total $(( $(date +%s) - T_START ))s; status $STATUS"
exit $STATUS
