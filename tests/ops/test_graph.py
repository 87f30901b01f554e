"""Graph structure: build_csr and the structure cache of gnncompile.ops.structure."""
from __future__ import annotations

import gc
import weakref

import pytest
import torch

from gnncompile.ops import structure
from gnncompile.ops import reference, spmm, edge_softmax, transpose_structure

INDEX_DTYPES = (torch.int64, torch.int32)
ops = torch.ops.gnncompile


def _counts():
    info = structure.cache_info()
    return {k: info[k] for k in ("entries", "builds", "hits")}


def _expected_csr(dst, src, num_dst):
    perm = torch.argsort(dst.long(), stable=True)
    counts = torch.bincount(dst.long(), minlength=num_dst)
    rowptr = torch.zeros(num_dst + 1, dtype=torch.long)
    rowptr[1:] = torch.cumsum(counts, 0)
    return rowptr.to(dst.dtype), src[perm], perm.to(dst.dtype)


@pytest.mark.parametrize("impl", ["op", "reference"])
@pytest.mark.parametrize("index_dtype", INDEX_DTYPES, ids=str)
@pytest.mark.parametrize("N,E,num_dst", [(1, 0, 1), (1, 5, 1), (10, 40, 10), (30, 500, 12), (9, 60, 25)])
def test_build_csr_is_a_stable_sort_by_destination(h, impl, index_dtype, N, E, num_dst):
    g = torch.Generator().manual_seed(N * 1000 + E)
    ei = h.random_graph(N, E, num_dst, generator=g, index_dtype=index_dtype)
    fn = ops.build_csr if impl == "op" else reference.build_csr
    rowptr, col, perm = fn(ei[1], ei[0], num_dst, N)
    erowptr, ecol, eperm = _expected_csr(ei[1], ei[0], num_dst)
    for name, a, b in (("rowptr", rowptr, erowptr), ("col", col, ecol), ("perm", perm, eperm)):
        assert a.dtype == index_dtype, name
        assert torch.equal(a, b), f"{name}: {a.tolist()} != {b.tolist()}"


def test_build_csr_by_hand():
    dst = torch.tensor([2, 0, 2, 1, 0, 2])
    src = torch.tensor([5, 4, 3, 2, 1, 0])
    rowptr, col, perm = ops.build_csr(dst, src, 4, 6)
    assert rowptr.tolist() == [0, 2, 3, 6, 6]
    assert perm.tolist() == [1, 4, 3, 0, 2, 5]
    assert col.tolist() == [4, 1, 2, 5, 3, 0]


@pytest.mark.parametrize("index_dtype", INDEX_DTYPES, ids=str)
def test_transpose_structure_is_csr_by_source(h, index_dtype):
    g = torch.Generator().manual_seed(1)
    ei = h.random_graph(11, 60, 7, generator=g, index_dtype=index_dtype)
    rowptr, col, perm = ops.build_csr(ei[1], ei[0], 7, 11)
    rowptr_t, col_t, perm_t = transpose_structure(rowptr, col, perm, 11)
    # by source: rows are sources, col_t the destinations, perm_t original edge ids
    e_rowptr, _, e_perm = _expected_csr(ei[0], ei[1], 11)
    assert torch.equal(rowptr_t, e_rowptr)
    # within one source, edges may come in any order; compare as sets of edge ids per row
    for r in range(11):
        a, b = rowptr_t[r].item(), rowptr_t[r + 1].item()
        assert sorted(perm_t[a:b].tolist()) == sorted(e_perm[a:b].tolist())
    assert torch.equal(col_t, ei[1][perm_t.long()])
    assert torch.equal(ei[0][perm_t.long()], torch.repeat_interleave(
        torch.arange(11, dtype=index_dtype), (rowptr_t[1:] - rowptr_t[:-1]).long()))


# ----------------------------------------------------------------------------- cache
def test_structure_matches_build_csr(fresh_cache, h):
    g = torch.Generator().manual_seed(2)
    ei = h.random_graph(8, 30, generator=g)
    s = structure.structure(ei, 8)
    rowptr, col, perm = _expected_csr(ei[1], ei[0], 8)
    assert torch.equal(s.rowptr, rowptr) and torch.equal(s.col, col) and torch.equal(s.perm, perm)
    assert s.num_dst == 8 and s.num_edges == 30
    assert s.src_max == int(ei[0].max()) and s.src_min == int(ei[0].min())


def test_cache_builds_once_per_edge_index(fresh_cache, h):
    g = torch.Generator().manual_seed(3)
    ei = h.random_graph(10, 40, generator=g)
    x = torch.randn(10, 4, generator=g)
    assert _counts() == {"entries": 0, "builds": 0, "hits": 0}
    first = spmm(ei, x)
    assert structure.cache_info()["builds"] == 1
    for reduce in ("sum", "mean", "max", "min"):
        spmm(ei, x, reduce=reduce)
    edge_softmax(ei, torch.randn(40, generator=g), num_dst=10)
    info = structure.cache_info()
    assert info["builds"] == 1 and info["hits"] == 5 and info["entries"] == 1
    assert structure.structure(ei, 10) is structure.structure(ei, 10)
    # an equal but distinct tensor is a new entry (keys are identities, not contents)
    second = spmm(ei.clone(), x)
    assert structure.cache_info()["builds"] == 2
    assert torch.equal(first, second)


def test_structure_reused_across_layers(fresh_cache, h):
    g = torch.Generator().manual_seed(4)
    ei = h.random_graph(10, 40, generator=g)
    x = torch.randn(10, 4, generator=g, requires_grad=True)
    w = torch.randn(40, generator=g, requires_grad=True)
    out = spmm(ei, spmm(ei, x, w).relu(), w, reduce="mean")
    out.sum().backward()
    assert structure.cache_info()["builds"] == 1
    assert structure.cache_info()["hits"] == 1
    # the transposed (by-source) structure is cached on the structure too
    s = structure.structure(ei, 10)
    assert 10 in s.csc
    t = s.csc[10]
    assert s.transposed(10) is t


def test_different_num_dst_gives_separate_structures(fresh_cache, h):
    ei = torch.tensor([[0, 1, 2], [0, 1, 1]])
    x = torch.randn(3, 2)
    a = spmm(ei, x, num_dst=2)
    b = spmm(ei, x, num_dst=5)
    c = spmm(ei, x)
    assert a.shape == (2, 2) and b.shape == (5, 2) and c.shape == (3, 2)
    info = structure.cache_info()
    assert info["builds"] == 3 and info["entries"] == 1
    s2, s5 = structure.structure(ei, 2), structure.structure(ei, 5)
    assert s2 is not s5 and s2.rowptr.numel() == 3 and s5.rowptr.numel() == 6
    assert structure.cache_info()["builds"] == 3
    torch.testing.assert_close(b[:2], a)
    assert torch.equal(b[2:], torch.zeros(3, 2))


@pytest.mark.parametrize("how", ["setitem", "add_", "copy_", "view"])
def test_in_place_change_is_noticed(fresh_cache, h, how):
    ei = torch.tensor([[0, 1, 2, 3], [1, 2, 3, 0]])
    x = torch.arange(4.0).view(4, 1)
    before = spmm(ei, x)
    assert structure.cache_info()["builds"] == 1
    if how == "setitem":
        ei[0, 0] = 3
    elif how == "add_":
        ei[1].add_(1).remainder_(4)
    elif how == "copy_":
        ei.copy_(torch.tensor([[3, 1, 2, 3], [1, 2, 3, 0]]))
    else:
        row = ei[0]  # a view shares the version counter with its base
        row[0] = 3
    after = spmm(ei, x)
    assert structure.cache_info()["builds"] == 2
    torch.testing.assert_close(after, h.expected_spmm(ei, x))
    assert not torch.equal(before, after)
    # and then it is cached again
    spmm(ei, x)
    assert structure.cache_info()["builds"] == 2


def test_in_place_change_is_noticed_by_edge_softmax(fresh_cache, h):
    ei = torch.tensor([[0, 1, 2, 3], [0, 0, 1, 1]])
    s = torch.tensor([0.0, 1.0, 2.0, 3.0])
    edge_softmax(ei, s)
    ei[1, 1] = 1
    torch.testing.assert_close(edge_softmax(ei, s), h.expected_softmax(ei, s))
    assert structure.cache_info()["builds"] == 2


def test_cache_does_not_keep_edge_index_alive(fresh_cache, h):
    g = torch.Generator().manual_seed(5)
    x = torch.randn(10, 3, generator=g, requires_grad=True)
    ei = h.random_graph(10, 40, generator=g)
    ref = weakref.ref(ei)
    out = spmm(ei, x)  # the output's autograd graph must not hold edge_index either
    out2 = spmm(ei, x, reduce="max")
    assert len(fresh_cache) == 1
    del ei
    gc.collect()
    assert ref() is None, "edge_index is still referenced after del"
    assert len(fresh_cache) == 0 and structure.cache_info()["entries"] == 0
    (out.sum() + out2.sum()).backward()  # the structure outlives edge_index where it is needed
    assert x.grad is not None and torch.isfinite(x.grad).all()


def test_many_temporary_edge_indices_do_not_accumulate(fresh_cache, h):
    x = torch.randn(6, 2)
    for i in range(50):
        spmm(torch.tensor([[i % 6, 1], [2, (i + 1) % 6]]), x)
    gc.collect()
    assert structure.cache_info()["entries"] <= 1
    assert structure.cache_info()["builds"] == 50


def test_id_reuse_does_not_return_a_stale_structure(fresh_cache, h):
    # a new tensor may get the id of a dead one: the cache must not hand back the old CSR
    x = torch.randn(5, 1)
    for i in range(30):
        ei = torch.tensor([[i % 5, (i + 2) % 5], [(i + 1) % 5, (i + 3) % 5]])
        torch.testing.assert_close(spmm(ei, x), h.expected_spmm(ei, x))
        del ei


def test_clear_cache(fresh_cache, h):
    ei = torch.tensor([[0, 1], [1, 0]])
    spmm(ei, torch.randn(2, 2))
    assert structure.cache_info()["entries"] == 1
    structure.clear_cache()
    assert _counts() == {"entries": 0, "builds": 0, "hits": 0}
    spmm(ei, torch.randn(2, 2))
    assert structure.cache_info()["builds"] == 1
