#!/usr/bin/env bash
# make cuda-check: compile every CUDA source of the project with nvcc, for each target the
# extension ships (sm_75, sm_80, sm_90 machine code + compute_90 PTX), on a machine that may
# have no GPU and only a CPU build of torch.
#
#   1. native/cuda/check/instantiate_cores.cu: the torch-free kernel cores (*_core.cuh, with
#      common.cuh) and the knob rule (knobs.h), every template combination the glue can reach,
#      no torch header at all;
#   2. every glue file native/cuda/*.cu, `nvcc -c` against the installed torch's headers
#      (torch.utils.cpp_extension.include_paths()), exactly as the extension build compiles it;
#   3. the generated message kernels of the codegen test programs (gnncompile/codegen/cuda.py,
#      `python -m gnncompile.codegen.cuda OUT.cu`: every opcode, op and dtype), compiled as the
#      cores are (codegen_abi.cuh + common.cuh, no torch header, warnings are errors).
#
# A CPU-only torch wheel ships c10/cuda/*.h but not the header its CUDA build generates at
# configure time, c10/cuda/impl/cuda_cmake_macros.h (one macro: C10_CUDA_BUILD_SHARED_LIBS).
# When it is missing, this script writes that one-line header into a temporary include
# directory for the check only; a CUDA build of torch has it and nothing is added.
#
# Environment: NVCC (default: nvcc on PATH, else /usr/local/cuda/bin/nvcc), PYTHON (default:
# python3), JOBS (parallel compiles, default: number of CPUs), CUDA_CHECK_ARCHS (default
# "75 80 90"; PTX is added for the last one). Exit status non-zero on any failure.
set -u -o pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
PYTHON="${PYTHON:-python3}"
NVCC="${NVCC:-$(command -v nvcc || echo /usr/local/cuda/bin/nvcc)}"
JOBS="${JOBS:-$(nproc 2>/dev/null || echo 2)}"
ARCHS=(${CUDA_CHECK_ARCHS:-75 80 90})

if [ ! -x "$NVCC" ]; then
  echo "cuda-check: nvcc not found (set NVCC=/path/to/nvcc)" >&2
  exit 2
fi
TORCH_INC="$("$PYTHON" -c 'import torch.utils.cpp_extension as c; print(" ".join(c.include_paths()))' 2>/dev/null)"
if [ -z "$TORCH_INC" ]; then
  echo "cuda-check: could not import torch with $PYTHON" >&2
  exit 2
fi

WORK="$(mktemp -d "${TMPDIR:-/tmp}/gnncompile-cuda-check.XXXXXX")"
trap 'rm -rf "$WORK"' EXIT

GENCODE=()
for a in "${ARCHS[@]}"; do GENCODE+=("-gencode" "arch=compute_${a},code=sm_${a}"); done
LAST="${ARCHS[${#ARCHS[@]}-1]}"
GENCODE+=("-gencode" "arch=compute_${LAST},code=compute_${LAST}")
TARGETS=$(( ${#ARCHS[@]} + 1 ))

# The extension's flags (CMakeLists.txt): C++17, -O3, --expt-relaxed-constexpr. Warnings about
# torch's own headers (C++20 bit-field initialisers) are silenced; ours are errors.
COMMON=(-std=c++17 -O3 --expt-relaxed-constexpr -Xcompiler -fPIC -I"$ROOT/native" "${GENCODE[@]}")

INC=()
for d in $TORCH_INC; do INC+=("-isystem" "$d"); done
SHIM=0
found=0
for d in $TORCH_INC; do [ -f "$d/c10/cuda/impl/cuda_cmake_macros.h" ] && found=1; done
if [ "$found" = 0 ]; then
  mkdir -p "$WORK/shim/c10/cuda/impl"
  printf '#pragma once\n#define C10_CUDA_BUILD_SHARED_LIBS\n' > "$WORK/shim/c10/cuda/impl/cuda_cmake_macros.h"
  INC=("-isystem" "$WORK/shim" "${INC[@]}")
  SHIM=1
fi
TORCH_FLAGS=(-diag-suppress 3306 -Xcompiler -Wno-c++20-extensions)

CORE="$ROOT/native/cuda/check/instantiate_cores.cu"
GLUE=("$ROOT"/native/cuda/*.cu)

# One job per file: "core|path" or "glue|path".
JOBLIST="$WORK/jobs"
: > "$JOBLIST"
echo "core|$CORE" >> "$JOBLIST"
GENERATED="$WORK/generated_kernels.cu"
if (cd "$ROOT" && "$PYTHON" -m gnncompile.codegen.cuda "$GENERATED"); then
  echo "core|$GENERATED" >> "$JOBLIST"
else
  echo "cuda-check: could not write the generated kernels with $PYTHON (gnncompile.codegen.cuda)" >&2
  touch "$WORK/failed.generated_kernels"
fi
# Longest first (spmm.cu instantiates the most kernels), so parallel jobs pack well.
for f in "${GLUE[@]}"; do [ "$(basename "$f")" = spmm.cu ] && echo "glue|$f" >> "$JOBLIST"; done
for f in "${GLUE[@]}"; do [ "$(basename "$f")" != spmm.cu ] && echo "glue|$f" >> "$JOBLIST"; done

compile_one() {
  local kind="${1%%|*}" src="${1#*|}"
  local name; name="$(basename "$src" .cu)"
  local log="$WORK/$name.log" t0 t1 rc
  t0=$(date +%s)
  if [ "$kind" = core ]; then
    "$NVCC" "${COMMON[@]}" -Xcompiler -Wall,-Wextra -Werror all-warnings -c "$src" -o "$WORK/$name.o" >"$log" 2>&1
  else
    "$NVCC" "${COMMON[@]}" "${INC[@]}" "${TORCH_FLAGS[@]}" -c "$src" -o "$WORK/$name.o" >"$log" 2>&1
  fi
  rc=$?
  t1=$(date +%s)
  if [ $rc -eq 0 ]; then
    printf '  ok    %-22s %-5s %3ds\n' "$name.cu" "$kind" $((t1 - t0))
  else
    printf '  FAIL  %-22s %-5s %3ds\n' "$name.cu" "$kind" $((t1 - t0))
    sed 's/^/        /' "$log" | head -60
    touch "$WORK/failed.$name"
  fi
  return 0
}

START=$(date +%s)
echo "cuda-check: $("$NVCC" --version | tail -1)"
echo "cuda-check: targets ${ARCHS[*]/#/sm_} + compute_${LAST} PTX; torch $("$PYTHON" -c 'import torch; print(torch.__version__)')$([ $SHIM = 1 ] && echo ' (CPU build: cuda_cmake_macros.h shim)'); $JOBS jobs"
# Bash arrays do not cross `export`: run the jobs through a small driver that re-creates them.
cat > "$WORK/driver.sh" <<DRIVER
#!/usr/bin/env bash
COMMON=($(printf '%q ' "${COMMON[@]}"))
INC=($(printf '%q ' "${INC[@]}"))
TORCH_FLAGS=($(printf '%q ' "${TORCH_FLAGS[@]}"))
NVCC=$(printf '%q' "$NVCC")
WORK=$(printf '%q' "$WORK")
$(declare -f compile_one)
compile_one "\$1"
DRIVER
chmod +x "$WORK/driver.sh"
xargs -P "$JOBS" -I{} "$WORK/driver.sh" {} < "$JOBLIST"
END=$(date +%s)

NFILES=$(wc -l < "$JOBLIST")
NFAIL=$(ls "$WORK"/failed.* 2>/dev/null | wc -l)
echo "cuda-check: $((NFILES - NFAIL))/$NFILES files x $TARGETS targets (${ARCHS[*]/#/sm_} + compute_${LAST}) compiled in $((END - START))s"
if [ "$NFAIL" -ne 0 ]; then
  echo "cuda-check: FAILED ($NFAIL file(s))" >&2
  exit 1
fi
