"""The accuracy of native/cpu/vmath.h (the float32 math of message programs), measured: each
function compiled into a small library with the generated kernels' compiler and flags
(gnncompile.codegen.build: the system compiler, the native module's -O3 / -march=native,
-ffp-contract=off), run over float32 arrays, and compared with the float64 value (torch's float64
functions, accurate to about 1 ulp of float64) in ulp of float32 at the reference's magnitude.

Used by tests/codegen/test_vmath.py (bounds that fail on a regression) and
``python -m benchmarks vmath`` (the table in benchmarks/results/vmath.md)."""
from __future__ import annotations

import ctypes
import math
import shlex
import subprocess
import tempfile
from pathlib import Path
from typing import Callable, Dict, Optional, Tuple

import torch

from ..codegen import build

# name -> (function index in the harness, float64 reference, sweep range (lo, hi))
FUNCTIONS: Dict[str, Tuple[int, Callable[[torch.Tensor], torch.Tensor], Tuple[float, float]]] = {
    "exp": (0, torch.exp, (-104.0, 89.0)),
    "expm1": (1, torch.expm1, (-20.0, 89.0)),
    "log": (2, torch.log, (0.0, 3.4e38)),
    "log1p": (3, torch.log1p, (-1.0, 3.4e38)),
    "tanh": (4, torch.tanh, (-12.0, 12.0)),
    "sigmoid": (5, torch.sigmoid, (-104.0, 30.0)),
    "erf": (6, torch.erf, (-5.0, 5.0)),
}

_SOURCE = r"""
#include <cstdint>
#include "cpu/vmath.h"
namespace vm = gnncompile::vm;
#define LOOP(f) for (int64_t i = 0; i < n; ++i) y[i] = vm::f(x[i]); return 0;
extern "C" int vm_apply(int op, const float* x, float* y, int64_t n) {
  switch (op) {
    case 0: LOOP(exp)
    case 1: LOOP(expm1)
    case 2: LOOP(log)
    case 3: LOOP(log1p)
    case 4: LOOP(tanh)
    case 5: LOOP(sigmoid)
    case 6: LOOP(erf)
  }
  return 1;
}
"""

_lib: Optional[ctypes.CDLL] = None


def library() -> ctypes.CDLL:
    """The harness, built once per process (a temporary folder; about a second)."""
    global _lib
    if _lib is None:
        folder = Path(tempfile.mkdtemp(prefix="gnncompile-vmath-"))
        src, so = folder / "vmath_harness.cpp", folder / "vmath_harness.so"
        src.write_text(_SOURCE)
        argv = (shlex.split(build.compiler()) + build.module_flags() + list(build.BASE_FLAGS)
                + ["-I", str(build.NATIVE), str(src), "-o", str(so)])
        r = subprocess.run(argv, capture_output=True, text=True, timeout=300)
        if r.returncode != 0:
            raise build.BuildError(f"the vmath harness did not build: {r.stderr.strip()[-2000:]}")
        lib = ctypes.CDLL(str(so))
        lib.vm_apply.argtypes = [ctypes.c_int, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_int64]
        lib.vm_apply.restype = ctypes.c_int
        _lib = lib
    return _lib


def apply(name: str, x: torch.Tensor) -> torch.Tensor:
    """vm::<name> (float32) over ``x``."""
    x = x.to(torch.float32).contiguous()
    y = torch.empty_like(x)
    if library().vm_apply(FUNCTIONS[name][0], x.data_ptr(), y.data_ptr(), x.numel()) != 0:
        raise ValueError(f"no vmath function {name!r}")
    return y


def ulp_error(got: torch.Tensor, ref64: torch.Tensor) -> torch.Tensor:
    """|got - ref| in ulp of float32 at |ref| (the spacing of the float32 binade holding the reference
    rounded to float32; subnormals: 2^-149). ``got`` equal to the reference rounded to float32
    (infinities and zeros of either sign included) or both NaN: 0; otherwise a NaN or an infinity
    on either side: inf."""
    got64 = got.to(torch.float64)
    r32 = ref64.to(torch.float32).to(torch.float64)
    e = torch.floor(torch.log2(r32.abs().clamp(2.0 ** -126, 3.4e38)))
    ulp = torch.pow(torch.tensor(2.0, dtype=torch.float64), e - 23)
    err = (got64 - ref64).abs() / ulp
    special = ~torch.isfinite(got64) | ~torch.isfinite(r32)
    err = torch.where(special, torch.full_like(err, math.inf), err)
    exact = (got64 == r32) | (got64.isnan() & r32.isnan())
    return torch.where(exact, torch.zeros_like(err), err)


def sweep(lo: float, hi: float, n: int = 1 << 20) -> torch.Tensor:
    """``n`` float32 values spread over [lo, hi]: evenly in the bit pattern (so every binade of a
    wide range is sampled as densely as its neighbours) on each side of 0, plus a linear grid."""
    parts = []

    def bits_grid(a: float, b: float, k: int) -> torch.Tensor:  # 0 <= a < b
        ia = int(torch.tensor([a], dtype=torch.float32).view(torch.int32)[0])
        ib = int(torch.tensor([b], dtype=torch.float32).view(torch.int32)[0])
        return torch.linspace(ia, ib, k, dtype=torch.float64).round().to(torch.int32).view(torch.float32)

    if hi > 0:
        parts.append(bits_grid(max(lo, 0.0), hi, n // 3))
    if lo < 0:
        parts.append(-bits_grid(max(-hi, 0.0), -lo, n // 3))
    parts.append(torch.linspace(lo, hi, n // 3, dtype=torch.float32))
    return torch.cat(parts)


SPECIALS = [math.nan, math.inf, -math.inf, 0.0, -0.0, 1.0, -1.0, 2.0 ** -149, -(2.0 ** -149), 2.0 ** -126,
            -(2.0 ** -126), 1e-30, -1e-30, 0.5, -0.5, 3.4028234663852886e38, -3.4028234663852886e38,
            88.72283172607422, 88.72283935546875, -87.33654022216797, -103.97208, -104.0, 1e-7, -1e-7, 20.0, -20.0]


def specials() -> torch.Tensor:
    return torch.tensor(SPECIALS, dtype=torch.float32)


def measure(name: str, n: int = 1 << 20) -> Dict[str, float]:
    """The largest ulp error of vm::<name> over :func:`sweep` of its range and over the special
    values, and where it is largest."""
    _, ref, (lo, hi) = FUNCTIONS[name]
    out = {}
    for what, x in (("sweep", sweep(lo, hi, n)), ("specials", specials())):
        got = apply(name, x)
        err = ulp_error(got, ref(x.to(torch.float64)))
        k = int(torch.argmax(torch.nan_to_num(err, posinf=1e30)))
        out[f"{what}_max_ulp"] = float(err[k])
        out[f"{what}_at"] = float(x[k])
        out[f"{what}_points"] = int(x.numel())
    return out


__all__ = ["FUNCTIONS", "SPECIALS", "apply", "library", "measure", "specials", "sweep", "ulp_error"]
