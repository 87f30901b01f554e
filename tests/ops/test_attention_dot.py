"""gnncompile::attention_dot and its backward (native/cpu/attention_dot_core.h, TransformerConv's
dot-product attention): against the chain it fuses written with torch and PyG (key + lin_edge(edge
features), the scaled dot product, softmax, dropout, aggregation of value + lin_edge(edge features),
differentiated by autograd), against the pure-torch reference, gradcheck, empty rows, no edges,
bipartite sizes, determinism across thread counts, and bad input."""
from __future__ import annotations

import math

import pytest
import torch
from torch_geometric.utils import softmax as pyg_softmax

from gnncompile.ops import reference
from gnncompile.ops.structure import transpose_structure

from shared import attention_graph

ops = torch.ops.gnncompile


def _graph(N=60, M=50, E=600, seed=0, dtype=torch.int64):
    return attention_graph(N, M, E, seed, dtype)


def _inputs(N, M, E, H, C, De, dtype, seed=1):
    """q, k, v, edge features and lin_edge's weight [H * C, De] (None without edge features)."""
    g = torch.Generator().manual_seed(seed)

    def r(*shape):
        return torch.randn(*shape, generator=g, dtype=torch.float64).to(dtype).requires_grad_()

    q, k, v = r(M, H, C), r(N, H, C), r(N, H, C)
    return q, k, v, (r(E, De) if De else None), (r(H * C, De) if De else None)


def _chain(src, dst, M, q, k, v, ea, W, p, seed):
    """TransformerConv's message and aggregation as PyG computes them (edge order), the dropout by
    the dropout op."""
    H, C = q.shape[1:]
    key, val = k[src], v[src]
    if ea is not None:
        ee = (ea @ W.t()).view(-1, H, C)
        key = key + ee
        val = val + ee
    s = (q[dst] * key).sum(-1) / math.sqrt(C)
    alpha = pyg_softmax(s, dst, num_nodes=M)
    if p > 0:
        alpha = ops.dropout(alpha.contiguous(), p, seed)
    return torch.zeros(M, H, C, dtype=q.dtype).index_add(0, dst, val * alpha.unsqueeze(-1))


def _fused(csr, csc, q, k, v, ea, W, p, seed):
    """The same through attention_dot: qe = W_h^T q before, out + W_h out_e after."""
    H, C = q.shape[1:]
    qe = None if ea is None else torch.einsum("mhc,hcd->mhd", q, W.view(H, C, -1))
    out, out_e, stats = ops.attention_dot(*csr, q, k, v, qe, ea, 1 / math.sqrt(C), p, seed if p else None, [],
                                          *csc)
    if ea is not None:
        out = out + torch.einsum("mhd,hcd->mhc", out_e, W.view(H, C, -1))
    return out, out_e, stats


@pytest.mark.parametrize("dtype,tol", [(torch.float64, 1e-10), (torch.float32, 2e-5)])
@pytest.mark.parametrize("De", [0, 5])
@pytest.mark.parametrize("p", [0.0, 0.3])
@pytest.mark.parametrize("H", [1, 4])
def test_forward_and_gradients_equal_the_chain(dtype, tol, De, p, H):
    N, M, E, C = 60, 50, 600, 8
    src, dst, csr, csc = _graph(N, M, E)
    q, k, v, ea, W = _inputs(N, M, E, H, C, De, dtype)
    seed = torch.tensor(1234)
    want = _chain(src, dst, M, q, k, v, ea, W, p, seed)
    got, out_e, stats = _fused(csr, csc, q, k, v, ea, W, p, seed)
    assert got.shape == (M, H, C) and got.dtype == dtype and out_e.shape == (M, H, De)
    assert stats.shape == (M, 2, H) and stats.dtype == (torch.float64 if dtype == torch.float64 else torch.float32)
    scale = want.abs().max().item()
    torch.testing.assert_close(got, want, rtol=tol, atol=tol * scale)
    g = torch.randn_like(want)
    ins = [t for t in (q, k, v, ea, W) if t is not None]
    for a, b in zip(torch.autograd.grad(got, ins, g), torch.autograd.grad(want, ins, g)):
        torch.testing.assert_close(a, b, rtol=tol, atol=tol * max(b.abs().max().item(), 1.0))


def test_dropout_mask_is_the_dropout_ops_and_regenerated_in_backward():
    """Same seed, same outputs and gradients (the backward regenerates the mask); another seed,
    another result; the coefficients dropped are exactly the dropout op's zeros."""
    N, M, E, H, C, De = 40, 30, 3000, 2, 4, 3
    src, dst, csr, csc = _graph(N, M, E)
    q, k, v, ea, W = _inputs(N, M, E, H, C, De, torch.float64)
    qe = torch.einsum("mhc,hcd->mhd", q, W.view(H, C, De))
    outs = [ops.attention_dot(*csr, q, k, v, qe, ea, 0.5, 0.5, torch.tensor(s), [], *csc)[:2] for s in (1, 2, 1)]
    assert torch.equal(outs[0][0], outs[2][0]) and torch.equal(outs[0][1], outs[2][1])
    assert not torch.allclose(outs[0][0], outs[1][0])
    g, ge = torch.randn_like(outs[0][0]), torch.randn_like(outs[0][1])
    ga = torch.autograd.grad(outs[0], (q, k, v, ea, W), (g, ge), retain_graph=True)
    gc = torch.autograd.grad(outs[2], (q, k, v, ea, W), (g, ge))
    assert all(torch.equal(a, b) for a, b in zip(ga, gc))
    # the mask: with v one-hot per source (H = 1 block per source), out recovers each coefficient
    kept = ops.dropout(torch.ones(E, H, dtype=torch.float64), 0.5, torch.tensor(1)) > 0
    assert 0.45 < kept.double().mean().item() < 0.55
    onehot = torch.eye(N, dtype=torch.float64).unsqueeze(1).expand(N, H, N).contiguous()
    qq, kk = torch.zeros(M, H, N, dtype=torch.float64), torch.zeros(N, H, N, dtype=torch.float64)
    out, _, _ = ops.attention_dot(*csr, qq, kk, onehot, None, None, 1.0, 0.5, torch.tensor(1), [], *csc)
    n_kept = torch.zeros(M, H, N, dtype=torch.long)
    n_all = torch.zeros(M, H, N, dtype=torch.long)
    for h in range(H):
        hh = torch.full_like(dst, h)
        n_kept.index_put_((dst, hh, src), kept[:, h].long(), accumulate=True)
        n_all.index_put_((dst, hh, src), torch.ones_like(dst), accumulate=True)
    kept_any, only_dropped = n_kept > 0, (n_all > 0) & (n_kept == 0)
    assert (out[kept_any] > 0).all()


def _size(t):
    return max(1.0, t.abs().max().item()) if t.numel() else 1.0


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.bfloat16])
@pytest.mark.parametrize("index", [torch.int64, torch.int32])
@pytest.mark.parametrize("De", [0, 6])
def test_native_equals_the_reference(dtype, index, De):
    N, M, E, H, C = 40, 30, 300, 4, 8
    _, _, csr, csc = _graph(N, M, E, dtype=index)
    q, k, v, ea, _ = (t.detach() if t is not None else None for t in _inputs(N, M, E, H, C, De, dtype))
    qe = torch.randn(M, H, De, dtype=torch.float64).to(dtype) if De else None
    args = (q, k, v, qe, ea, 0.3, 0.25, torch.tensor(5))
    out, out_e, st = ops.attention_dot(*csr, *args, [], *csc)
    r_out, r_out_e, r_st = reference.attention_dot(*csr, *args, [])
    tol = {torch.float32: 1e-5, torch.float64: 1e-12, torch.bfloat16: 3e-2}[dtype]
    for a, b in ((out, r_out), (out_e, r_out_e), (st, r_st)):
        assert a.dtype == b.dtype and a.shape == b.shape
        torch.testing.assert_close(a, b, rtol=tol, atol=tol * _size(b))
    g = torch.randn(out.shape, dtype=torch.float64).to(dtype)
    ge = torch.randn(out_e.shape, dtype=torch.float64).to(dtype)
    got = ops.attention_dot_backward(*csr, *args, out, out_e, st, g, ge, [], *csc)
    want = reference.attention_dot_backward(*csr, *args, out, out_e, st, g, ge, [], *csc)
    assert len(got) == 5
    for a, b in zip(got, want):
        assert a.dtype == b.dtype and a.shape == b.shape
        torch.testing.assert_close(a, b, rtol=tol, atol=tol * _size(b))


@pytest.mark.parametrize("H,C,De", [(4, 8, 8), (4, 32, 16), (3, 16, 8), (5, 8, 0), (6, 24, 16), (4, 8, 5), (2, 12, 8)])
@pytest.mark.parametrize("p", [0.0, 0.25])
def test_wide_shapes_equal_the_reference(H, C, De, p):
    """float32 at the shapes of the kernels' 8-wide paths (C and De multiples of 8: the zoo's 4 x 8
    with 8 edge features, issue 25's 4 x 32 with 16; head counts not a multiple of 4 for the
    four-head horizontal sums' remainder) and next to them (C or De not a multiple of 8: the
    generic path), forward and backward, against the reference."""
    N, M, E = 50, 40, 700
    _, _, csr, csc = _graph(N, M, E)
    q, k, v, ea, _ = (t.detach() if t is not None else None for t in _inputs(N, M, E, H, C, De, torch.float32))
    qe = torch.randn(M, H, De) if De else None
    args = (q, k, v, qe, ea, 1 / math.sqrt(C), p, torch.tensor(7))
    out, out_e, st = ops.attention_dot(*csr, *args, [], *csc)
    want = reference.attention_dot(*csr, *args, [])
    for a, b in zip((out, out_e, st), want):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-5 * _size(b))
    g, ge = torch.randn(out.shape), torch.randn(out_e.shape)
    got = ops.attention_dot_backward(*csr, *args, out, out_e, st, g, ge, [], *csc)
    want = reference.attention_dot_backward(*csr, *args, out, out_e, st, g, ge, [], *csc)
    for a, b in zip(got, want):
        assert a.shape == b.shape
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-5 * _size(b))


@pytest.mark.parametrize("impl", ["native", "reference"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_backward_without_the_edge_features_gradient(impl, dtype):
    """grad_edge_attr=False (edge features that need no gradient): the edge features' gradient is
    [0, De] and not computed, the other gradients bit for bit those with it; autograd asks for it
    only where the edge features require a gradient."""
    N, M, E, H, C, De = 40, 30, 400, 4, 8, 8
    _, _, csr, csc = _graph(N, M, E)
    q, k, v, ea, _ = (t.detach() for t in _inputs(N, M, E, H, C, De, dtype))
    qe = torch.randn(M, H, De, dtype=dtype)
    args = (q, k, v, qe, ea, 0.35, 0.0, None)
    out, out_e, st = ops.attention_dot(*csr, *args, [], *csc)
    g, ge = torch.randn(out.shape, dtype=dtype), torch.randn(out_e.shape, dtype=dtype)
    bwd = ops.attention_dot_backward if impl == "native" else reference.attention_dot_backward
    full = bwd(*csr, *args, out, out_e, st, g, ge, [], *csc)
    part = bwd(*csr, *args, out, out_e, st, g, ge, [], *csc, False)
    assert full[4].shape == (E, De) and part[4].shape == (0, De) and part[4].dtype == dtype
    assert all(torch.equal(a, b) for a, b in zip(full[:4], part[:4]))
    # through autograd: the edge features' gradient where they require one, the others equal
    grads = []
    for need in (True, False):
        ts = [t.clone().requires_grad_() for t in (q, k, v, qe)]
        e = ea.clone().requires_grad_(need)
        o, oe, _ = ops.attention_dot(*csr, *ts, e, 0.35, 0.0, None, [], *csc)
        (o.square().sum() + oe.square().sum()).backward()
        grads.append([t.grad for t in ts] + [e.grad])
    assert grads[0][4] is not None and grads[0][4].shape == (E, De) and grads[1][4] is None
    assert all(torch.equal(a, b) for a, b in zip(grads[0][:4], grads[1][:4]))


@pytest.mark.parametrize("De", [0, 3])
def test_gradcheck_float64(De):
    """Every input the op differentiates (q, k, v, qe, edge features), both outputs."""
    N, M, E, H, C = 8, 6, 24, 2, 3
    _, _, csr, csc = _graph(N, M, E)
    q, k, v, ea, _ = _inputs(N, M, E, H, C, De, torch.float64)
    qe = torch.randn(M, H, De, dtype=torch.float64, requires_grad=True) if De else None
    ins = [t for t in (q, k, v, qe, ea) if t is not None]

    def f(*ts):
        q, k, v = ts[:3]
        qe, ea = (ts[3], ts[4]) if De else (None, None)
        out, out_e, _ = ops.attention_dot(*csr, q, k, v, qe, ea, 0.7, 0.0, None, [], *csc)
        return out, out_e

    assert torch.autograd.gradcheck(f, ins)


def test_gradcheck_float64_with_dropout():
    N, M, E, H, C, De = 8, 6, 24, 2, 3, 2
    _, _, csr, csc = _graph(N, M, E)
    q, k, v, ea, _ = _inputs(N, M, E, H, C, De, torch.float64)
    qe = torch.randn(M, H, De, dtype=torch.float64, requires_grad=True)

    def f(q, k, v, qe, ea):
        return ops.attention_dot(*csr, q, k, v, qe, ea, 0.7, 0.4, torch.tensor(9), [], *csc)[:2]

    assert torch.autograd.gradcheck(f, (q, k, v, qe, ea))


def test_bipartite_empty_rows_no_csc_and_no_edges():
    """M != N, destinations without in-edges (zero rows and zero q gradients), the backward
    building its own CSC; E = 0."""
    N, M, E, H, C, De = 30, 45, 150, 2, 4, 3
    src, dst, csr, csc = _graph(N, M, E)
    assert (torch.bincount(dst, minlength=M) == 0).any()
    q, k, v, ea, W = _inputs(N, M, E, H, C, De, torch.float64)
    out, _, _ = _fused(csr, (None, None, None), q, k, v, ea, W, 0.0, None)
    want = _chain(src, dst, M, q, k, v, ea, W, 0.0, None)
    torch.testing.assert_close(out, want, rtol=1e-10, atol=1e-10)
    g = torch.randn_like(out)
    ins = (q, k, v, ea, W)
    got = torch.autograd.grad(out, ins, g)
    for a, b in zip(got, torch.autograd.grad(want, ins, g)):
        torch.testing.assert_close(a, b, rtol=1e-10, atol=1e-10)
    empty = torch.bincount(dst, minlength=M) == 0
    assert torch.equal(out[empty], torch.zeros_like(out[empty]))
    assert torch.equal(got[0][empty], torch.zeros_like(got[0][empty]))
    # no edges at all, with and without edge features
    none = ops.build_csr(torch.zeros(0, dtype=torch.long), torch.zeros(0, dtype=torch.long), 4, 3)
    for de in (0, 2):
        k0 = torch.randn(3, 2, 2, requires_grad=True)
        qe0 = torch.randn(4, 2, de) if de else None
        ea0 = torch.randn(0, de, requires_grad=True) if de else None
        o, oe, s = ops.attention_dot(*none, torch.randn(4, 2, 2), k0, torch.randn(3, 2, 2), qe0, ea0, 1.0, 0.0,
                                     None, [])
        assert torch.equal(o, torch.zeros(4, 2, 2)) and torch.equal(s, torch.zeros(4, 2, 2))
        assert oe.shape == (4, 2, de)
        assert torch.equal(torch.autograd.grad(o.sum(), k0)[0], torch.zeros_like(k0))


def test_bits_do_not_depend_on_the_thread_count():
    N, M, E, H, C, De = 300, 300, 5000, 4, 8, 5
    _, _, csr, csc = _graph(N, M, E)
    q, k, v, ea, _ = _inputs(N, M, E, H, C, De, torch.float32)
    qe = torch.randn(M, H, De, requires_grad=True)
    threads = torch.get_num_threads()
    res = []
    try:
        for t in (1, 2):
            torch.set_num_threads(t)
            out, out_e, _ = ops.attention_dot(*csr, q, k, v, qe, ea, 0.35, 0.1, torch.tensor(3), [], *csc)
            res.append((out, out_e, *torch.autograd.grad((out, out_e), (q, k, v, qe, ea),
                                                         (torch.ones_like(out), torch.ones_like(out_e)))))
    finally:
        torch.set_num_threads(threads)
    assert all(torch.equal(a, b) for a, b in zip(*res))


def _bad(**over):
    N, M, E, H, C, De = 6, 5, 20, 2, 3, 4
    _, _, csr, csc = _graph(N, M, E)
    kw = dict(rowptr=csr[0], col=csr[1], perm=csr[2], q=torch.randn(M, H, C), k=torch.randn(N, H, C),
              v=torch.randn(N, H, C), qe=torch.randn(M, H, De), edge_attr=torch.randn(E, De), scale=0.5, p=0.0,
              seed=None)
    kw.update(over)
    return kw


@pytest.mark.parametrize("impl", ["native", "reference"])
@pytest.mark.parametrize("over,err,msg", [
    (dict(k=torch.randn(6, 6)), ValueError, "k must be"),
    (dict(q=torch.randn(6, 2, 3)), ValueError, "q must be"),
    (dict(v=torch.randn(6, 2, 4)), ValueError, "v must be"),
    (dict(edge_attr=torch.randn(19, 4)), ValueError, "edge_attr must be"),
    (dict(qe=torch.randn(5, 2, 3)), ValueError, "qe must be"),
    (dict(qe=None), ValueError, "come together"),
    (dict(q=torch.randn(5, 2, 3, dtype=torch.float64)), TypeError, "dtype"),
    (dict(p=1.0, seed=torch.tensor(1)), ValueError, "dropout p"),
    (dict(p=0.5), ValueError, "needs a seed"),
    (dict(scale=float("nan")), ValueError, "scale"),
    (dict(col=torch.full((20,), 9)), IndexError, "out of range"),
    (dict(perm=torch.full((20,), 20)), IndexError, "perm"),
])
def test_bad_input_is_a_clear_error(impl, over, err, msg):
    kw = _bad(**over)
    fn = ops.attention_dot if impl == "native" else reference.attention_dot
    with pytest.raises(err, match=msg):
        fn(*kw.values(), [])


def test_backward_refuses_a_csc_of_other_sizes_a_repeated_perm_and_a_second_derivative():
    N, M, E, H, C = 6, 5, 20, 2, 3
    _, _, csr, csc = _graph(N, M, E)
    q, k, v, _, _ = _inputs(N, M, E, H, C, 0, torch.float64)
    out, out_e, st = ops.attention_dot(*csr, q, k, v, None, None, 0.5, 0.0, None, [], *csc)
    g, ge = torch.randn_like(out), torch.zeros_like(out_e)
    bad_csc = transpose_structure(*csr, N + 1)
    with pytest.raises(ValueError, match="transpose"):
        ops.attention_dot_backward(*csr, q, k, v, None, None, 0.5, 0.0, None, out, out_e, st, g, ge, [], *bad_csc)
    rep = csr[2].clone()
    rep[1] = rep[0]
    with pytest.raises(IndexError, match="perm"):
        ops.attention_dot_backward(csr[0], csr[1], rep, q, k, v, None, None, 0.5, 0.0, None, out, out_e, st, g, ge,
                                   [], *csc)
    (gq,) = torch.autograd.grad(out, q, g, create_graph=True)
    with pytest.raises(RuntimeError, match="double backward"):
        torch.autograd.grad(gq.sum(), q)
