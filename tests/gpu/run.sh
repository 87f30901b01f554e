#!/usr/bin/env bash
# The GPU check, from a fresh copy of the repository on a CUDA machine (no network needed):
#
#   bash tests/gpu/run.sh OUTDIR
#
#   1. installs gnncompile editable against the installed torch with its CUDA kernels required
#      (pip install --no-build-isolation --no-deps -e ., as scripts/setup_env.sh does, with
#      GNNCOMPILE_CUDA=ON and only the local GPU's architecture unless TORCH_CUDA_ARCH_LIST
#      says otherwise);
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
# As scripts/setup_env.sh does: an editable install against this torch (no build isolation, no
# dependency downloads), with the CUDA kernels required.
LOG="$OUT/build.log"
: > "$LOG"
export CMAKE_BUILD_PARALLEL_LEVEL="$JOBS"
if ! command -v nvcc >/dev/null 2>&1 && [ -x /usr/local/cuda/bin/nvcc ]; then
  export PATH="/usr/local/cuda/bin:$PATH"
fi
[ -z "${CUDACXX:-}" ] && command -v nvcc >/dev/null 2>&1 && export CUDACXX="$(command -v nvcc)"
phase build 300 "$LOG" "$PY" -m pip install -v --no-build-isolation --no-deps --no-index \
    --config-settings=cmake.define.GNNCOMPILE_CUDA=ON -e "$ROOT" || STATUS=1
echo "== gnncompile.info() after the build" >> "$OUT/env.txt"
if ! (cd / && "$PY" -c 'import json, gnncompile; i = gnncompile.info(); print(json.dumps(i, indent=1, default=str)); raise SystemExit(0 if i["cuda_kernels"] else 1)') >> "$OUT/env.txt" 2>&1; then
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
