#!/usr/bin/env bash
# The GPU check, from a fresh copy of the repository on a CUDA machine (no network needed), in
# one call of at most BUDGET seconds (default 540):
#
#   bash tests/gpu/run.sh OUTDIR          # on a GPU machine
#   bash tests/gpu/run.sh OUTDIR --cpu    # here: the same phases, CUDA ones skipped
#
# Phases, each with a time limit (its budget, or what is left of the total if less), each
# writing its results under OUTDIR as it goes:
#
#   env        versions, nvidia-smi, the GPU                                  -> env.txt
#   build      pip install --no-build-isolation -e . with the CUDA kernels     -> build.log
#              required (only the local GPU's architecture unless
#              TORCH_CUDA_ARCH_LIST says otherwise); --cpu: reused when
#              gnncompile already loads its native kernels
#   gpu-tests  pytest tests/gpu (every CUDA op test, no -x)                   -> gpu_tests.log
#   gpu-bench  python -m benchmarks gpu_ops (spmm sum, F = 128, 1M nodes /    -> gpu_ops.json,
#              10M edges)                                                        bench.log
#   gpu-models python -m benchmarks gpu_models (training step of GCN,         -> gpu_models.json,
#              GraphSAGE, GAT on 1M nodes / 10M edges: eager, CSR,              bench.log
#              gnncompile, inductor)
#   gpu-graphs python -m benchmarks cuda_graphs (GIN / GINE steps on padded   -> summary.txt
#              molecule batches: plain, plain padded, GraphedStep CUDA         (table and JSON),
#              graphs)                                                          bench.log
#   op-tests   the op tests, CPU and CUDA parametrisations (GPU mode), or the -> op_tests.log
#              host checks of the native rules (--cpu)
#
# SKIP_PHASES="gpu-bench gpu-models" leaves the named phases out (a rerun after a fix).
# OUTDIR/summary.txt gets the plan first, then a line per phase (status, seconds) and the
# benchmarks' tables. At most 8 files. Exit status 0 when no phase failed.
set -u -o pipefail

OUT="${1:?usage: tests/gpu/run.sh OUTDIR [--cpu]}"
MODE="${2:-gpu}"
[ "$MODE" = "--cpu" ] && MODE=cpu
mkdir -p "$OUT"
OUT="$(cd "$OUT" && pwd)"
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
cd "$ROOT"
PY="${PYTHON:-python3}"
export PYTHONUNBUFFERED=1
JOBS="$(nproc 2>/dev/null || echo 8)"
BUDGET="${BUDGET:-540}"
RESERVE=10  # seconds kept for the summary
SUMMARY="$OUT/summary.txt"
: > "$SUMMARY"
STATUS=0
T_START=$(date +%s)

PHASES=(env build gpu-tests gpu-bench gpu-models gpu-graphs op-tests)
declare -A LIMIT=([env]=15 [build]=150 [gpu-tests]=100 [gpu-bench]=45 [gpu-models]=115 [gpu-graphs]=30 [op-tests]=75)

note() { echo "$*" | tee -a "$SUMMARY"; }
elapsed() { echo $(( $(date +%s) - T_START )); }

plan() {
  local total=0 p
  note "gnncompile device check ($MODE mode): $(date -u); budget ${BUDGET}s, ${RESERVE}s kept for the summary"
  for p in "${PHASES[@]}"; do
    note "$(printf '  plan  %-10s %4ss' "$p" "${LIMIT[$p]}")"
    total=$(( total + LIMIT[$p] ))
  done
  note "$(printf '  plan  %-10s %4ss (<= %ss)' total "$total" "$(( BUDGET - RESERVE ))")"
  if [ "$total" -gt $(( BUDGET - RESERVE )) ]; then
    note "the phase budgets exceed the total budget"
    STATUS=1
  fi
}

# phase NAME LOG cmd...: runs cmd with the phase's limit (or what is left), records the result.
phase() {
  local name="$1" log="$2"; shift 2
  if [[ " ${SKIP_PHASES:-} " == *" $name "* ]]; then
    skip "$name" "SKIP_PHASES"
    return 0
  fi
  local left=$(( BUDGET - RESERVE - $(elapsed) ))
  local limit=$(( LIMIT[$name] < left ? LIMIT[$name] : left ))
  if [ "$limit" -le 0 ]; then
    note "$(printf '%-10s skipped: no time left' "$name")"
    STATUS=1
    return 1
  fi
  local t0 rc
  t0=$(date +%s)
  timeout --signal=INT --kill-after=10 "$limit" "$@" >>"$log" 2>&1
  rc=$?
  note "$(printf '%-10s rc=%-3s %4ss of %4ss  (log: %s)' "$name" "$rc" "$(( $(date +%s) - t0 ))" "$limit" "$(basename "$log")")"
  [ "$rc" -eq 0 ] || STATUS=1
  return $rc
}

skip() { note "$(printf '%-10s skipped: %s' "$1" "$2")"; }

env_info() {
  echo "== date"; date -u
  echo "== nvidia-smi"; nvidia-smi 2>&1 | head -20
  echo "== nvcc"; (nvcc --version || /usr/local/cuda/bin/nvcc --version) 2>&1 | tail -2
  echo "== python / torch"
  "$PY" -c 'import sys, torch; print(sys.version); print("torch", torch.__version__, "cuda", torch.version.cuda, "available", torch.cuda.is_available()); print(torch.cuda.get_device_properties(0) if torch.cuda.is_available() else "no CUDA device")'
  echo "== packages"
  "$PY" -m pip list 2>/dev/null | grep -i -E "^(torch|torch.geometric|pybind11|scikit-build-core|cmake|ninja|pytest|hypothesis|numpy) "
}

native_loads() {  # does gnncompile load its native kernels (and, in GPU mode, the CUDA ones)?
  (cd / && "$PY" -c "import gnncompile; i = gnncompile.info(); raise SystemExit(0 if i['native'] and (i['cuda_kernels'] or '$MODE' == 'cpu') else 1)") >/dev/null 2>&1
}

# The first C++ compiler (CXX, then the system's) whose shared objects load libstdc++ as a shared
# library: a module with a static copy of it crashes on its first error message (seen on a GPU
# image whose default g++ only had libstdc++.a; CMakeLists.txt refuses such a link).
pick_cxx() {
  local c dir
  dir="$(mktemp -d)"
  printf '#include <sstream>\n#include <string>\nstd::string f(long v) { std::ostringstream s; s << v; return s.str(); }\n' > "$dir/t.cpp"
  for c in "${CXX:-}" /usr/bin/g++ g++ c++; do
    [ -n "$c" ] && command -v "$c" >/dev/null 2>&1 || continue
    if "$c" -shared -fPIC $LDFLAGS "$dir/t.cpp" -o "$dir/t.so" 2>/dev/null &&
       readelf -d "$dir/t.so" 2>/dev/null | grep -q 'NEEDED.*libstdc++'; then
      echo "$(command -v "$c")"; rm -rf "$dir"; return 0
    fi
    echo "C++ compiler $c links libstdc++ statically: not used" >&2
  done
  rm -rf "$dir"; return 1
}

build() {
  local cxx
  if cxx="$(pick_cxx)"; then
    # the CUDA host compiler too: its runtime folders join the module's link line
    export CXX="$cxx" CUDAHOSTCXX="$cxx"
    echo "C++ compiler: $CXX (CUDA host compiler: $CUDAHOSTCXX)"
  fi
  if ! command -v nvcc >/dev/null 2>&1 && [ -x /usr/local/cuda/bin/nvcc ]; then
    export PATH="/usr/local/cuda/bin:$PATH"
  fi
  [ -z "${CUDACXX:-}" ] && command -v nvcc >/dev/null 2>&1 && export CUDACXX="$(command -v nvcc)"
  if [ -z "${TORCH_CUDA_ARCH_LIST:-}" ]; then
    TORCH_CUDA_ARCH_LIST="$("$PY" -c 'import torch; a, b = torch.cuda.get_device_capability(0); print(f"{a}.{b}")' 2>/dev/null || echo 9.0)"
    export TORCH_CUDA_ARCH_LIST
  fi
  export CMAKE_BUILD_PARALLEL_LEVEL="$JOBS"
  "$PY" -m pip install -v --no-build-isolation --no-deps --no-index \
      --config-settings=cmake.define.GNNCOMPILE_CUDA=ON -e "$ROOT" &&
  (cd / && "$PY" -c 'import json, gnncompile; i = gnncompile.info(); print(json.dumps(i, indent=1, default=str)); raise SystemExit(0 if i["cuda_kernels"] else "no CUDA kernels after the build")')
}
export -f build pick_cxx
export PY ROOT JOBS LDFLAGS="${LDFLAGS:-}"

# ---------------------------------------------------------------------------------------------
plan
phase env "$OUT/env.txt" bash -c "$(declare -f env_info); env_info"

if [ "$MODE" = cpu ] && native_loads; then
  skip build "--cpu: gnncompile already loads its native kernels"
elif [ "$MODE" = cpu ]; then
  phase build "$OUT/build.log" "$PY" -m pip install --no-build-isolation --no-deps -e "$ROOT"
else
  phase build "$OUT/build.log" bash -c build
fi

if [ "$MODE" = cpu ]; then
  skip gpu-tests "--cpu: no CUDA device"
  skip gpu-bench "--cpu: no CUDA device"
  skip gpu-models "--cpu: no CUDA device"
  skip gpu-graphs "--cpu: no CUDA device"
  phase op-tests "$OUT/op_tests.log" "$PY" -m pytest -q -rs -p no:cacheprovider \
      tests/ops/test_native_rules.py tests/hardware/test_cuda_knobs.py
else
  phase gpu-tests "$OUT/gpu_tests.log" "$PY" -m pytest tests/gpu -q -rs -p no:cacheprovider --durations=15
  if grep -q -E "^SKIPPED .*needs a CUDA device" "$OUT/gpu_tests.log" 2>/dev/null; then
    note "tests/gpu were SKIPPED: the CUDA kernels were not loaded"
    STATUS=1
  fi
  phase gpu-bench "$OUT/bench.log" "$PY" -m benchmarks gpu_ops --out "$OUT"
  phase gpu-models "$OUT/bench.log" "$PY" -m benchmarks gpu_models --out "$OUT" \
      --budget $(( ${LIMIT[gpu-models]} - 40 ))
  phase gpu-graphs "$OUT/bench.log" "$PY" -m benchmarks cuda_graphs --out "$OUT" \
      --budget $(( ${LIMIT[gpu-graphs]} - 18 ))
  for t in gpu_ops gpu_models cuda_graphs; do  # the tables go into the summary (at most 8 files come back)
    [ -f "$OUT/$t.txt" ] && cat "$OUT/$t.txt" >> "$SUMMARY" && rm -f "$OUT/$t.txt"
  done
  if [ -f "$OUT/cuda_graphs.json" ]; then  # its record too: a ninth file would not come back
    { echo "cuda_graphs.json:"; cat "$OUT/cuda_graphs.json"; } >> "$SUMMARY" && rm -f "$OUT/cuda_graphs.json"
  fi
  phase op-tests "$OUT/op_tests.log" "$PY" -m pytest -q -rs -p no:cacheprovider \
      tests/ops/test_spmm.py tests/ops/test_edge_softmax.py tests/ops/test_bad_input.py tests/ops/test_graph.py
fi

note "total $(elapsed)s of ${BUDGET}s; status $STATUS"
exit $STATUS
