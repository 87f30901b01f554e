"""Property-based tests: random graphs, spmm == PyG scatter, edge_softmax == PyG softmax."""
from __future__ import annotations

import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from gnncompile.ops import edge_softmax, spmm

SETTINGS = settings(max_examples=60, deadline=None,
                    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])


@st.composite
def graphs(draw, max_nodes=60, max_edges=300):
    """(edge_index, num_src, num_dst): num_dst None (= num_src) or a bipartite count."""
    num_src = draw(st.integers(1, max_nodes))
    bipartite = draw(st.booleans())
    num_dst = draw(st.integers(1, max_nodes)) if bipartite else None
    M = num_src if num_dst is None else num_dst
    E = draw(st.integers(0, max_edges))
    src = draw(st.lists(st.integers(0, num_src - 1), min_size=E, max_size=E))
    dst = draw(st.lists(st.integers(0, M - 1), min_size=E, max_size=E))
    index_dtype = draw(st.sampled_from([torch.int64, torch.int32]))
    ei = torch.tensor([src, dst], dtype=index_dtype).reshape(2, E)
    return ei, num_src, num_dst


@SETTINGS
@given(graph=graphs(), reduce=st.sampled_from(["sum", "mean", "max", "min"]),
       weight_mode=st.sampled_from(["none", "edge", "head"]), heads=st.integers(1, 3),
       channels=st.integers(1, 3), dtype=st.sampled_from([torch.float32, torch.float64]),
       seed=st.integers(0, 2**31 - 1))
def test_spmm_equals_pyg_scatter(h, graph, reduce, weight_mode, heads, channels, dtype, seed):
    ei, N, num_dst = graph
    g = torch.Generator().manual_seed(seed)
    x = h.make_x(weight_mode, N, heads, channels, dtype, g)  # F = heads * channels in 1..9
    w = h.make_weight(weight_mode, ei.size(1), heads, dtype, g)
    out = spmm(ei, x, w, reduce=reduce, num_dst=num_dst)
    exp = h.expected_spmm(ei, x, w, reduce, num_dst)
    h.assert_close(out, exp, dtype, msg=f"{reduce} {weight_mode} N={N} num_dst={num_dst} E={ei.size(1)}")


@SETTINGS
@given(graph=graphs(max_nodes=30, max_edges=120), reduce=st.sampled_from(["sum", "mean"]),
       weight_mode=st.sampled_from(["none", "edge", "head"]), seed=st.integers(0, 2**31 - 1))
def test_spmm_gradients_equal_pyg(h, graph, reduce, weight_mode, seed):
    ei, N, num_dst = graph
    g = torch.Generator().manual_seed(seed)
    x = h.make_x(weight_mode, N, 2, 3, torch.float64, g).requires_grad_()
    w = h.make_weight(weight_mode, ei.size(1), 2, torch.float64, g)
    params = [x] if w is None else [x, w.requires_grad_()]
    out = spmm(ei, x, w, reduce=reduce, num_dst=num_dst)
    exp = h.expected_spmm(ei, x, w, reduce, num_dst, upcast=False)
    go = torch.randn(out.shape, generator=g, dtype=torch.float64)
    got = torch.autograd.grad(out, params, go)
    want = torch.autograd.grad(exp, params, go)
    for a, b in zip(got, want):
        torch.testing.assert_close(a, b)


@SETTINGS
@given(graph=graphs(), shape=st.sampled_from([(), (1,), (3,), (2, 2)]),
       dtype=st.sampled_from([torch.float32, torch.float64, torch.bfloat16]),
       scale=st.sampled_from([1.0, 10.0, 100.0]), seed=st.integers(0, 2**31 - 1))
def test_edge_softmax_equals_pyg_softmax(h, graph, shape, dtype, scale, seed):
    ei, N, num_dst = graph
    g = torch.Generator().manual_seed(seed)
    scores = (scale * torch.randn((ei.size(1),) + shape, generator=g, dtype=torch.float64)).to(dtype)
    if num_dst is not None and ei.size(1) > 0:
        num_dst = max(num_dst, int(ei[1].max()) + 1)
    out = edge_softmax(ei, scores, num_dst=num_dst)
    exp = h.expected_softmax(ei, scores, num_dst)
    h.assert_close(out, exp, dtype, msg=f"N={N} num_dst={num_dst} E={ei.size(1)}")
    if dtype == torch.float64 and ei.size(1) > 0:
        s1 = scores.clone().requires_grad_()
        s2 = scores.clone().requires_grad_()
        go = torch.randn(scores.shape, generator=g, dtype=torch.float64)
        (a,) = torch.autograd.grad(edge_softmax(ei, s1, num_dst=num_dst), s1, go)
        (b,) = torch.autograd.grad(h.expected_softmax(ei, s2, num_dst, upcast=False), s2, go)
        torch.testing.assert_close(a, b)
