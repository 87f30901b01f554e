"""Message programs with an edge encoder (side ``enc``, gnncompile/ops/program.py): the native
kernels (native/cpu/message_core.h, the interpreter) against the torch reference
(gnncompile/ops/message.py) for every op, reduce, dtype and index dtype, a transposed traversal
with ``slot``, per-feature / per-head / per-edge encoder widths and several feature counts D;
bad encoder inputs refused with clear errors, by the kernels as by the reference."""
from __future__ import annotations

import pytest
import torch

from gnncompile.ops import _native
from gnncompile.ops import message as M
from gnncompile.ops import program as P
from gnncompile.ops import structure
from gnncompile.ops.schemas import ops

pytestmark = pytest.mark.skipif(not _native.native_loaded(), reason="needs the native module")

N_SRC, N_DST, E = 9, 7, 40
F = 140  # two tiles in both dtypes (128 / 64 features), not a multiple of either
I0, I1, I2, I3, I4, I5 = (P.inp(k) for k in range(6))
# inputs: 0 col x [N, F], 1 row y [M, F], 2 enc a [E, D], 3 const Wt [D, W], 4 const b [1, W],
# 5 slot s [E, 1] (CSR order)
SIDES = [P.COL, P.ROW, P.ENC, P.CONST, P.CONST, P.SLOT]
PROGRAM = P.node("mul", P.node("relu", P.node("add", I0, I2)), P.node("add", I1, I5))


def _structure(seed=0, index=torch.int64):
    g = torch.Generator().manual_seed(seed)
    pick = torch.randperm(N_SRC * N_DST, generator=g)[:E]
    src, dst = pick % N_SRC, pick // N_SRC
    rowptr, col, perm = ops.build_csr(dst, src, N_DST, N_SRC)
    t = structure.transpose_structure(rowptr, col, perm, N_SRC)[:3]
    inv = torch.empty_like(perm)
    inv[perm] = torch.arange(E)
    slot = inv[t[2]]  # the CSR slot of every CSC slot
    return tuple(x.to(index) for x in (rowptr, col, perm)), tuple(x.to(index) for x in t), slot.to(index)


def _inputs(dtype, D, W, seed=1):
    g = torch.Generator().manual_seed(seed)
    shapes = [(N_SRC, F), (N_DST, F), (E, D), (D, W), (1, W), (E, 1)]
    return [torch.randn(*s, dtype=dtype, generator=g) for s in shapes]


def _bits(t):
    return t.view(torch.int64 if t.dtype == torch.float64 else torch.int32)


def _exact(a, b):
    assert a.dtype == b.dtype and a.shape == b.shape
    assert torch.equal(_bits(a), _bits(b))


@pytest.mark.parametrize("index", [torch.int32, torch.int64])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("D,W", [(1, F), (3, F), (16, F), (33, F), (16, 14), (3, 1), (33, 7)])
def test_encoder_value_is_the_reference_bit_for_bit(D, W, dtype, index):
    """The value read for every edge (message_edges of the encoder alone: no sum over edges) is
    b + a @ Wt summed in the reference's order, bit for bit, at every width class."""
    csr, _, _ = _structure(index=index)
    ins = _inputs(dtype, D, W)
    code, consts = P.encode(I2)
    out = ops.message_edges(*csr, ins, SIDES, code, consts, F, F, False, [], [], None)
    ref = M.message_edges(*csr, ins, SIDES, code, consts, F, F)
    _exact(out, ref)
    direct = P.encode_edges(ins[2], ins[3], ins[4]).repeat_interleave(F // W, dim=1)
    _exact(out, direct)


@pytest.mark.parametrize("index", [torch.int32, torch.int64])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("reduce", ["sum", "mean", "max", "min"])
@pytest.mark.parametrize("D,W", [(1, F), (16, F), (33, 14), (3, 1)])
def test_reduce_matches_reference(D, W, reduce, dtype, index):
    csr, _, _ = _structure(index=index)
    ins = _inputs(dtype, D, W)
    code, consts = P.encode(PROGRAM)
    out, arg = ops.message_reduce(*csr, ins, SIDES, code, consts, F, reduce, [], [], None)
    ref, ref_arg = M.message_reduce(*csr, ins, SIDES, code, consts, F, reduce)
    tol = dict(rtol=1e-5, atol=1e-5) if dtype == torch.float32 else dict(rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(out, ref, **tol)
    if reduce in ("max", "min"):
        assert torch.equal(arg, ref_arg)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("W_out,by_slot", [(F, False), (F, True), (14, False), (1, True)])
def test_edges_match_reference(W_out, by_slot, dtype):
    csr, _, _ = _structure(3)
    ins = _inputs(dtype, 16, 14)
    code, consts = P.encode(PROGRAM)
    out = ops.message_edges(*csr, ins, SIDES, code, consts, F, W_out, by_slot, [], [], None)
    ref = M.message_edges(*csr, ins, SIDES, code, consts, F, W_out, by_slot)
    if W_out == F:
        _exact(out, ref)
    else:
        tol = dict(rtol=1e-5, atol=1e-5) if dtype == torch.float32 else dict(rtol=1e-12, atol=1e-12)
        torch.testing.assert_close(out, ref, **tol)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_sum_multi_matches_reference(dtype):
    roots = [PROGRAM, I2, P.node("tanh", P.node("mul", I2, I1)), P.node("add", I0, I5)]
    code, consts, results = P.encode_many(roots)
    csr, _, _ = _structure(4, torch.int32)
    ins = _inputs(dtype, 3, F)
    out = ops.message_sum_multi(*csr, ins, SIDES, code, consts, results, F, [], None)
    ref = M.message_sum_multi(*csr, ins, SIDES, code, consts, results, F)
    tol = dict(rtol=1e-5, atol=1e-5) if dtype == torch.float32 else dict(rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(out, ref, **tol)


@pytest.mark.parametrize("reduce", ["sum", "max"])
@pytest.mark.parametrize("index", [torch.int32, torch.int64])
def test_transposed_traversal_with_slot(reduce, index):
    """On a CSC with ``slot`` (the backward's form): the encoder reads edge perm_t[j], like an
    ``edge`` input; the slot input reads CSR slot slot[j]."""
    _, csc, slot = _structure(5, index)
    ins = _inputs(torch.float64, 16, F)
    ins[0] = torch.randn(N_DST, F, dtype=torch.float64)  # read per neighbour on the CSC: the CSR's rows
    ins[1] = torch.randn(N_SRC, F, dtype=torch.float64)
    code, consts = P.encode(PROGRAM)
    out, arg = ops.message_reduce(*csc, ins, SIDES, code, consts, F, reduce, [], [], slot)
    ref, ref_arg = M.message_reduce(*csc, ins, SIDES, code, consts, F, reduce, slot=slot)
    torch.testing.assert_close(out, ref, rtol=1e-12, atol=1e-12)
    if reduce == "max":
        assert torch.equal(arg, ref_arg)
    edges = ops.message_edges(*csc, ins, SIDES, code, consts, F, F, False, [], [], slot)
    _exact(edges, M.message_edges(*csc, ins, SIDES, code, consts, F, F, slot=slot))


def test_encoder_next_to_edge_inputs_and_knobs():
    """Two encoders and an edge input in one program; the knobs (row split, prefetch distance,
    which prefetches the encoder's feature rows) change no bit."""
    csr, _, _ = _structure(6)
    g = torch.Generator().manual_seed(7)
    a1, w1, b1 = (torch.randn(*s, dtype=torch.float32, generator=g) for s in [(E, 5), (5, F), (1, F)])
    a2, w2, b2 = (torch.randn(*s, dtype=torch.float32, generator=g) for s in [(E, 2), (2, 10), (1, 10)])
    e = torch.randn(E, F, dtype=torch.float32, generator=g)
    ins = [a1, w1, b1, e, a2, w2, b2]
    sides = [P.ENC, P.CONST, P.CONST, P.EDGE, P.ENC, P.CONST, P.CONST]
    code, consts = P.encode(P.node("sigmoid", P.node("add", P.node("mul", I0, I3), P.inp(4))))
    base = ops.message_reduce(*csr, ins, sides, code, consts, F, "sum", [], [], None)[0]
    ref = M.message_reduce(*csr, ins, sides, code, consts, F, "sum")[0]
    torch.testing.assert_close(base, ref, rtol=1e-5, atol=1e-5)
    for knobs in ([1, 1], [4, 64], [64, 7]):
        _exact(ops.message_reduce(*csr, ins, sides, code, consts, F, "sum", knobs, [], None)[0], base)


def test_empty_structure_and_empty_rows():
    rowptr = torch.zeros(4, dtype=torch.int64)
    empty = torch.zeros(0, dtype=torch.int64)
    ins = [torch.randn(2, 6), torch.zeros(0, 3), torch.randn(3, 6), torch.randn(1, 6)]
    sides = [P.COL, P.ENC, P.CONST, P.CONST]
    code, consts = P.encode(P.node("add", I0, I1))
    out, _ = ops.message_reduce(rowptr, empty, empty, ins, sides, code, consts, 6, "max", [], [], None)
    assert torch.equal(out, torch.zeros(3, 6))


def _bad_cases():
    """(what, inputs, sides, error type, message) of encoder inputs that both the kernels and the
    reference refuse."""
    g = torch.Generator().manual_seed(0)
    x = torch.randn(N_SRC, F, generator=g)
    a, wt, b = torch.randn(E, 4, generator=g), torch.randn(4, 14, generator=g), torch.randn(1, 14, generator=g)
    C, EN = P.CONST, P.ENC
    return [
        ("last input", [x, a], [P.COL, EN], ValueError, "needs its weight and bias as constant inputs 2 and 3"),
        ("weight not constant", [x, a, wt, b], [P.COL, EN, P.EDGE, C], ValueError, "constant inputs 2 and 3"),
        ("features per node", [x, a[:N_DST], wt, b], [P.COL, EN, C, C], ValueError,
         r"features \(input 1\) have shape \[7, 4\], not \[40 edges, D\]"),
        ("weight rows", [x, a, wt[:3], b], [P.COL, EN, C, C], ValueError,
         r"weight \(input 2\) has shape \[3, 14\], not \[4, W\] with W dividing 140"),
        ("weight width", [x, a, torch.randn(4, 15), torch.randn(1, 15)], [P.COL, EN, C, C], ValueError,
         r"weight \(input 2\) has shape \[4, 15\]"),
        ("bias shape", [x, a, wt, torch.randn(2, 14)], [P.COL, EN, C, C], ValueError,
         r"bias \(input 3\) has shape \[2, 14\], not \[1, 14\]"),
        ("bias width", [x, a, wt, torch.randn(1, 7)], [P.COL, EN, C, C], ValueError, r"not \[1, 14\]"),
        ("weight dtype", [x, a, wt.double(), b], [P.COL, EN, C, C], TypeError, "share one float dtype"),
        ("bias dtype", [x, a, wt, b.double()], [P.COL, EN, C, C], TypeError, "share one float dtype"),
    ]


@pytest.mark.parametrize("case", _bad_cases(), ids=lambda c: c[0])
def test_bad_encoder_inputs_raise(case):
    _, ins, sides, err, msg = case
    csr, _, _ = _structure()
    code, consts = P.encode(P.node("add", I0, I1))
    with pytest.raises(err, match=msg):
        ops.message_reduce(*csr, ins, sides, code, consts, F, "sum", [], [], None)
    with pytest.raises(err, match=msg):
        ops.message_edges(*csr, ins, sides, code, consts, F, F, False, [], [], None)
    with pytest.raises(err, match=msg):  # the reference says the same
        M.message_reduce(*csr, ins, sides, code, consts, F, "sum")


def test_non_contiguous_encoder_inputs():
    """A Linear's weight [W, D] passed transposed (Wt, a view), features a slice of a wider
    tensor: the same values as contiguous copies."""
    csr, _, _ = _structure(8)
    g = torch.Generator().manual_seed(9)
    x = torch.randn(N_SRC, F, generator=g)
    weight = torch.randn(F, 16, generator=g)  # torch.nn.Linear(16, F).weight's layout
    wide = torch.randn(E, 20, generator=g)
    a, wt, b = wide[:, 2:18], weight.t(), torch.randn(F, generator=g).view(1, F)
    assert not a.is_contiguous() and not wt.is_contiguous()
    sides = [P.COL, P.ENC, P.CONST, P.CONST]
    code, consts = P.encode(P.node("relu", P.node("add", I0, I1)))
    out = ops.message_edges(*csr, [x, a, wt, b], sides, code, consts, F, F, False, [], [], None)
    ref = ops.message_edges(*csr, [x, a.contiguous(), wt.contiguous(), b], sides, code, consts, F, F, False, [], [],
                            None)
    _exact(out, ref)
    _exact(out, M.message_edges(*csr, [x, a, wt, b], sides, code, consts, F, F))
