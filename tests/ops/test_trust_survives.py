"""Trust that survives (native/common/trust.h): a structure is validated at most once.

The native code counts every validation of a structure's contents
(:func:`gnncompile.ops.validation_count`). These tests read that counter: a structure that
build_csr made, that transpose_structure derived, that clone_structure copied, or that was
validated once, is never validated again, in whatever combination of its tensors an op reads
it; a compiled GAT or GraphSAGE validates nothing after its first training step, whatever the
inner compiler (inductor gets copies of every structure each step); and a tensor the record does
not know, or one changed in place since, is validated (the counter moves, a bad one raises)."""
from __future__ import annotations

import pytest
import torch

import gnncompile
from gnncompile.ops import hoisted, validation_count, validations_since
from gnncompile.ops.structure import cache_info as structure_cache_info

ops = torch.ops.gnncompile


@pytest.fixture(autouse=True)
def _native(native):
    """The counter is the native code's: without it nothing is validated natively."""


def _graph(n=60, e=500, seed=0):
    g = torch.Generator().manual_seed(seed)
    ei = torch.randint(0, n, (2, e), generator=g)
    return ei, torch.randn(n, 8, generator=g)


def _unknown(s):
    """Plain copies of a structure: the same values, nothing recorded about them."""
    return tuple(t.clone() for t in s)


def _every_combination(s, x, n):
    """The calls that read one CSR in different combinations of its tensors: the triple (spmm,
    edge_dot), rowptr + perm (edge_softmax and its backward), rowptr + perm + perm (the gather
    backward reads perm as its col), and the CSC triple."""
    rowptr, col, perm = s
    E = perm.numel()
    scores = torch.randn(E)
    ops.spmm(rowptr, col, perm, None, x, "sum", [])
    ops.spmm(rowptr, col, perm, torch.rand(E), x, "max", [])
    ops.spmm(rowptr, perm, perm, None, torch.randn(E, 3), "sum", [])
    out = ops.edge_softmax(rowptr, perm, scores, [])
    ops.edge_softmax_backward(rowptr, perm, out, torch.randn(E), [])
    ops.edge_dot(rowptr, col, perm, x, torch.randn(n, 8), 1, [])
    t = ops.transpose_structure(rowptr, col, perm, n)
    ops.spmm(*t, None, torch.randn(n, 8), "sum", [])
    ops.spmm(*t, torch.rand(E), torch.randn(n, 8), "mean", [])


# ----------------------------------------------------------------------------- ops
def test_an_unknown_structure_is_validated_once():
    ei, x = _graph()
    s = _unknown(ops.build_csr(ei[1], ei[0], 60, 60))
    mark = validation_count()
    ops.spmm(*s, None, x, "sum", [])
    assert validations_since(mark) >= 1  # rowptr's order and ends, perm's range (spmm reads no perm)
    mark = validation_count()
    ops.spmm(*s, None, x, "sum", [])
    assert validations_since(mark) == 0
    mark = validation_count()
    ops.edge_softmax(s[0], s[2], torch.randn(500), [])
    assert validations_since(mark) == 1  # perm's uniqueness: a bincount, once
    mark = validation_count()
    ops.edge_softmax(s[0], s[2], torch.randn(500), [])
    ops.edge_dot(*s, x, torch.randn(60, 8), 1, [])
    assert validations_since(mark) == 0


def test_built_structures_are_never_validated():
    ei, x = _graph(seed=1)
    s = ops.build_csr(ei[1], ei[0], 60, 60)
    mark = validation_count()
    _every_combination(s, x, 60)
    assert validations_since(mark) == 0


def test_one_record_vouches_for_every_combination():
    """The calls that used to evict each other's record (one entry held one col: the gather
    backward's spmm(rowptr, perm, perm) and spmm(rowptr, col, perm)) alternate freely: the
    record is per tensor."""
    ei, x = _graph(seed=2)
    s = _unknown(ops.build_csr(ei[1], ei[0], 60, 60))
    _every_combination(s, x, 60)  # validates what it must, once
    mark = validation_count()
    for _ in range(3):
        _every_combination(s, x, 60)
    assert validations_since(mark) == 0


def test_copies_and_the_transpose_keep_the_record():
    ei, x = _graph(seed=3)
    s = ops.build_csr(ei[1], ei[0], 60, 60)
    copies = ops.clone_structure(list(s))
    csc = ops.transpose_structure(*s, 60)
    csc_copies = ops.clone_structure(list(csc))
    mark = validation_count()
    _every_combination(copies, x, 60)
    ops.spmm(*csc_copies, None, torch.randn(60, 8), "sum", [])
    ops.edge_softmax(csc_copies[0], csc_copies[2], torch.randn(500), [])
    assert validations_since(mark) == 0
    # the same values copied by Tensor.clone carry nothing: validated (the counter can move)
    mark = validation_count()
    ops.spmm(*_unknown(s), None, x, "sum", [])
    ops.edge_softmax(*_unknown(csc)[::2], torch.randn(500), [])
    assert validations_since(mark) >= 2


def test_the_transpose_is_the_reference_one():
    from gnncompile.ops import reference

    for seed, index in ((4, torch.int64), (5, torch.int32)):
        ei, _ = _graph(seed=seed)
        s = ops.build_csr(ei[1].to(index), ei[0].to(index), 60, 60)
        for got, want in zip(ops.transpose_structure(*s, 70), reference.transpose_structure(*s, 70)):
            assert got.dtype == want.dtype and torch.equal(got, want)


def test_a_trusted_structure_changed_in_place_is_validated_again():
    ei, x = _graph(seed=6)
    rowptr, col, perm = ops.build_csr(ei[1], ei[0], 60, 60)
    scores = torch.randn(500)
    ops.edge_softmax(rowptr, perm, scores, [])
    # still a permutation after the write: validated again (the version counter moved), accepted
    perm[:2] = perm[:2].flip(0)
    mark = validation_count()
    ops.edge_softmax(rowptr, perm, scores, [])
    assert validations_since(mark) == 1
    mark = validation_count()
    ops.edge_softmax(rowptr, perm, scores, [])
    assert validations_since(mark) == 0
    # no longer one: refused with a clear error, however many times it was trusted before
    perm[1] = perm[0]
    for _ in range(2):
        with pytest.raises(IndexError, match="exactly once"):
            ops.edge_softmax(rowptr, perm, scores, [])
    rowptr[5] = rowptr[6] + 1
    with pytest.raises(ValueError, match="rowptr must be non-decreasing"):
        ops.spmm(rowptr, col, torch.arange(500), None, x, "sum", [])
    # a copy inherits the record of the tensor it was made from, and loses it the same way
    r2, c2, p2 = ops.clone_structure(list(ops.build_csr(ei[1], ei[0], 60, 60)))
    c2[0] = 60
    with pytest.raises(IndexError, match="source index out of range"):
        ops.spmm(r2, c2, p2, None, x, "sum", [])


# ----------------------------------------------------------------------------- compiled models
class _TransformerE(torch.nn.Module):
    """Two TransformerConv layers with edge features (the fused attention_dot op)."""

    def __init__(self, num_edges):
        from torch_geometric.nn import TransformerConv

        super().__init__()
        self.register_buffer("edge_attr", torch.randn(num_edges, 8, generator=torch.Generator().manual_seed(3)))
        self.conv1 = TransformerConv(16, 8, heads=4, edge_dim=8)
        self.conv2 = TransformerConv(32, 4, heads=1, edge_dim=8)

    def forward(self, x, edge_index):
        return self.conv2(torch.relu(self.conv1(x, edge_index, self.edge_attr)), edge_index, self.edge_attr)


def _model(name, num_edges):
    from torch_geometric.nn.models import GAT, GraphSAGE

    torch.manual_seed(0)
    if name == "TransformerE":
        return _TransformerE(num_edges)
    if name in ("GAT", "GATv2"):
        return GAT(16, 32, 2, 4, heads=4, v2=name == "GATv2")
    return GraphSAGE(16, 32, 2, 4)


@pytest.mark.parametrize("inner", [None, "eager", "inductor"], ids=["default", "eager", "inductor"])
@pytest.mark.parametrize("name", ["GAT", "SAGE", "GATv2", "TransformerE"])
def test_compiled_training_validates_nothing_after_the_first_step(name, inner):
    from gnncompile.data.synthetic import power_law_graph

    ei = power_law_graph(3000, 30_000, seed=1)
    g = torch.Generator().manual_seed(0)
    x = torch.randn(3000, 16, generator=g)
    y = torch.randint(0, 4, (3000,), generator=g)
    model = _model(name, ei.size(1))
    # a fresh Dynamo cache: the parametrisations compile the same forward code many times, and
    # past Dynamo's recompile limit a frame runs eagerly
    torch._dynamo.reset()
    # the speed guard off: at this size it may keep a model eager, and the test is about the
    # compiled graph's structures
    off = {"choices": {"guard": "off"}}
    m = (gnncompile.compile(model, settings=off) if inner is None
         else gnncompile.compile(model, inner=inner, settings=off))
    opt = torch.optim.Adam(model.parameters(), lr=0.01)

    def step():
        opt.zero_grad()
        loss = torch.nn.functional.cross_entropy(m(x, ei), y)
        loss.backward()
        opt.step()
        return float(loss.detach())

    step()
    def served():  # structures handed out by the hoisted regions or by the structure cache
        return hoisted.hoist_info()["hits"] + structure_cache_info()["hits"]

    mark, hits = validation_count(), served()
    losses = [step() for _ in range(10)]
    assert validations_since(mark) == 0
    # the steps ran the compiled graph: its structures were served from a cache
    assert served() - hits >= 10
    assert losses[-1] < losses[0]
