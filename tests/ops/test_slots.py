"""Edge inputs in CSR slot order (gnncompile/ops/slots.py; side enc_slot, ops/program.py).

``gnncompile::slot_rows`` is ``a[perm]``, its gradient ``a``'s in the user's edge order; an edge
encoder read per CSR slot (enc_slot) from that copy gives the messages, the reductions' records
and every gradient of the encoder read through perm (enc) bit for bit (forward: sum / mean / max /
min; message_edges in both orders; message_encoder_grad; the autograd of message_reduce through
the CSR and the CSC, 'accumulate' and 'per_edge', features that need a gradient or not); the copy
cached with the structure is handed out again only for the same tensor, unchanged (version
counter, and the fingerprint of its bytes where the check mode asks for it).
"""
from __future__ import annotations

import gc

import pytest
import torch

from gnncompile.ops import message as M
from gnncompile.ops import program as P
from gnncompile.ops import slots as S
from gnncompile.ops.schemas import ops
from gnncompile.ops.structure import Structure
from gnncompile.testing.bits import assert_same_bits as same

N_SRC, N_DST, E_, F = 13, 11, 90, 40


def _structure(index=torch.int64, seed=0):
    g = torch.Generator().manual_seed(seed)
    src = torch.randint(0, N_SRC, (E_,), generator=g)
    dst = torch.randint(0, N_DST, (E_,), generator=g)
    return tuple(t.to(index) for t in ops.build_csr(dst, src, N_DST, N_SRC))


def _encoder_inputs(dtype, D=5, W=F, seed=1, grad=False):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(N_SRC, F, generator=g, dtype=dtype)
    xi = torch.randn(N_DST, F, generator=g, dtype=dtype)
    a = torch.randn(E_, D, generator=g, dtype=dtype)
    wt = torch.randn(D, W, generator=g, dtype=dtype)
    b = torch.randn(1, W, generator=g, dtype=dtype)
    ins = [x, xi, a, wt, b]
    return [t.requires_grad_() for t in ins] if grad else ins


# relu(x_j + enc) * (x_i - enc): reads the encoder twice, both node sides
PROGRAM = P.encode(P.node("mul", P.node("relu", P.node("add", P.inp(0), P.inp(2))),
                          P.node("sub", P.inp(1), P.inp(2))))
SIDES_ENC = [P.COL, P.ROW, P.ENC, P.CONST, P.CONST]
SIDES_SLOT = [P.COL, P.ROW, P.ENCS, P.CONST, P.CONST]


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.int64])
def test_slot_rows_is_index_select(dtype):
    rowptr, col, perm = _structure()
    a = (torch.randn(E_, 3, 2) * 100).to(dtype)
    out = ops.slot_rows(a, perm)
    assert torch.equal(out, a.index_select(0, perm.long()))
    assert out.is_contiguous()
    assert torch.equal(ops.slot_rows(a.transpose(1, 2), perm), a.transpose(1, 2).index_select(0, perm.long()))


def test_slot_rows_gradient_in_edge_order():
    _, _, perm = _structure()
    a = torch.randn(E_, 4, dtype=torch.float64, requires_grad=True)
    g = torch.randn(E_, 4, dtype=torch.float64)
    g[3, 1] = -0.0  # a copy, not a sum: the sign of a zero survives
    (ga,) = torch.autograd.grad(ops.slot_rows(a, perm), a, g)
    expect = torch.empty_like(g)
    expect[perm.long()] = g
    same(ga, expect)
    assert torch.autograd.gradcheck(lambda t: ops.slot_rows(t, perm), (a,))


def test_slot_rows_bad_perm():
    a = torch.randn(E_, 2)
    bad = torch.arange(E_)
    bad[5] = E_
    with pytest.raises(IndexError, match="slot_rows"):
        ops.slot_rows(a, bad)
    with pytest.raises(ValueError, match="one entry per"):
        ops.slot_rows(a, torch.arange(E_ - 1))


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("reduce", ["sum", "mean", "max", "min"])
def test_forward_same_bits(reduce, dtype):
    rowptr, col, perm = _structure()
    x, xi, a, wt, b = _encoder_inputs(dtype)
    a_s = ops.slot_rows(a, perm)
    r1 = ops.message_reduce(rowptr, col, perm, [x, xi, a, wt, b], SIDES_ENC, *PROGRAM, F, reduce, [], [], None)
    r2 = ops.message_reduce(rowptr, col, perm, [x, xi, a_s, wt, b], SIDES_SLOT, *PROGRAM, F, reduce, [], [], None)
    same(r1[0], r2[0])
    assert torch.equal(r1[1], r2[1])  # max / min: the same CSR slots recorded
    for by_slot in (False, True):
        e1 = ops.message_edges(rowptr, col, perm, [x, xi, a, wt, b], SIDES_ENC, *PROGRAM, F, F, by_slot, [], [], None)
        e2 = ops.message_edges(rowptr, col, perm, [x, xi, a_s, wt, b], SIDES_SLOT, *PROGRAM, F, F, by_slot, [], [],
                               None)
        same(e1, e2)


def test_reference_reads_slots():
    """The torch reference (every other backend) reads enc_slot features per CSR slot too."""
    rowptr, col, perm = _structure()
    x, xi, a, wt, b = _encoder_inputs(torch.float64)
    a_s = ops.slot_rows(a, perm)
    r1 = M.message_reduce(rowptr, col, perm, [x, xi, a, wt, b], SIDES_ENC, *PROGRAM, F, "sum")
    r2 = M.message_reduce(rowptr, col, perm, [x, xi, a_s, wt, b], SIDES_SLOT, *PROGRAM, F, "sum")
    same(r1[0], r2[0])
    native = ops.message_reduce(rowptr, col, perm, [x, xi, a_s, wt, b], SIDES_SLOT, *PROGRAM, F, "sum", [], [], None)
    torch.testing.assert_close(native[0], r2[0])


@pytest.mark.parametrize("W", [F, 8, 1])
@pytest.mark.parametrize("need", [True, False])
def test_encoder_grad_same_bits(need, W):
    rowptr, col, perm = _structure(seed=2)
    x, xi, a, wt, b = _encoder_inputs(torch.float32, W=W)
    up = torch.randn(N_DST, F)
    code, consts = PROGRAM
    dcode, dconsts = M._derivative(code, consts, 2, 5)
    r1 = ops.message_encoder_grad(rowptr, col, perm, [x, xi, a, wt, b, up], SIDES_ENC + [P.ROW], dcode, dconsts, F,
                                  2, need, [])
    a_s = ops.slot_rows(a, perm)
    r2 = ops.message_encoder_grad(rowptr, col, perm, [x, xi, a_s, wt, b, up], SIDES_SLOT + [P.ROW], dcode, dconsts,
                                  F, 2, need, [])
    same(r1[1], r2[1])
    same(r1[2], r2[2])
    if need:  # the features' gradient per CSR slot
        same(r1[0].index_select(0, perm.long()), r2[0])
    else:
        assert r2[0].numel() == 0


@pytest.mark.parametrize("mode", ["accumulate", "per_edge"])
@pytest.mark.parametrize("reduce", ["sum", "mean", "max"])
@pytest.mark.parametrize("index", [torch.int32, torch.int64])
def test_autograd_same_bits(index, reduce, mode, monkeypatch):
    """Every gradient, x's through the CSC among them: the enc_slot features' gradient (through
    slot_rows) comes back in the user's edge order, bit for bit enc's."""
    monkeypatch.setattr(M, "ENCODER_GRAD", mode)
    rowptr, col, perm = _structure(index, seed=3)
    up = torch.randn(N_DST, F, dtype=torch.float64)
    results = []
    for sides in (SIDES_ENC, SIDES_SLOT):
        ins = _encoder_inputs(torch.float64, grad=True)
        read = list(ins)
        if sides is SIDES_SLOT:
            read[2] = ops.slot_rows(ins[2], perm)
        out = ops.message_reduce(rowptr, col, perm, read, sides, *PROGRAM, F, reduce, [], [], None)[0]
        results.append([out] + list(torch.autograd.grad(out, ins, up)))
    for u, v in zip(*results):
        same(u, v)


SMOOTH = P.encode(P.node("mul", P.node("tanh", P.node("add", P.inp(0), P.inp(2))), P.inp(1)))


def test_double_backward_same_bits():
    """A double backward (the encoder's value gradient per edge, [E, W], differentiable)."""
    rowptr, col, perm = _structure(seed=4)
    results = []
    for sides in (SIDES_ENC, SIDES_SLOT):
        ins = _encoder_inputs(torch.float64, grad=True, seed=5)
        read = list(ins)
        if sides is SIDES_SLOT:
            read[2] = ops.slot_rows(ins[2], perm)
        out = ops.message_reduce(rowptr, col, perm, read, sides, *SMOOTH, F, "sum", [], [], None)[0]
        g = torch.autograd.grad(out.square().sum(), ins, create_graph=True)
        results.append(list(torch.autograd.grad(sum(t.square().sum() for t in g), ins)))
    for u, v in zip(*results):
        same(u, v)


# ----------------------------------------------------------------------------- the cache
def _s(seed=0):
    rowptr, col, perm = _structure(seed=seed)
    return Structure(rowptr, col, perm, N_DST, 0, N_SRC - 1)


def test_cache_hits_the_same_tensor():
    s, a = _s(), torch.randn(E_, 3)
    before = S.info()
    r1 = S.slot_copy(s, a, "cpu")
    r2 = S.slot_copy(s, a, "cpu")
    assert r1 is r2
    assert torch.equal(r1, a[s.perm.long()])
    after = S.info()
    assert after["copies"] - before["copies"] == 1 and after["hits"] - before["hits"] == 1


@pytest.mark.parametrize("mode", ["off", "cpu"])
def test_cache_in_place_change_copies_again(mode):
    s, a = _s(), torch.randn(E_, 3)
    r1 = S.slot_copy(s, a, mode)
    a[4, 1] = 7.0  # moves the version counter
    r2 = S.slot_copy(s, a, mode)
    assert r2 is not r1 and torch.equal(r2, a[s.perm.long()])
    a.add_(1.0)
    assert torch.equal(S.slot_copy(s, a, mode), a[s.perm.long()])
    b = a.clone()  # another tensor, equal values: its own copy
    assert S.slot_copy(s, b, mode) is not S.slot_copy(s, a, mode)


def test_cache_write_behind_version_counter():
    """A write through .data (no version bump) is caught by the fingerprint in mode 'cpu'."""
    s, a = _s(), torch.randn(E_, 3)
    S.slot_copy(s, a, "cpu")
    v = a._version
    a.data[2, 0] = 123.0
    assert a._version == v  # (the write did not move it)
    before = S.info()["stale"]
    assert torch.equal(S.slot_copy(s, a, "cpu"), a[s.perm.long()])
    assert S.info()["stale"] == before + 1
    a.data.numpy()[0, 0] = -5.0
    assert torch.equal(S.slot_copy(s, a, "cpu"), a[s.perm.long()])


def test_cache_inference_tensor_never_cached():
    s = _s()
    with torch.inference_mode():
        a = torch.randn(E_, 3)
    before = S.info()["uncached"]
    r1, r2 = S.slot_copy(s, a, "off"), S.slot_copy(s, a, "off")
    assert r1 is not r2 and torch.equal(r1, a[s.perm.long()])
    assert S.info()["uncached"] == before + 2


def test_cache_drops_dead_tensors_and_is_bounded():
    s = _s()
    a = torch.randn(E_, 3)
    S.slot_copy(s, a, "off")
    assert len(s.extras["slot_rows"]) == 1
    del a
    gc.collect()
    assert len(s.extras["slot_rows"]) == 0
    keep = [torch.randn(E_, 2) for _ in range(S.MAX_COPIES + 3)]
    for t in keep:
        S.slot_copy(s, t, "off")
    assert len(s.extras["slot_rows"]) == S.MAX_COPIES


def test_cached_op_through_the_structure_cache():
    g = torch.Generator().manual_seed(6)
    src = torch.randint(0, N_SRC, (E_,), generator=g)
    dst = torch.randint(0, N_DST, (E_,), generator=g)
    ei = torch.stack([src, dst])
    a = torch.randn(E_, 4)
    out = torch.ops.gnncompile.cached_slot_rows(ei, N_DST, a, False, "")
    r, c, p = torch.ops.gnncompile.cached_csr(ei, N_DST, False, "")
    assert torch.equal(out, a[p.long()])
    assert torch.ops.gnncompile.cached_slot_rows(ei, N_DST, a, False, "") is out
    clone = torch.ops.gnncompile.cached_slot_rows(ei, N_DST, a, True, "")
    assert clone is not out and torch.equal(clone, out)
    with pytest.raises(ValueError, match="cached_slot_rows"):
        torch.ops.gnncompile.cached_slot_rows(ei, N_DST, a[:-1], False, "")
