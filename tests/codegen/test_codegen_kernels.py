"""Generated message kernels (gnncompile/codegen): bit for bit the interpreter's numbers, the
build cache (a new process loads without building, two processes building one key, a corrupt
library rebuilt, the size bound), and the interpreter with one warning when no compiler works.

Coverage of "every operator x reduce x dtype": every opcode is generated in both dtypes (sum, and
each opcode again under its own reduce: the opcode's index picks one of the four), and every
reduce x dtype runs several programs (transcendental, per-head, per-edge scalars, constants).
The reduction (accumulate, mean's scale, max / min's fold and arg record) is the interpreter's own
code, included from reduce_core.h, and independent of the expression feeding it."""
from __future__ import annotations

import json
import math
import os
import subprocess
import sys
import textwrap
import warnings
from pathlib import Path

import pytest
import torch

from gnncompile import codegen, config
from gnncompile.codegen import build
from gnncompile.ops import _native
from gnncompile.ops import program as P
from gnncompile.ops import structure
from gnncompile.ops.schemas import ops
from gnncompile.testing.bits import bits as _bits

pytestmark = pytest.mark.skipif(not _native.native_loaded() or build.shutil.which("c++") is None,
                                reason="needs the native module and a C++ compiler")

N_SRC, N_DST, E, F = 11, 9, 60, 70  # F: more than one tile of float64 (64), not a multiple of either tile
I0, I1, I2, I3, I4 = (P.inp(k) for k in range(5))
# inputs: 0 col [N, F], 1 row [M, F], 2 edge [E, 1] (a scalar per edge), 3 const [1, F], 4 edge [E, F / 5]
SIDES = [P.COL, P.ROW, P.EDGE, P.CONST, P.EDGE]
ROOT = Path(__file__).resolve().parents[2]


# cache, gen: tests/codegen/conftest.py


def _structure(seed=0):
    g = torch.Generator().manual_seed(seed)
    pick = torch.randperm(N_SRC * N_DST, generator=g)[:E]
    src, dst = pick % N_SRC, pick // N_SRC
    rowptr, col, perm = ops.build_csr(dst, src, N_DST, N_SRC)
    return rowptr, col, perm


def _inputs(dtype, positive=False, special=True, seed=1):
    g = torch.Generator().manual_seed(seed)
    shapes = [(N_SRC, F), (N_DST, F), (E, 1), (1, F), (E, F // 5)]
    out = []
    for s in shapes:
        t = torch.randn(*s, dtype=dtype, generator=g)
        t = t.abs() + 0.25 if positive else t
        out.append(t)
    if special:  # the values whose handling differs between operators (NaN passes, signed zeros, ...)
        x = out[0]
        x[0, :6] = torch.tensor([math.nan, math.inf, -math.inf, 0.0, -0.0, 1e30], dtype=dtype)
        x[1, 3] = 0.0
        out[1][2, 5:8] = torch.tensor([0.0, -0.0, math.nan], dtype=dtype)
    return out


def _both(expr, dtype, reduce, ins, csr=None, sides=SIDES):
    """(interpreter, generated) results of message_reduce; asserts the generated kernel ran."""
    code, consts = P.encode(expr)
    rowptr, col, perm = csr if csr is not None else _structure()
    ins = [t.clone() for t in ins]
    codegen.reset()
    ref = ops.message_reduce(rowptr, col, perm, ins, sides, code, consts, F, reduce, [], [], None)
    assert codegen.prepare(ins, sides, code, consts, F, reduce, rowptr.dtype), "the kernel was not built"
    before = codegen.calls()
    out = ops.message_reduce(rowptr, col, perm, ins, sides, code, consts, F, reduce, [], [], None)
    assert codegen.calls() == before + 1
    return ref, out


def _assert_same(ref, out):
    """Bit for bit, NaN as NaN: which NaN (its sign) a sum of two NaNs keeps is the order of the
    add instruction's operands, the compiler's choice, in the interpreter as in a generated kernel."""
    a, b = ref[0], out[0]
    nan = torch.isnan(a)
    assert torch.equal(nan, torch.isnan(b))
    assert torch.equal(_bits(a)[~nan], _bits(b)[~nan])
    assert torch.equal(ref[1], out[1])


# ----------------------------------------------------------------------------- every opcode
def _op_program(name: str):
    """A program applying opcode ``name`` (to inputs of several sides and width classes)."""
    ar = {n: a for n, a, _ in P.OPS.values()}[name]
    params = P.EXAMPLE_PARAMS.get(name, ())
    a = P.node("add", I0, I2)
    if name == "in":
        return I4, False
    if name == "const":
        return P.node("mul", I0, P.const(-1.5)), False
    positive = name in ("log", "sqrt", "pow", "pow_exp_grad", "powc")
    if ar == 2:
        b = P.node("sub", I1, I3) if name not in ("pow", "pow_exp_grad") else P.node("mul", I1, I4)
        if name == "eq":  # equal in places: x == relu(x) where x >= 0
            b = P.node("relu", I0)
            a = I0
        return (name, (a, b), ()), positive
    return (name, (P.node("mul", a, I4),), tuple(float(p) for p in params)), positive


OP_NAMES = [n for n, _, _ in P.OPS.values()]


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("name", OP_NAMES)
def test_every_opcode_generated_equals_interpreter(gen, name, dtype):
    expr, positive = _op_program(name)
    ins = _inputs(dtype, positive=positive, special=not positive)
    for reduce in dict.fromkeys(["sum", ("sum", "mean", "max", "min")[OP_NAMES.index(name) % 4]]):
        _assert_same(*_both(expr, dtype, reduce, ins))


def test_powc_special_cases(gen):
    """x ** c takes torch's special cases (x * x, sqrt, 1 / x, ...): chosen at generation time,
    on the constant in the compute type, as the interpreter chooses them per element."""
    for dtype in (torch.float32, torch.float64):
        ins = _inputs(dtype)
        for c in (2.0, 3.0, 0.5, -0.5, -1.0, -2.0, 2.0000000001, 0.0):
            _assert_same(*_both(P.node("powc", I0, params=(c,)), dtype, "sum", ins))


# ----------------------------------------------------------------------------- every reduce
PROGRAMS = {
    "xj": I0,
    "relu_xj_e": P.node("relu", P.node("add", I0, I2)),
    "gelu_tanh": P.node("mul", P.node("gelu", I0), P.node("tanh", I1)),
    "heads": P.node("mul", P.node("sigmoid", P.node("sub", I0, I1)), I4),
    "consts": P.node("clamp", P.node("add", P.node("mul", I0, P.const(0.1)), I3), params=(-0.3, 0.4)),
}


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("reduce", ["sum", "mean", "max", "min"])
def test_every_reduce_generated_equals_interpreter(gen, reduce, dtype):
    ins = _inputs(dtype)
    for name, expr in PROGRAMS.items():
        _assert_same(*_both(expr, dtype, reduce, ins))


def test_max_ties_and_int32_index(gen):
    """max / min record ties (-N) and NaN as the interpreter does; an int32 structure."""
    rowptr, col, perm = _structure()
    csr = (rowptr.int(), col.int(), perm.int())
    ins = _inputs(torch.float32)
    ins[0] = ins[0].round()  # many ties
    for reduce in ("max", "min"):
        ref, out = _both(P.node("relu", I0), torch.float32, reduce, ins, csr=csr)
        _assert_same(ref, out)
        assert (ref[1] < -1).any()  # ties were recorded


def test_transposed_structure_with_slot_input(gen):
    """A CSC walk reading a per-CSR-slot input through ``slot`` (the backward's form)."""
    rowptr, col, perm = _structure()
    t_rowptr, t_col, t_perm = structure.transpose_structure(rowptr, col, perm, N_SRC)
    inv = torch.empty_like(perm)
    inv[perm] = torch.arange(E)
    slot = inv[t_perm]
    x_dst = torch.randn(N_DST, F, dtype=torch.float64)
    g_slot = torch.randn(E, F, dtype=torch.float64)
    code, consts = P.encode(P.node("mul", I0, P.node("tanh", I1)))
    sides = [P.COL, P.SLOT]
    args = (t_rowptr, t_col, t_perm, [x_dst, g_slot], sides, code, consts, F, "sum", [], [], slot)
    codegen.reset()
    ref = ops.message_reduce(*args)[0]
    assert codegen.prepare([x_dst, g_slot], sides, code, consts, F, "sum")
    out = ops.message_reduce(*args)[0]
    assert torch.equal(_bits(ref), _bits(out))


def test_gradients_through_a_generated_forward(gen):
    """The forward generated (and, the mode being on, the backward's derivative kernels prepared
    at their first use: tests/codegen/test_codegen_backward.py): the same values and gradients."""
    expr = P.node("mul", P.node("gelu", P.node("add", I0, I2)), I1)
    code, consts = P.encode(expr)
    rowptr, col, perm = _structure()
    base = _inputs(torch.float64, special=False)
    results = []
    for generated in (False, True):
        codegen.reset()
        ins = [t.clone().requires_grad_(k < 4) for k, t in enumerate(base)]
        if generated:
            assert codegen.prepare(ins, SIDES, code, consts, F, "mean")
        out = ops.message_reduce(rowptr, col, perm, ins, SIDES, code, consts, F, "mean", [], [], None)[0]
        out.pow(2).sum().backward()
        results.append((out.detach(), [t.grad for t in ins[:4]]))
    (o1, g1), (o2, g2) = results
    assert torch.equal(o1, o2)
    for a, b in zip(g1, g2):
        assert torch.equal(a, b)


def test_bad_structure_raises_as_the_interpreter(gen):
    rowptr, col, perm = _structure()
    bad = col.clone()
    bad[3] = N_SRC + 5
    ins = _inputs(torch.float32)
    code, consts = P.encode(P.node("relu", I0))
    assert codegen.prepare(ins, SIDES, code, consts, F, "sum")
    with pytest.raises(IndexError, match="source index out of range"):
        ops.message_reduce(rowptr, bad, perm, ins, SIDES, code, consts, F, "sum", [], [], None)


def test_key_matches_the_native_registry_key():
    consts = [0.1, -0.0, math.nan, math.inf, 1e-300]
    code = [1, 0, 0, 0, 0, 0, 1, 0, 0, 0, 4, 0, 0, 1, 0, 1, 1, 1, 0, 0, 16, 0, 0, 3, 4]
    widths, sides = [70, 1, 14], [P.COL, P.EDGE, P.CONST]
    spec = codegen.make_spec(code, consts, sides, widths, 70, "min", torch.float64, torch.int32)
    native = _native._C.codegen.key(_native._C.codegen.reduce_op(3), True, False, code, consts, sides, widths, 70)
    assert spec.key() == native
    assert spec.kinds == ("f", "s", "g")


def test_bad_specs_are_refused():
    with pytest.raises(ValueError, match="unknown reduce"):
        codegen.make_spec([0, 0, 0, 0, 0], [], [0], [4], 4, "prod", torch.float32, torch.int64)
    with pytest.raises(TypeError, match="float32 or float64"):
        codegen.make_spec([0, 0, 0, 0, 0], [], [0], [4], 4, "sum", torch.float16, torch.int64)
    with pytest.raises(ValueError, match="reads input"):
        codegen.make_spec([0, 0, 3, 0, 0], [], [0], [4], 4, "sum", torch.float32, torch.int64)
    with pytest.raises(ValueError, match="before it is written"):
        codegen.make_spec([7, 0, 2, 0, 0], [], [0], [4], 4, "sum", torch.float32, torch.int64)


def test_mode_off_builds_nothing(cache):
    codegen.reset()
    with config.override(codegen="off", cache_dir=cache):
        ins = _inputs(torch.float32)
        code, consts = P.encode(P.node("exp", I0))
        assert not codegen.prepare(ins, SIDES, code, consts, F, "sum")
        assert codegen.registered() == []
    with pytest.raises(config.ConfigError):
        with config.override(codegen="sometimes"):
            pass


# ----------------------------------------------------------------------------- fallback
def _fallback_case(cxx, cache: Path, tmp_path: Path, hide=None):
    """With compiler ``cxx``: one warning for two programs, and the interpreter's numbers equal
    the generated kernels' (built before with the real compiler)."""
    rowptr, col, perm = _structure()
    ins = _inputs(torch.float32)
    progs = [P.node("tanh", P.node("add", I0, I1)), P.node("softplus", I0, params=(1.0, 20.0))]
    codegen.reset()
    generated = []
    with config.override(codegen="auto", cache_dir=cache):
        for expr in progs:
            code, consts = P.encode(expr)
            assert codegen.prepare(ins, SIDES, code, consts, F, "sum")
            generated.append(ops.message_reduce(rowptr, col, perm, ins, SIDES, code, consts, F, "sum", [], [], None))
    codegen.reset()
    if hide is not None:
        hide()
    with config.override(codegen="auto", cache_dir=tmp_path / "empty", cxx=cxx):
        assert build.compiler() == (cxx or "c++")
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            for expr, gen_out in zip(progs, generated):
                code, consts = P.encode(expr)
                assert not codegen.prepare(ins, SIDES, code, consts, F, "sum")
                before = codegen.calls()
                out = ops.message_reduce(rowptr, col, perm, ins, SIDES, code, consts, F, "sum", [], [], None)
                assert codegen.calls() == before  # the interpreter ran
                _assert_same(gen_out, out)
    ours = [w for w in caught if "gnncompile.codegen" in str(w.message)]
    assert len(ours) == 1, [str(w.message) for w in caught]
    return str(ours[0].message)


def test_no_compiler_falls_back_with_one_warning(cache, tmp_path):
    msg = _fallback_case(str(tmp_path / "no-such-c++"), cache, tmp_path)
    assert "not on the PATH" in msg and "interpreter" in msg


def test_failing_compiler_falls_back_with_one_warning(cache, tmp_path):
    fake = tmp_path / "broken-c++"
    fake.write_text("#!/bin/sh\nif [ \"$1\" = --version ]; then echo 'broken 1.0'; exit 0; fi\n"
                    "echo 'broken: internal error' >&2\nexit 1\n")
    fake.chmod(0o755)
    msg = _fallback_case(str(fake), cache, tmp_path)
    assert "failed" in msg


# ----------------------------------------------------------------------------- the disk cache
_CHILD = textwrap.dedent("""
    import json, sys, time
    t0 = time.perf_counter()
    import torch
    from gnncompile import codegen
    from gnncompile.codegen import build
    from gnncompile.ops import program as P
    from gnncompile.ops.schemas import ops
    t_import = time.perf_counter() - t0
    g = torch.Generator().manual_seed(0)
    x = torch.randn(50, 24, generator=g)
    dst = torch.randint(0, 40, (300,), generator=g)
    src = torch.randint(0, 50, (300,), generator=g)
    rowptr, col, perm = ops.build_csr(dst, src, 40, 50)
    code, consts = P.encode(P.node("relu", P.node("mul", P.inp(0), P.const(float(sys.argv[1])))))
    t1 = time.perf_counter()
    ok = codegen.prepare([x], [P.COL], code, consts, 24, "sum")
    t_prepare = time.perf_counter() - t1
    out = ops.message_reduce(rowptr, col, perm, [x], [P.COL], code, consts, 24, "sum", [], [], None)[0]
    print(json.dumps({"ok": ok, "stats": build.stats, "calls": codegen.calls(), "prepare_s": t_prepare,
                      "sum": float(out.double().sum()), "bits": out.view(torch.int32).sum().item()}))
""")


def _child(cache: Path, scale: float = 0.5) -> dict:
    env = dict(os.environ, GNNCOMPILE_CACHE_DIR=str(cache), GNNCOMPILE_CODEGEN="auto")
    r = subprocess.run([sys.executable, "-c", _CHILD, str(scale)], capture_output=True, text=True, env=env,
                       cwd=ROOT, timeout=300)
    assert r.returncode == 0, r.stderr[-3000:]
    return json.loads(r.stdout.strip().splitlines()[-1])


def _spawn(cache: Path, scale: float = 0.5) -> subprocess.Popen:
    env = dict(os.environ, GNNCOMPILE_CACHE_DIR=str(cache), GNNCOMPILE_CODEGEN="auto")
    return subprocess.Popen([sys.executable, "-c", _CHILD, str(scale)], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True, env=env, cwd=ROOT)


def test_new_process_loads_from_the_disk_cache(tmp_path):
    first = _child(tmp_path)
    assert first["ok"] and first["calls"] == 1 and first["stats"]["builds"] == 1
    libs = list((tmp_path / "kernels").glob("*.so"))
    assert len(libs) == 1
    second = _child(tmp_path)
    assert second["ok"] and second["calls"] == 1
    assert second["stats"]["builds"] == 0 and second["stats"]["disk_hits"] == 1
    assert second["bits"] == first["bits"]


def test_no_compiler_on_the_path(cache, tmp_path, monkeypatch):
    """PATH without a compiler (GNNCOMPILE_CXX unset: c++ from the PATH): the interpreter, one
    warning, the generated kernels' numbers."""
    monkeypatch.delenv("GNNCOMPILE_CXX", raising=False)
    msg = _fallback_case(None, cache, tmp_path, hide=lambda: monkeypatch.setenv("PATH", str(tmp_path / "empty-bin")))
    assert "'c++' is not on the PATH" in msg


def test_two_processes_building_one_key(tmp_path):
    procs = [_spawn(tmp_path), _spawn(tmp_path)]
    results = []
    for p in procs:
        out, err = p.communicate(timeout=300)
        assert p.returncode == 0, err[-3000:]
        results.append(json.loads(out.strip().splitlines()[-1]))
    assert all(r["ok"] and r["calls"] == 1 for r in results)
    assert results[0]["bits"] == results[1]["bits"]
    names = sorted(p.name for p in (tmp_path / "kernels").iterdir())
    assert len(names) == 1 and names[0].endswith(".so"), names  # no temporary file left


def test_corrupt_library_is_rebuilt(tmp_path):
    first = _child(tmp_path)
    (lib,) = (tmp_path / "kernels").glob("*.so")
    lib.write_bytes(b"not an ELF file")
    second = _child(tmp_path)
    assert second["ok"] and second["stats"]["rebuilds"] == 1 and second["stats"]["builds"] == 1
    assert second["bits"] == first["bits"]


def test_cache_size_bound_evicts_the_least_recently_used(tmp_path):
    codegen.reset()
    ins = _inputs(torch.float32)
    with config.override(codegen="auto", cache_dir=tmp_path, codegen_cache_mb=1e-6):
        for c in (0.25, 0.75):
            code, consts = P.encode(P.node("mul", I0, P.const(c)))
            assert codegen.prepare(ins, SIDES, code, consts, F, "sum")
        libs = list((tmp_path / "kernels").glob("*.so"))
    codegen.reset()
    assert len(libs) == 1  # the first evicted, the one just built kept


def test_generated_source_has_no_torch_header():
    spec = codegen.make_spec(*P.encode(P.node("exp", I0)), [P.COL], [8], 8, "sum", torch.float32, torch.int64)
    src = codegen.emit(spec)
    assert "torch" not in src.replace("torch-free", "") and "ATen" not in src
    assert '#include "cpu/rows_core.h"' in src


# ----------------------------------------------------------------------------- compiled models
def test_compiled_model_prepares_and_runs_generated_kernels(tmp_path):
    """With GNNCOMPILE_CODEGEN=auto the rewrite pass prepares each CPU message_reduce at compile
    time: the compiled model runs the generated kernel and gives the interpreter's numbers."""
    import copy

    import gnncompile
    from torch_geometric.nn import GINEConv

    torch.manual_seed(0)
    conv = GINEConv(torch.nn.Linear(16, 16))
    g = torch.Generator().manual_seed(3)
    x = torch.randn(40, 16, generator=g)
    ei = torch.randint(0, 40, (2, 300), generator=g)
    ea = torch.randn(300, 16, generator=g)
    codegen.reset()
    with config.override(codegen="auto", cache_dir=tmp_path):
        model = gnncompile.compile(copy.deepcopy(conv))
        before = codegen.calls()
        out = model(x, ei, ea)
        assert codegen.calls() > before
        assert any("|r0|f32|" in k for k in codegen.registered())
    codegen.reset()
    plain = gnncompile.compile(copy.deepcopy(conv))
    before = codegen.calls()
    ref = plain(x, ei, ea)
    assert codegen.calls() == before
    assert torch.equal(out, ref)
    torch.testing.assert_close(out, conv(x, ei, ea))


# ----------------------------------------------------------------------------- message_softmax
@pytest.mark.parametrize("Wt", [1, 7, F])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_softmax_generated_equals_interpreter(gen, dtype, Wt):
    """gnncompile::message_softmax (the temperature read as one more constant input, op key "s"):
    out and lse bit for bit the interpreter's, an edge encoder inside the program too."""
    rowptr, col, perm = _structure(3)
    g = torch.Generator().manual_seed(4)
    x = torch.randn(N_SRC, F, dtype=dtype, generator=g)
    a = torch.randn(E, 5, dtype=dtype, generator=g)
    wt, b = torch.randn(5, F, dtype=dtype, generator=g), torch.randn(1, F, dtype=dtype, generator=g)
    ins, sides = [x, a, wt, b], [P.COL, P.ENC, P.CONST, P.CONST]
    code, consts = P.encode(P.node("add", P.node("relu", P.node("add", I0, I1)), P.const(1e-7)))
    t = torch.rand(1, Wt, dtype=dtype, generator=g) * 2 + 0.1
    codegen.reset()
    ref = ops.message_softmax(rowptr, col, perm, ins, sides, code, consts, F, t, [], [])
    spec = codegen.make_spec(code, consts, sides + [P.CONST], [F, 5, F, F, Wt], F, "sum", dtype, rowptr.dtype,
                             op="softmax")
    assert codegen.prepare_spec(spec), "the kernel was not built"
    before = codegen.calls()
    out = ops.message_softmax(rowptr, col, perm, ins, sides, code, consts, F, t, [], [])
    assert codegen.calls() == before + 1
    for r, o in zip(ref, out):
        assert torch.equal(_bits(r), _bits(o))
    assert torch.isfinite(out[0]).all() and (out[0] != 0).any()
