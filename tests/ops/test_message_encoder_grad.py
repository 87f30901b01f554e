"""gnncompile::message_encoder_grad (native/cpu/message.cpp, message_core.h's
encoder_grad_rows): an edge encoder's gradients accumulated over the edges (no [E, W] tensor)
against the torch reference (message_edges' [E, W] value gradient, then the products:
gnncompile/ops/message.py) for float32 / float64, int32 / int64 indices, D in {1, 16, 33},
the encoder's width F, a divisor (per head) and 1, the upstream gradient read per destination,
per edge or per CSR slot; an empty graph and rows without edges; the backward of message_reduce
(sum, mean) and message_edges through it against torch's autograd of the references; bad inputs
refused with clear errors."""
from __future__ import annotations

import pytest
import torch

from gnncompile.ops import _native
from gnncompile.ops import message as M
from gnncompile.ops import program as P
from gnncompile.ops.schemas import ops

pytestmark = pytest.mark.skipif(not _native.native_loaded(), reason="needs the native module")

N_SRC, N_DST, E = 9, 11, 40  # rows 9 and 10 never get an edge (dst < 9)
F = 140  # two tiles in both dtypes (128 / 64 features), not a multiple of either
I0, I1, I2, I5 = P.inp(0), P.inp(1), P.inp(2), P.inp(5)
# inputs: 0 col x [N, F], 1 row y [M, F], 2 enc a [E, D], 3 const Wt [D, W], 4 const b [1, W],
# 5 slot s [E, 1]
SIDES = [P.COL, P.ROW, P.ENC, P.CONST, P.CONST, P.SLOT]
PROGRAMS = {
    "gated": P.node("mul", P.node("relu", P.node("add", I0, I2)), P.node("add", I1, I5)),
    "linear": P.node("add", I0, I2),  # a derivative that reads only the destination row
    "tanh": P.node("mul", P.node("tanh", P.node("sub", I2, I1)), P.node("add", I2, I0)),
}
TOL = {torch.float32: dict(rtol=1e-4, atol=1e-4), torch.float64: dict(rtol=1e-10, atol=1e-10)}


def _structure(index=torch.int64, E_=E, seed=0):
    g = torch.Generator().manual_seed(seed)
    pick = torch.randperm(N_SRC * (N_DST - 2), generator=g)[:E_]
    src, dst = pick % N_SRC, pick // N_SRC
    rowptr, col, perm = ops.build_csr(dst, src, N_DST, N_SRC)
    return tuple(x.to(index) for x in (rowptr, col, perm))


def _inputs(dtype, D, W, E_=E, seed=1):
    g = torch.Generator().manual_seed(seed)
    shapes = [(N_SRC, F), (N_DST, F), (E_, D), (D, W), (1, W), (E_, 1)]
    return [torch.randn(*s, dtype=dtype, generator=g) for s in shapes]


def _call(csr, ins, program, g_side, dtype, need_features, E_=E, fn=None):
    code, consts = P.encode(program)
    dcode, dconsts = M._derivative(code, consts, 2, len(ins))
    rows = N_DST if g_side == P.ROW else E_
    g = torch.randn(rows, F, dtype=dtype, generator=torch.Generator().manual_seed(7))
    args = (*csr, ins + [g], SIDES + [g_side], dcode, dconsts, F, 2, need_features, [])
    return (fn or ops.message_encoder_grad)(*args), M.message_encoder_grad(*args)


@pytest.mark.parametrize("index", [torch.int32, torch.int64])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("D,W", [(1, F), (16, F), (33, F), (16, 14), (33, 1)])
@pytest.mark.parametrize("program", sorted(PROGRAMS))
def test_native_matches_reference(program, D, W, dtype, index):
    csr = _structure(index)
    ins = _inputs(dtype, D, W)
    for g_side in (P.ROW, P.EDGE, P.SLOT):
        for need in (True, False):
            out, ref = _call(csr, ins, PROGRAMS[program], g_side, dtype, need)
            assert [tuple(t.shape) for t in out] == [tuple(t.shape) for t in ref]
            assert out[0].shape == ((E, D) if need else (0, D))
            for o, r in zip(out, ref):
                assert o.dtype == dtype
                torch.testing.assert_close(o, r, **TOL[dtype])


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_empty_graph_and_no_features(dtype):
    """No edges: every gradient zero (the weight's and bias's of their shapes, the features' [0, D])."""
    csr = _structure(E_=0)
    ins = _inputs(dtype, 4, 14, E_=0)
    for need in (True, False):
        out, ref = _call(csr, ins, PROGRAMS["gated"], P.ROW, dtype, need, E_=0)
        for o, r in zip(out, ref):
            assert o.shape == r.shape and not o.any()
    rowptr = torch.zeros(1, dtype=torch.int64)  # no rows at all
    empty = torch.zeros(0, dtype=torch.int64)
    ins0 = [torch.randn(N_SRC, F, dtype=dtype), torch.randn(0, F, dtype=dtype), torch.randn(0, 4, dtype=dtype),
            torch.randn(4, 14, dtype=dtype), torch.randn(1, 14, dtype=dtype), torch.randn(0, 1, dtype=dtype),
            torch.randn(0, F, dtype=dtype)]
    code, consts = P.encode(PROGRAMS["gated"])
    dcode, dconsts = M._derivative(code, consts, 2, 6)
    da, dwt, db = ops.message_encoder_grad(rowptr, empty, empty, ins0, SIDES + [P.ROW], dcode, dconsts, F, 2, True,
                                           [])
    assert da.shape == (0, 4) and dwt.shape == (4, 14) and db.shape == (1, 14) and not dwt.any() and not db.any()


def test_split_changes_nothing_but_rounding():
    """The result depends on the row split only by the rounding of the chunks' sums: 1 and 2
    threads, several chunks per thread (knobs[0]), agree within float tolerance; float64 tighter."""
    csr = _structure()
    ins = _inputs(torch.float64, 16, F)
    code, consts = P.encode(PROGRAMS["gated"])
    dcode, dconsts = M._derivative(code, consts, 2, 6)
    g = torch.randn(N_DST, F, dtype=torch.float64)
    args = (*csr, ins + [g], SIDES + [P.ROW], dcode, dconsts, F, 2, True)
    threads = torch.get_num_threads()
    try:
        torch.set_num_threads(1)
        one = ops.message_encoder_grad(*args, [])
        torch.set_num_threads(2)
        two = ops.message_encoder_grad(*args, [8])
    finally:
        torch.set_num_threads(threads)
    torch.testing.assert_close(one[0], two[0], rtol=0, atol=0)  # per edge: no sum over chunks
    for a, b in zip(one[1:], two[1:]):
        torch.testing.assert_close(a, b, rtol=1e-12, atol=1e-12)


def _leaves(dtype, D, W):
    return [t.requires_grad_() for t in _inputs(dtype, D, W)]


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("op", ["sum", "mean", "edges"])
@pytest.mark.parametrize("D,W", [(16, F), (33, 14)])
def test_backward_through_it_matches_torch(D, W, op, dtype):
    """The backward of message_reduce (sum, mean) and message_edges (grad mode off in a backward:
    message_encoder_grad) against torch's autograd of the references, for every input."""
    csr = _structure()
    code, consts = P.encode(PROGRAMS["gated"])
    ins = _leaves(dtype, D, W)

    def run(reduce_fn, edges_fn):
        if op == "edges":
            return edges_fn(*csr, ins, SIDES, code, consts, F, F, False, [], [], None)
        return reduce_fn(*csr, ins, SIDES, code, consts, F, op, [], [], None)[0]

    calls = []
    real = ops.message_encoder_grad
    native = run(ops.message_reduce, ops.message_edges)
    g = torch.randn_like(native)
    try:
        M.ops = _Spy(M.ops, calls)
        got = torch.autograd.grad(native, ins, g)
    finally:
        M.ops = M.ops.inner
    assert calls, "the backward did not run message_encoder_grad"
    ref = torch.autograd.grad(run(M.message_reduce, M.message_edges), ins, g)
    for a, b in zip(got, ref):
        torch.testing.assert_close(a, b, **TOL[dtype])
    assert real is ops.message_encoder_grad


class _Spy:
    """ops with message_encoder_grad's calls counted."""

    def __init__(self, inner, calls):
        self.inner, self.calls = inner, calls

    def __getattr__(self, name):
        fn = getattr(self.inner, name)
        if name != "message_encoder_grad":
            return fn

        def counted(*a, **k):
            self.calls.append(name)
            return fn(*a, **k)
        return counted


def test_double_backward_keeps_the_differentiable_path():
    """create_graph=True: the encoder's gradient stays differentiable (message_edges + products,
    not message_encoder_grad) and its second derivative is torch's."""
    csr = _structure()
    code, consts = P.encode(P.node("mul", P.node("add", I1, I2), P.node("add", I1, I2)))
    ins = _leaves(torch.float64, 3, F)

    def first(fn):
        out = fn(*csr, ins, SIDES, code, consts, F, "sum", [], [], None)[0]
        g = torch.autograd.grad(out.pow(2).sum(), ins[2:5], create_graph=True)
        return torch.autograd.grad(sum(t.pow(2).sum() for t in g), ins[1:5])

    for a, b in zip(first(ops.message_reduce), first(M.message_reduce)):
        torch.testing.assert_close(a, b, rtol=1e-9, atol=1e-9)


def test_bad_inputs():
    csr = _structure()
    ins = _inputs(torch.float32, 4, F) + [torch.randn(N_DST, F)]
    sides = SIDES + [P.ROW]
    code, consts = P.encode(PROGRAMS["gated"])
    dcode, dconsts = M._derivative(code, consts, 2, 6)
    op = ops.message_encoder_grad
    for enc in (0, 3, 7, -1):  # not an encoder's input, or outside the inputs
        with pytest.raises(ValueError, match="is not an edge encoder"):
            op(*csr, ins, sides, dcode, dconsts, F, enc, True, [])
        with pytest.raises(ValueError, match="is not an edge encoder"):
            M.message_encoder_grad(*csr, ins, sides, dcode, dconsts, F, enc, True, [])
    bad = list(ins)
    bad[3] = torch.randn(4, 3)  # a weight whose width does not divide F
    with pytest.raises(ValueError, match="weight"):
        op(*csr, bad, sides, dcode, dconsts, F, 2, True, [])
    bad = list(ins)
    bad[2] = torch.randn(E - 1, 4)  # features not per edge
    with pytest.raises(ValueError, match="features"):
        op(*csr, bad, sides, dcode, dconsts, F, 2, True, [])
    with pytest.raises(TypeError):
        op(*csr, [t.double() if k == 3 else t for k, t in enumerate(ins)], sides, dcode, dconsts, F, 2, True, [])
    perm = csr[2].clone()
    perm[3] = E + 5  # an edge id out of range: caught by the walk
    with pytest.raises(IndexError, match="perm"):
        op(csr[0], csr[1], perm, ins, sides, dcode, dconsts, F, 2, True, [])
