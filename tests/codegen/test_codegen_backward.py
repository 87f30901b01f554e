"""Generated kernels of the training step's other message ops (gnncompile/codegen): the backward's
``message_sum_multi`` (every derivative read per destination, or per neighbour, summed in one
pass), ``message_edges`` (per-edge messages and per-edge gradients) and the derivative programs
run through ``message_reduce``: bit for bit the interpreter's numbers, and the autograd of the
message ops preparing them by itself.

Coverage of "every operator x reduce x dtype" for these kernels: every opcode is generated in
both dtypes inside message_sum_multi kernels (several opcodes' programs as the results of one
instruction stream, so a few builds cover them all), on the CSR and on a CSC reading per-slot
inputs through ``slot``; message_edges over both orders (edge / slot) and both output classes
(width F, group sums) in both dtypes; the backward of every reduce in both dtypes, generated vs
interpreted, forward and gradients compared bit for bit."""
from __future__ import annotations

import math

import pytest
import torch

from gnncompile import codegen, config
from gnncompile.codegen import build
from gnncompile.ops import _native
from gnncompile.ops import program as P
from gnncompile.ops import structure
from gnncompile.ops.schemas import ops
from gnncompile.testing.bits import interpreted_then_generated as _ran
from gnncompile.testing.bits import assert_same_bits


def _same(a, b):
    """Bit for bit, NaN as NaN (tests/codegen/test_codegen_kernels.py says why)."""
    assert_same_bits(a, b, any_nan=True)


pytestmark = pytest.mark.skipif(not _native.native_loaded() or build.shutil.which("c++") is None,
                                reason="needs the native module and a C++ compiler")

N_SRC, N_DST, E, F = 11, 9, 60, 70  # F: more than one tile of float64 (64), not a multiple of either tile
I0, I1, I2, I3, I4 = (P.inp(k) for k in range(5))
# inputs: 0 col [N, F], 1 row [M, F], 2 edge [E, 1] (a scalar per edge), 3 const [1, F], 4 edge [E, F / 5]
SIDES = [P.COL, P.ROW, P.EDGE, P.CONST, P.EDGE]
DTYPES = [torch.float32, torch.float64]


# cache, gen: tests/codegen/conftest.py


def _structure(seed=0):
    g = torch.Generator().manual_seed(seed)
    pick = torch.randperm(N_SRC * N_DST, generator=g)[:E]
    src, dst = pick % N_SRC, pick // N_SRC
    return ops.build_csr(dst, src, N_DST, N_SRC)


def _inputs(dtype, positive=False, special=True, seed=1):
    g = torch.Generator().manual_seed(seed)
    out = []
    for s in [(N_SRC, F), (N_DST, F), (E, 1), (1, F), (E, F // 5)]:
        t = torch.randn(*s, dtype=dtype, generator=g)
        out.append(t.abs() + 0.25 if positive else t)
    if special:
        out[0][0, :6] = torch.tensor([math.nan, math.inf, -math.inf, 0.0, -0.0, 1e30], dtype=dtype)
        out[0][1, 3] = 0.0
        out[1][2, 5:8] = torch.tensor([0.0, -0.0, math.nan], dtype=dtype)
    return out


# ----------------------------------------------------------------------------- message_sum_multi
def _opcode_roots(name: str):
    """Programs applying opcode ``name`` to inputs of several sides and width classes (positive
    operands where the operator needs them)."""
    params = P.EXAMPLE_PARAMS.get(name, ())
    ar = {n: a for n, a, _ in P.OPS.values()}[name]
    if name == "in":
        return I4
    if name == "const":
        return P.node("mul", I0, P.const(-1.5))
    a = P.node("add", I0, I2)
    if name in ("log", "sqrt", "pow", "pow_exp_grad", "powc"):
        a = P.node("add", P.node("abs", a), P.const(0.25))
    if ar == 2:
        if name == "eq":
            return P.node("eq", I0, P.node("relu", I0))
        b = P.node("sub", I1, I3) if name not in ("pow", "pow_exp_grad") else P.node("mul", P.node("abs", I1), I4)
        return (name, (a, b), ())
    return (name, (P.node("mul", a, I4),), tuple(float(p) for p in params))


OP_NAMES = [n for n, _, _ in P.OPS.values()]
GROUPS = [OP_NAMES[i:i + 8] for i in range(0, len(OP_NAMES), 8)]  # the results of one instruction stream


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("group", range(len(GROUPS)))
def test_every_opcode_in_sum_multi_equals_interpreter(gen, group, dtype):
    """Every opcode as one result of a message_sum_multi kernel, on the CSR and on its CSC (the
    sides swapped, per-edge inputs read per CSR slot through ``slot``: the backward's form)."""
    code, consts, results = P.encode_many([_opcode_roots(n) for n in GROUPS[group]])
    ins = _inputs(dtype)
    rowptr, col, perm = _structure()
    t_rowptr, t_col, t_perm = structure.transpose_structure(rowptr, col, perm, N_SRC)
    inv = torch.empty_like(perm)
    inv[perm] = torch.arange(E)
    slot = inv[t_perm]
    swapped = [{P.COL: P.ROW, P.ROW: P.COL}.get(s, s) for s in SIDES]
    csc_sides = [P.SLOT if s == P.EDGE else s for s in swapped]
    # on the CSC input 0 is read per row (a source), input 1 per neighbour (a destination), and the
    # per-edge inputs per CSR slot (stored in CSR order, found through slot)
    csc_ins = ins[:2] + [t.index_select(0, perm) if s == P.EDGE else t for t, s in zip(ins[2:], SIDES[2:])]
    calls = [((rowptr, col, perm), ins, SIDES, None), ((t_rowptr, t_col, t_perm), csc_ins, csc_sides, slot)]
    for (rp, c, pm), xs, sides, sl in calls:
        assert codegen.prepare(xs, sides, code, consts, F, "sum", rp.dtype, op="multi", results=results)
        ref, out, n = _ran(lambda: ops.message_sum_multi(rp, c, pm, xs, sides, code, consts, results, F, [], sl))
        assert n == 1
        _same(ref, out)


def test_sum_multi_repeated_and_overwritten_slots(gen):
    """Results name slots the interpreter reuses (a slot freed by its last reader written again):
    a result is the slot's last value, the same slot may be asked for twice."""
    x = P.node("tanh", I0)
    y = P.node("mul", x, I1)
    code, consts, results = P.encode_many([y, P.node("exp", y), x])
    results = list(results) + [results[0]]
    ins = _inputs(torch.float32, special=False)
    rowptr, col, perm = _structure()
    assert codegen.prepare(ins, SIDES, code, consts, F, "sum", op="multi", results=results)
    ref, out, n = _ran(lambda: ops.message_sum_multi(rowptr, col, perm, ins, SIDES, code, consts, results, F, [], None))
    assert n == 1
    _same(ref, out)


# ----------------------------------------------------------------------------- message_edges
EDGE_PROGRAMS = {  # every side and width class of input between them
    "softplus_heads": P.node("mul", P.node("softplus", P.node("sub", I0, I1), params=(1.0, 20.0)), I4),
    "gelu_grad_const": P.node("mul", P.node("gelu_grad", P.node("add", I0, I3)), I2),
}


@pytest.mark.parametrize("dtype", DTYPES)
def test_message_edges_equals_interpreter(gen, dtype):
    """Both orders (the user's edge order, CSR slots) and both output classes (width F; group sums
    of F / W features, added feature by feature as the interpreter adds them), int64 and int32."""
    ins = _inputs(dtype)
    rowptr, col, perm = _structure()
    for csr in ((rowptr, col, perm), (rowptr.int(), col.int(), perm.int())):
        for expr in EDGE_PROGRAMS.values():
            code, consts = P.encode(expr)
            for by_slot in (False, True):
                for W in (F, 14 if by_slot else 1):
                    assert codegen.prepare(ins, SIDES, code, consts, F, "sum", csr[0].dtype, op="edges", out_width=W,
                                           by_slot=by_slot)
                    ref, out, n = _ran(lambda: ops.message_edges(*csr, ins, SIDES, code, consts, F, W, by_slot, [], [],
                                                                 None))
                    assert n == 1
                    _same(ref, out)
            if csr[0].dtype == torch.int32:
                break  # int32: one program is enough


def test_message_edges_bad_structure_raises_as_the_interpreter(gen):
    rowptr, col, perm = _structure()
    ins = _inputs(torch.float32)
    code, consts = P.encode(P.node("relu", I0))
    assert codegen.prepare(ins, SIDES, code, consts, F, "sum", op="edges", out_width=F)
    bad = perm.clone()
    bad[5] = E + 3
    with pytest.raises(IndexError):
        ops.message_edges(rowptr, col, bad, ins, SIDES, code, consts, F, F, False, [], [], None)
    bad = col.clone()
    bad[7] = -1
    with pytest.raises(IndexError, match="source index out of range"):
        ops.message_edges(rowptr, bad, perm, ins, SIDES, code, consts, F, F, False, [], [], None)


def test_keys_match_the_native_registry_keys():
    n = _native._C.codegen
    code, consts, results = P.encode_many([P.node("exp", I0), P.node("tanh", I1)])
    widths = [F, F, 1, F, F // 5]
    for kw, op in ((dict(op="multi", results=results), n.multi_op(list(results))),
                   (dict(op="edges", out_width=F, by_slot=True), n.edges_op(True, F, F)),
                   (dict(op="edges", out_width=10, by_slot=False), n.edges_op(False, 10, F)),
                   (dict(), n.reduce_op(2))):
        spec = codegen.make_spec(code, consts, SIDES, widths, F, "max" if not kw else "sum", torch.float32,
                                 torch.int64, **kw)
        assert spec.key() == n.key(op, False, True, code, consts, SIDES, widths, F)
    keys = {codegen.make_spec(code, consts, SIDES, widths, F, "sum", torch.float32, torch.int64, **kw).key()
            for kw in (dict(), dict(op="multi", results=results), dict(op="multi", results=results[:1]),
                       dict(op="edges", out_width=F), dict(op="edges", out_width=F, by_slot=True),
                       dict(op="edges", out_width=14))}
    assert len(keys) == 6  # one kernel per op, results, order and output class


def test_prepare_call_memo_by_value(gen, monkeypatch):
    """prepare_call (the backward's hook at every call) answers a call shape it has seen from its
    memo, keyed by value: the same program given as ints, floats or bools, or with an element that
    cannot be hashed (a symbolic size) is one key, found without building its spec again."""
    ins = _inputs(torch.float32)
    code, consts = P.encode(P.node("mul", P.node("relu", I0), I1))
    index = _structure()[0]
    made = []
    real = codegen.make_spec
    monkeypatch.setattr(codegen, "make_spec", lambda *a, **k: made.append(1) or real(*a, **k))
    assert codegen.prepare_call("reduce", index, ins, SIDES, code, consts, F) is True
    assert len(made) == 1

    class Unhashable(int):
        __hash__ = None

    same = [
        ("reduce", index, ins, SIDES, tuple(code), [float(c) for c in consts], F),
        ("reduce", index, ins, [Unhashable(s) for s in SIDES], code, consts, Unhashable(F)),
    ]
    for args in same:
        assert codegen.prepare_call(*args) is True
    assert len(made) == 1
    other = [c for c in consts] + [2.0]  # another key: built once, its answer cached too
    codegen.prepare_call("reduce", index, ins, SIDES, code, other, F)
    codegen.prepare_call("reduce", index, ins, SIDES, code, other, F)
    assert len(made) == 2


def test_bad_op_specs_are_refused():
    code, consts = P.encode(P.node("exp", I0))
    args = (code, consts, [P.COL], [8], 8)
    with pytest.raises(ValueError, match="unknown op"):
        codegen.make_spec(*args, "sum", torch.float32, torch.int64, op="scan")
    with pytest.raises(ValueError, match="sums"):
        codegen.make_spec(*args, "max", torch.float32, torch.int64, op="multi", results=[0])
    with pytest.raises(ValueError, match="no instruction writes"):
        codegen.make_spec(*args, "sum", torch.float32, torch.int64, op="multi", results=[5])
    with pytest.raises(ValueError, match="1 to 16 results"):
        codegen.make_spec(*args, "sum", torch.float32, torch.int64, op="multi", results=[])
    with pytest.raises(ValueError, match="does not divide"):
        codegen.make_spec(*args, "sum", torch.float32, torch.int64, op="edges", out_width=3)
    with pytest.raises(ValueError, match="belong to"):
        codegen.make_spec(*args, "sum", torch.float32, torch.int64, by_slot=True)


# ----------------------------------------------------------------------------- autograd
def _interpreted(fn):
    """fn() with nothing registered and the mode off (the backward prepares nothing)."""
    codegen.reset()
    with config.override(codegen="off"):
        return fn()


def _step(expr, dtype, reduce, op="reduce", sides=SIDES, need=(True, True, True, True, True), special=False,
          positive=False):
    """Forward and backward of one message op; the values and gradients."""
    code, consts = P.encode(expr)
    rowptr, col, perm = _structure()
    ins = [t.clone().requires_grad_(r) for t, r in zip(_inputs(dtype, positive=positive, special=special), need)]
    if op == "reduce":
        out = ops.message_reduce(rowptr, col, perm, ins, sides, code, consts, F, reduce, [], [], None)[0]
    else:
        out = ops.message_edges(rowptr, col, perm, ins, sides, code, consts, F, F, op == "slot", [], [], None)
    w = torch.linspace(-1, 1, out.numel(), dtype=dtype).view_as(out)
    (out * w).sum().backward()
    return [out.detach()] + [t.grad for t in ins if t.requires_grad]


BACKWARD_PROGRAMS = {
    "relu_xj_e_heads": P.node("mul", P.node("relu", P.node("add", I0, I2)), I4),
    "gelu_tanh": P.node("mul", P.node("gelu", P.node("add", I0, I3)), P.node("tanh", I1)),
}


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("reduce", ["sum", "mean", "max", "min", "edges", "slot"])
def test_backward_runs_generated_kernels_and_equals_interpreter(gen, reduce, dtype):
    """Forward and backward with the generated kernels (the backward prepares its derivative
    programs at their first use: message_sum_multi on the CSR and the CSC, message_edges for
    per-edge inputs; max / min's formula through message_reduce) equal the interpreter's bit for
    bit, and only generated kernels ran."""
    op = reduce if reduce in ("edges", "slot") else "reduce"
    keys = set()  # the kinds of kernel registered: r (message_reduce), m (sum_multi), e (edges)
    for expr in BACKWARD_PROGRAMS.values():
        with torch.no_grad():  # forward kernels prepared as the compiler prepares them
            code, consts = P.encode(expr)
            ins = _inputs(dtype)
            kw = dict(op="edges", out_width=F, by_slot=op == "slot") if op != "reduce" else {}
            assert codegen.prepare(ins, SIDES, code, consts, F, reduce if op == "reduce" else "sum", **kw)
        run = lambda: _step(expr, dtype, reduce if op == "reduce" else "sum", op)  # noqa: E731
        ref = _interpreted(run)
        codegen.prepare(ins, SIDES, code, consts, F, reduce if op == "reduce" else "sum", **kw)
        before = codegen.calls()
        out = run()
        if reduce in ("max", "min"):  # the fast form evaluates d_k at the winners with torch ops
            assert codegen.calls() - before >= 1
        else:  # the forward and >= 2 of: sum_multi over the CSR, over the CSC, message_edges per edge input
            assert codegen.calls() - before >= 3, "the backward ran the interpreter"
            keys.update(k.split("|")[1][0] for k in codegen.registered())
        for a, b in zip(ref, out):
            _same(a, b)
    assert reduce in ("max", "min") or keys >= {"m", "e"}, keys
    if op == "reduce" and reduce in ("max", "min"):  # torch's formula rows: an unbounded program, with ties
        expr = P.node("exp", P.node("mul", P.node("relu", I0), I2))
        ref = _interpreted(lambda: _step(expr, dtype, reduce, special=True))
        before = codegen.calls()
        # nothing prepared for the forward: only the formula's kernels ran (its count, its sum_multi)
        out = _step(expr, dtype, reduce, special=True)
        assert codegen.calls() - before >= 2
        for a, b in zip(ref, out):
            _same(a, b)


def test_backward_with_mode_off_runs_the_interpreter(cache):
    codegen.reset()
    with config.override(codegen="off", cache_dir=cache):
        before = codegen.calls()
        _step(BACKWARD_PROGRAMS["gelu_tanh"], torch.float32, "sum")
        assert codegen.calls() == before and codegen.registered() == []


def test_double_backward_with_generated_kernels(gen):
    """Inside a double backward the gradients are separate message_reduce passes (CSR, CSC with
    slot) and message_edges: generated too, the same numbers."""
    expr = P.node("mul", P.node("tanh", P.node("add", I0, I2)), I1)
    code, consts = P.encode(expr)
    rowptr, col, perm = _structure()

    def run():
        ins = [t.clone().requires_grad_() for t in _inputs(torch.float64, special=False)]
        out = ops.message_reduce(rowptr, col, perm, ins, SIDES, code, consts, F, "sum", [], [], None)[0]
        grads = torch.autograd.grad(out.pow(2).sum(), ins, create_graph=True)
        total = sum((g * g).sum() for g in grads)
        return [out.detach()] + list(grads) + list(torch.autograd.grad(total, ins))

    ref = _interpreted(run)
    before = codegen.calls()
    out = run()
    assert codegen.calls() - before >= 3
    assert any("|e0" in k for k in codegen.registered()) and any("|r0" in k for k in codegen.registered())
    for a, b in zip(ref, out):
        _same(a.detach(), b.detach())


def test_compiled_training_step_runs_generated_backward(tmp_path):
    """A compiled GINE layer's training step with GNNCOMPILE_CODEGEN=auto: the backward traced at
    compile time prepares its derivative kernels; values and gradients equal the interpreter's."""
    import copy

    import gnncompile
    from torch_geometric.nn import GINEConv

    torch.manual_seed(0)
    conv = GINEConv(torch.nn.Linear(16, 16), edge_dim=4)
    g = torch.Generator().manual_seed(3)
    x = torch.randn(40, 16, generator=g)
    ei = torch.randint(0, 40, (2, 300), generator=g)
    ea = torch.randn(300, 4, generator=g)

    def step(mode):
        codegen.reset()
        model = copy.deepcopy(conv)
        xs = x.clone().requires_grad_()
        with config.override(codegen=mode, cache_dir=tmp_path):
            compiled = gnncompile.compile(model)
            before = codegen.calls()
            out = compiled(xs, ei, ea)
            out.pow(2).sum().backward()
            ran = codegen.calls() - before
            keys = codegen.registered()
        return out.detach(), [xs.grad] + [p.grad for p in model.parameters()], ran, keys

    out_g, grads_g, ran_g, keys = step("auto")
    out_i, grads_i, ran_i, _ = step("off")
    codegen.reset()
    assert ran_i == 0 and ran_g >= 2
    assert any("|m" in k or "|e" in k for k in keys), keys  # a backward kernel was generated
    assert torch.equal(out_i, out_g)
    for a, b in zip(grads_i, grads_g):
        assert torch.equal(a, b)


def test_auto_is_the_default_and_explain_says_which_kernels_run(tmp_path):
    """Generated kernels are the default (the suite itself runs with GNNCOMPILE_CODEGEN=off:
    tests/conftest.py); explain() says which the CPU message ops run."""
    import gnncompile
    from torch_geometric.nn import GINEConv

    assert config.Config().codegen == "auto"
    assert config._parse((None,) * len(config.VARIABLES)).codegen == "auto"
    conv = GINEConv(torch.nn.Linear(8, 8), edge_dim=4)
    g = torch.Generator().manual_seed(0)
    x, ei, ea = torch.randn(20, 8, generator=g), torch.randint(0, 20, (2, 80), generator=g), torch.randn(80, 4)
    codegen.reset()
    with config.override(codegen="auto", cache_dir=tmp_path, programs="always"):
        rep = gnncompile.explain(conv, x, ei, ea)
    assert "message programs (CPU): generated C++" in str(rep) and "1 kernel(s) ready" in str(rep)
    assert rep.as_dict()["message_kernels"] == rep.message_kernels
    with config.override(codegen="off", programs="always"):
        assert "message programs (CPU): the interpreter (GNNCOMPILE_CODEGEN=off)" in str(
            gnncompile.explain(conv, x, ei, ea))
    codegen.reset()
