"""The float32 math of message programs (native/cpu/vmath.h): accuracy in ulp against float64
over dense sweeps and special values (bounds a regression fails), special values as torch gives
them, the loops calling it vectorized, and the message kernels (interpreter and generated) using
exactly these functions: bit for bit equal to each other and to the harness over a sweep, within
a few ulp of the float64 value for every transcendental operator of a program."""
from __future__ import annotations

import math
import re
import shlex
import subprocess

import pytest
import torch

from gnncompile import codegen
from gnncompile.codegen import build
from gnncompile.ops import _native
from gnncompile.ops import program as P
from gnncompile.ops.schemas import ops
from gnncompile.testing import vmath

pytestmark = pytest.mark.skipif(not _native.native_loaded() or build.shutil.which("c++") is None,
                                reason="needs the native module and a C++ compiler")

# the largest ulp error measured over vmath.sweep (2^20 points) on x86-64 (AVX2), with a margin of
# about half an ulp: a change that loses accuracy fails here
ULP_BOUND = {"exp": 1.5, "expm1": 2.0, "log": 1.25, "log1p": 2.0, "tanh": 2.75, "sigmoid": 2.75, "erf": 3.0}
INF, NAN = math.inf, math.nan


@pytest.mark.parametrize("name", list(vmath.FUNCTIONS))
def test_ulp_error_over_a_dense_sweep_and_special_values(name):
    m = vmath.measure(name, n=1 << 20)
    assert m["sweep_max_ulp"] <= ULP_BOUND[name], m
    assert m["specials_max_ulp"] <= ULP_BOUND[name], m


# (function, input, exact output): torch's values at the edges of each function's range
EXACT = [
    ("exp", -INF, 0.0), ("exp", INF, INF), ("exp", 89.0, INF), ("exp", 88.72283935546875, INF), ("exp", -0.0, 1.0),
    ("exp", -104.0, 0.0), ("exp", -1000.0, 0.0), ("exp", 0.0, 1.0),
    ("expm1", -INF, -1.0), ("expm1", INF, INF), ("expm1", -0.0, -0.0), ("expm1", -30.0, -1.0), ("expm1", 100.0, INF),
    ("expm1", 1e-40, 1e-40),
    ("log", 0.0, -INF), ("log", -0.0, -INF), ("log", -1.0, NAN), ("log", -INF, NAN), ("log", INF, INF), ("log", 1.0, 0.0),
    ("log1p", -1.0, -INF), ("log1p", -2.0, NAN), ("log1p", INF, INF), ("log1p", -0.0, -0.0), ("log1p", 1e-40, 1e-40),
    ("tanh", INF, 1.0), ("tanh", -INF, -1.0), ("tanh", -0.0, -0.0), ("tanh", 20.0, 1.0), ("tanh", -9.5, -1.0),
    ("sigmoid", -INF, 0.0), ("sigmoid", INF, 1.0), ("sigmoid", -0.0, 0.5), ("sigmoid", 0.0, 0.5),
    ("erf", INF, 1.0), ("erf", -INF, -1.0), ("erf", -0.0, -0.0), ("erf", 4.0, 1.0), ("erf", -10.0, -1.0),
]


def test_special_values_exactly():
    for name in vmath.FUNCTIONS:
        got = vmath.apply(name, torch.tensor([NAN, -NAN]))
        assert got.isnan().all(), name  # NaN in, NaN out
    for name, x, want in EXACT:
        got = float(vmath.apply(name, torch.tensor([x]))[0])
        want = float(torch.tensor(want, dtype=torch.float32))
        if math.isnan(want):
            assert math.isnan(got), (name, x, got)
        else:
            assert got == want and math.copysign(1, got) == math.copysign(1, want), (name, x, got, want)
    # subnormal results round once: exp below -87.3 and sigmoid below -87.3 (torch's float32
    # sigmoid, 1 / (1 + e^-x), overflows to 0 there; the value is subnormal)
    x = torch.tensor([-88.0, -95.0, -103.0], dtype=torch.float32)
    for name in ("exp", "sigmoid"):
        got = vmath.apply(name, x)
        want = vmath.FUNCTIONS[name][1](x.double()).float()
        assert torch.equal(got, want) and bool((got > 0).all()), name
    # subnormal inputs of log are scaled, not flushed
    x = torch.tensor([2.0 ** -149, 3 * 2.0 ** -140, 2.0 ** -127], dtype=torch.float32)
    assert vmath.ulp_error(vmath.apply("log", x), torch.log(x.double())).max() <= 1.0


def test_the_loops_calling_them_vectorize(tmp_path):
    """A loop over floats calling each function vectorizes with the kernels' flags (no branch left
    in any of them: a function that stops vectorizing fails here)."""
    src = tmp_path / "h.cpp"
    src.write_text(vmath._SOURCE)
    argv = (shlex.split(build.compiler()) + build.module_flags() + list(build.BASE_FLAGS)
            + ["-fopt-info-vec-optimized", "-I", str(build.NATIVE), str(src), "-o", str(tmp_path / "h.so")])
    r = subprocess.run(argv, capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr[-2000:]
    lines = {int(m.group(1)) for m in re.finditer(r"h\.cpp:(\d+):\d+: optimized: loop vectorized", r.stderr)}
    loops = [i + 1 for i, ln in enumerate(vmath._SOURCE.lstrip("\n").splitlines()) if ": LOOP(" in ln]
    first = vmath._SOURCE.startswith("\n")
    assert len(loops) == len(vmath.FUNCTIONS)
    assert {n + first for n in loops} <= lines, r.stderr[-2000:]


def test_generated_float32_kernels_keep_one_loop():
    """A float32 program calling transcendental functions is one loop per tile (inline, vectorized
    math); float64 programs (libm) are cut at each call, and pow (libm) in both."""
    expr = P.node("mul", P.node("gelu", P.inp(0)), P.node("tanh", P.node("exp", P.inp(0))))
    code, consts = P.encode(expr)
    loops = {}
    for dt in (torch.float32, torch.float64):
        src = codegen.emit(codegen.make_spec(code, consts, [P.COL], [16], 16, "sum", dt, torch.int64))
        loops[dt] = src.count("const int64_t f = f0 + t;")  # the head of each per-feature loop
    assert loops[torch.float32] == 1 and loops[torch.float64] >= 3
    pw = codegen.emit(codegen.make_spec(*P.encode(P.node("pow", P.inp(0), P.inp(1))), [P.COL, P.ROW], [16, 16], 16,
                                        "sum", torch.float32, torch.int64))
    assert "std::pow(" in pw


# ----------------------------------------------------------------------------- through the kernels
I0 = P.inp(0)
# program op -> (expression of input 0, float64 reference, the sweep); each op's float32 result
# through the kernels within ULP of the float64 value
OPS = {
    "exp": (P.node("exp", I0), torch.exp, (-104.0, 89.0), 1.5),
    "log": (P.node("log", I0), torch.log, (0.0, 3e38), 1.25),
    "tanh": (P.node("tanh", I0), torch.tanh, (-12.0, 12.0), 2.75),
    "sigmoid": (P.node("sigmoid", I0), torch.sigmoid, (-100.0, 30.0), 2.75),
    "softplus": (P.node("softplus", I0, params=(2.0, 20.0)),
                 lambda x: torch.nn.functional.softplus(x, 2.0, 20.0), (-60.0, 20.0), 3.0),
    "elu": (P.node("elu", I0, params=(1.3,)), lambda x: torch.nn.functional.elu(x, 1.3), (-30.0, 30.0), 2.5),
    # gelu's 1 + erf(x / sqrt 2) cancels for negative x (torch's float32 formula too: about 100 ulp
    # at x = -2.9), and gelu_grad's cdf + x pdf is 0 at x = -0.75: ulp checked from -0.5, and the
    # absolute error over [-10, 10] (ABS_BOUND)
    "gelu": (P.node("gelu", I0), torch.nn.functional.gelu, (-0.5, 10.0), 3.0),
    "gelu_grad": (P.node("gelu_grad", I0), P._gelu_grad, (-0.5, 10.0), 4.0),
    "softplus_grad": (P.node("softplus_grad", I0, params=(2.0, 20.0)), lambda x: P._softplus_grad(x, 2.0, 20.0),
                      (-40.0, 20.0), 3.0),
    "elu_grad": (P.node("elu_grad", I0, params=(0.7,)), lambda x: torch.where(x > 0, 1.0, 0.7 * torch.exp(x)),
                 (-30.0, 30.0), 2.0),
}


# the largest absolute error over [-10, 10] (measured 4.4e-7 for gelu: half an ulp at |x| = 10; 1.3e-7
# for gelu_grad), with a margin
ABS_BOUND = {"gelu": 1e-6, "gelu_grad": 3e-7}


def _edges(expr, x, generated: bool):
    n = x.shape[0]
    rowptr, col, perm = ops.build_csr(torch.arange(n) % 64, torch.arange(n) % 64, 64, 64)
    code, consts = P.encode(expr)
    ins = [x[:, None].contiguous()]
    codegen.reset()
    if generated:
        assert codegen.prepare(ins, [P.EDGE], code, consts, 1, "sum", rowptr.dtype, op="edges", out_width=1)
    before = codegen.calls()
    out = ops.message_edges(rowptr, col, perm, ins, [P.EDGE], code, consts, 1, 1, False, [], [], None)[:, 0]
    assert codegen.calls() == before + int(generated)
    return out


def _bits(t):
    return t.view(torch.int32)


@pytest.mark.parametrize("name", list(OPS))
def test_program_ops_generated_equal_interpreter_and_near_float64(gen, name):
    expr, ref, (lo, hi), bound = OPS[name]
    x = torch.cat([vmath.sweep(lo, hi, 1 << 16), vmath.specials()])
    a = _edges(expr, x, generated=False)
    b = _edges(expr, x, generated=True)
    nan = a.isnan()
    assert torch.equal(nan, b.isnan())
    assert torch.equal(_bits(a)[~nan], _bits(b)[~nan]), name
    if name in vmath.FUNCTIONS:  # the op is the function itself: the harness's bits
        assert torch.equal(_bits(a)[~nan], _bits(vmath.apply(name, x))[~nan])
    inside = (x >= lo) & (x <= hi)
    err = vmath.ulp_error(a[inside], ref(x[inside].double()))
    assert float(err.max()) <= bound, (name, float(err.max()), float(x[inside][torch.argmax(err)]))
    if name in ABS_BOUND:
        x = vmath.sweep(-10.0, 10.0, 1 << 16)
        got = _edges(expr, x, generated=False)
        assert float((got.double() - ref(x.double())).abs().max()) <= ABS_BOUND[name], name
