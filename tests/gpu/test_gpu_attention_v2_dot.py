"""CUDA kernels of gnncompile::attention_v2 (GATv2) and gnncompile::attention_dot
(TransformerConv), forward and backward, against the CPU kernels (the same inputs, .cpu()): float32
and float64, several heads, head widths below and above a warp, with and without the edge term /
edge features, dropout (the CPU's mask, bit for bit), rows without edges, no edges, int32 and int64
indices; determinism (two runs bit for bit), gradcheck in float64, bad input; and compiled GATv2Conv
/ TransformerConv(edge_dim) models fused on CUDA (GNNCOMPILE_CUDA_UNVERIFIED's choice) against eager,
and left unfused without it. Mirrors tests/ops/test_attention_v2.py and test_attention_dot.py.

Skipped unless a GPU is visible and the extension was built with its CUDA kernels."""
from __future__ import annotations

import math

import pytest
import torch

import gnncompile
from gnncompile.ops.schemas import ops
from gnncompile.ops.structure import transpose_structure
from test_gpu_ops import DEV, HAS_CUDA_KERNELS, close, cpu

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not HAS_CUDA_KERNELS, reason="needs a CUDA device and gnncompile built with CUDA kernels"),
]

INDEX = [torch.int64, torch.int32]


def case_graph(N=40, M=50, E=400, seed=0, index=torch.int64):
    """Edges from N sources to M destinations with a hub (destination 0 takes ~40%) and
    destinations 45.. receiving nothing; the CSR and CSC on CUDA (built on the CPU, moved: the CUDA
    kernels validate them)."""
    g = torch.Generator().manual_seed(seed)
    src = torch.randint(0, N, (E,), generator=g)
    dst = torch.randint(0, M - 5, (E,), generator=g)
    dst[torch.rand(E, generator=g) < 0.4] = 0
    csr = ops.build_csr(dst.to(index), src.to(index), M, N)
    csc = transpose_structure(*csr, N)
    return [t.to(DEV) for t in csr], [t.to(DEV) for t in csc]


def rnd(g, dtype, *shape, scale=1.0):
    return (torch.randn(*shape, generator=g, dtype=torch.float64) * scale).to(dtype).to(DEV)


def grad_close(a, b, dtype):
    """Gradients: sums over many edges (a hub), at a tolerance scaled by the tensor."""
    close(a, b, dtype, scale=4.0 * max(1.0, b.double().abs().max().item() if b.numel() else 1.0))


def empty_rows(csr):
    return (csr[0][1:] == csr[0][:-1]).cpu()


# =============================================================================== attention_v2
def v2_inputs(dtype, N, M, E, H, C, edge, seed=1):
    g = torch.Generator().manual_seed(seed)
    return rnd(g, dtype, N, H, C), rnd(g, dtype, M, H, C), rnd(g, dtype, H, C), \
        (rnd(g, dtype, E, H, C, scale=0.5) if edge else None)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("index", INDEX)
@pytest.mark.parametrize("edge", [False, True])
@pytest.mark.parametrize("p", [0.0, 0.3])
@pytest.mark.parametrize("H,C", [(4, 8), (3, 5), (1, 70), (2, 33)])
def test_attention_v2_matches_cpu(dtype, index, edge, p, H, C):
    """Forward (out, stats) and backward (x_l, x_r, att, e_term) against the CPU kernel, for heads
    narrower than a warp, one head of 70 channels (three sign words, features in two passes) and
    33 (a ballot over one lane)."""
    csr, csc = case_graph(index=index)
    N, M, E = csc[0].numel() - 1, csr[0].numel() - 1, csr[1].numel()
    x_l, x_r, att, e = v2_inputs(dtype, N, M, E, H, C, edge)
    args = (x_l, x_r, att, e, 0.2, p, torch.tensor(1234) if p else None)
    out, st = ops.attention_v2(*csr, *args, [], *csc)
    acc = torch.float64 if dtype == torch.float64 else torch.float32
    assert out.device.type == "cuda" and out.shape == (M, H, C) and out.dtype == dtype
    assert st.device.type == "cuda" and st.shape == (M, 2, H) and st.dtype == acc
    c_out, c_st = ops.attention_v2(*cpu(*csr), *cpu(*args), [], *cpu(*csc))
    close(out.cpu(), c_out, dtype)
    close(st.cpu(), c_st, dtype)
    empty = empty_rows(csr)
    assert empty.any()
    assert torch.equal(out.cpu()[empty], torch.zeros_like(c_out[empty]))
    assert torch.equal(st.cpu()[empty], torch.zeros_like(c_st[empty]))

    g = rnd(torch.Generator().manual_seed(9), dtype, M, H, C)
    got = ops.attention_v2_backward(*csr, *args, out, st, g, [], *csc)
    want = ops.attention_v2_backward(*cpu(*csr), *cpu(*args), out.cpu(), st.cpu(), g.cpu(), [], *cpu(*csc))
    for a, b in zip(got, want):
        assert a.device.type == "cuda" and a.dtype == b.dtype == dtype and a.shape == b.shape
        grad_close(a.cpu(), b, dtype)
    assert got[2].shape == att.shape
    assert got[3].shape == ((E, H, C) if edge else (0, H, C))
    assert torch.equal(got[1].cpu()[empty], torch.zeros_like(want[1][empty]))


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_attention_v2_dropout_mask_is_the_cpus(dtype):
    """One edge per destination row: alpha = 1, so out = keep / (1 - p) * x_l[src] with x_l = 1
    shows the mask: CUDA's equals the CPU's and the dropout op's for the [E, H] coefficients."""
    N, E, H, C, p = 50, 3000, 4, 2, 0.3
    gen = torch.Generator().manual_seed(3)
    src = torch.randint(0, N, (E,), generator=gen)
    dst = torch.randperm(E, generator=gen)  # row i's edge id is not i
    x_l = torch.ones(N, H, C, dtype=dtype)
    x_r, att = torch.randn(E, H, C, generator=gen).to(dtype), torch.randn(H, C, generator=gen).to(dtype)
    seed = torch.tensor(77)
    csr_c = ops.build_csr(dst, src, E, N)
    out_c, _ = ops.attention_v2(*csr_c, x_l, x_r, att, None, 0.2, p, seed, [])
    out_g, _ = ops.attention_v2(*[t.to(DEV) for t in csr_c], x_l.to(DEV), x_r.to(DEV), att.to(DEV), None, 0.2, p,
                                seed, [])
    assert torch.equal(out_g.cpu(), out_c)
    kept = ops.dropout(torch.ones(E, H, dtype=torch.float64), p, seed) != 0  # edge order
    assert torch.equal(out_c[:, :, 0] != 0, kept[csr_c[2].long()])
    assert 0.25 < 1 - kept.double().mean().item() < 0.35


def test_attention_v2_no_edges():
    csr = [t.to(DEV) for t in ops.build_csr(torch.zeros(0, dtype=torch.long), torch.zeros(0, dtype=torch.long), 4, 3)]
    csc = transpose_structure(*csr, 3)
    for e in (None, torch.randn(0, 2, 5, device=DEV)):
        args = (torch.randn(3, 2, 5, device=DEV), torch.randn(4, 2, 5, device=DEV), torch.randn(2, 5, device=DEV), e,
                0.2, 0.3, torch.tensor(1))
        out, st = ops.attention_v2(*csr, *args, [], *csc)
        assert torch.equal(out.cpu(), torch.zeros(4, 2, 5)) and torch.equal(st.cpu(), torch.zeros(4, 2, 2))
        gl, gr, ga, ge = ops.attention_v2_backward(*csr, *args, out, st, torch.randn(4, 2, 5, device=DEV), [], *csc)
        assert torch.equal(gl.cpu(), torch.zeros(3, 2, 5)) and torch.equal(gr.cpu(), torch.zeros(4, 2, 5))
        assert torch.equal(ga.cpu(), torch.zeros(2, 5)) and ge.shape == (0, 2, 5) and ge.device.type == "cuda"


def test_attention_v2_is_deterministic_and_gradchecks():
    from gnncompile.data.synthetic import power_law_graph

    ei = power_law_graph(2000, 60_000, seed=2)
    csr = [t.to(DEV) for t in ops.build_csr(ei[1], ei[0], 2000, 2000)]
    csc = transpose_structure(*csr, 2000)
    gen = torch.Generator().manual_seed(0)
    x_l, x_r, att, e = v2_inputs(torch.float32, 2000, 2000, ei.shape[1], 4, 16, True)
    g = torch.randn(2000, 4, 16, generator=gen).to(DEV)
    runs = []
    for _ in range(2):
        args = (x_l, x_r, att, e, 0.2, 0.1, torch.tensor(3))
        out, st = ops.attention_v2(*csr, *args, [], *csc)
        runs.append((out, st, *ops.attention_v2_backward(*csr, *args, out, st, g, [], *csc)))
    for a, b in zip(*runs):
        assert torch.equal(a, b)
    # float64 gradcheck through the autograd registration (the CUDA backward), dropout on
    csr, csc = case_graph(N=9, M=17, E=40, seed=5)
    ins = tuple(t.requires_grad_() for t in v2_inputs(torch.float64, 9, 17, 40, 2, 3, True))
    for p in (0.0, 0.3):
        def f(*t):
            return ops.attention_v2(*csr, *t, 0.2, p, torch.tensor(11) if p else None, [], *csc)[0]

        assert torch.autograd.gradcheck(f, ins)


def test_attention_v2_bad_input_raises():
    csr, csc = case_graph()
    N, M, E = csc[0].numel() - 1, csr[0].numel() - 1, csr[1].numel()
    x_l, x_r, att, e = v2_inputs(torch.float32, N, M, E, 2, 4, True)
    with pytest.raises(ValueError, match="x_r is on cpu"):
        ops.attention_v2(*csr, x_l, x_r.cpu(), att, e, 0.2, 0.0, None, [])
    with pytest.raises(ValueError, match="needs a seed, one int64 on the CPU"):
        ops.attention_v2(*csr, x_l, x_r, att, e, 0.2, 0.3, torch.tensor(1, device=DEV), [])
    bad = csr[1].clone()
    bad[3] = N + 7
    with pytest.raises(IndexError, match="out of range"):
        ops.attention_v2(csr[0], bad, csr[2], x_l, x_r, att, e, 0.2, 0.0, None, [])
    out, st = ops.attention_v2(*csr, x_l, x_r, att, e, 0.2, 0.0, None, [], *csc)
    rep = csr[2].clone()
    rep[1] = rep[0]
    with pytest.raises(IndexError, match="perm"):
        ops.attention_v2_backward(csr[0], csr[1], rep, x_l, x_r, att, e, 0.2, 0.0, None, out, st, torch.ones_like(out),
                                  [], *csc)
    torch.cuda.synchronize()  # the device survived
    assert torch.isfinite(ops.attention_v2(*csr, x_l, x_r, att, e, 0.2, 0.0, None, [])[0]).all()


# =============================================================================== attention_dot
def dot_inputs(dtype, N, M, E, H, C, De, seed=1):
    """q, k, v and (with De) qe and edge features."""
    g = torch.Generator().manual_seed(seed)
    q, k, v = rnd(g, dtype, M, H, C), rnd(g, dtype, N, H, C), rnd(g, dtype, N, H, C)
    return q, k, v, (rnd(g, dtype, M, H, De) if De else None), (rnd(g, dtype, E, De) if De else None)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("index", INDEX)
@pytest.mark.parametrize("De", [0, 5, 37])
@pytest.mark.parametrize("p", [0.0, 0.3])
@pytest.mark.parametrize("H,C", [(4, 8), (1, 70), (3, 3)])
def test_attention_dot_matches_cpu(dtype, index, De, p, H, C):
    """Forward (out, out_e, stats) and backward (q, k, v, qe, edge_attr) against the CPU kernel."""
    csr, csc = case_graph(index=index)
    N, M, E = csc[0].numel() - 1, csr[0].numel() - 1, csr[1].numel()
    args = (*dot_inputs(dtype, N, M, E, H, C, De), 1 / math.sqrt(C), p, torch.tensor(99) if p else None)
    out, out_e, st = ops.attention_dot(*csr, *args, [], *csc)
    assert out.device.type == "cuda" and out.shape == (M, H, C) and out_e.shape == (M, H, De)
    c_out, c_out_e, c_st = ops.attention_dot(*cpu(*csr), *cpu(*args), [], *cpu(*csc))
    for a, b in ((out, c_out), (out_e, c_out_e), (st, c_st)):
        assert a.dtype == b.dtype
        close(a.cpu(), b, dtype)
    empty = empty_rows(csr)
    assert torch.equal(out.cpu()[empty], torch.zeros_like(c_out[empty]))
    assert torch.equal(st.cpu()[empty], torch.zeros_like(c_st[empty]))

    gen = torch.Generator().manual_seed(9)
    g, ge = rnd(gen, dtype, M, H, C), rnd(gen, dtype, M, H, De)
    got = ops.attention_dot_backward(*csr, *args, out, out_e, st, g, ge, [], *csc)
    want = ops.attention_dot_backward(*cpu(*csr), *cpu(*args), *cpu(out, out_e, st, g, ge), [], *cpu(*csc))
    for a, b in zip(got, want):
        assert a.device.type == "cuda" and a.dtype == b.dtype == dtype and a.shape == b.shape
        grad_close(a.cpu(), b, dtype)
    assert got[3].shape == (M, H, De) and got[4].shape == (E, De)
    assert torch.equal(got[0].cpu()[empty], torch.zeros_like(want[0][empty]))


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_attention_dot_dropout_mask_is_the_cpus(dtype):
    """One edge per destination row with v = 1: out shows the mask, CUDA's equal to the CPU's."""
    N, E, H, C, p = 50, 3000, 4, 2, 0.3
    gen = torch.Generator().manual_seed(3)
    src = torch.randint(0, N, (E,), generator=gen)
    dst = torch.randperm(E, generator=gen)
    q, k = torch.randn(E, H, C, generator=gen).to(dtype), torch.randn(N, H, C, generator=gen).to(dtype)
    v = torch.ones(N, H, C, dtype=dtype)
    seed = torch.tensor(5)
    csr_c = ops.build_csr(dst, src, E, N)
    out_c = ops.attention_dot(*csr_c, q, k, v, None, None, 0.5, p, seed, [])[0]
    out_g = ops.attention_dot(*[t.to(DEV) for t in csr_c], q.to(DEV), k.to(DEV), v.to(DEV), None, None, 0.5, p, seed,
                              [])[0]
    assert torch.equal(out_g.cpu(), out_c)
    kept = ops.dropout(torch.ones(E, H, dtype=torch.float64), p, seed) != 0
    assert torch.equal(out_c[:, :, 0] != 0, kept[csr_c[2].long()])


def test_attention_dot_no_edges():
    csr = [t.to(DEV) for t in ops.build_csr(torch.zeros(0, dtype=torch.long), torch.zeros(0, dtype=torch.long), 4, 3)]
    csc = transpose_structure(*csr, 3)
    for De in (0, 3):
        args = (*dot_inputs(torch.float32, 3, 4, 0, 2, 5, De), 0.5, 0.3, torch.tensor(1))
        out, out_e, st = ops.attention_dot(*csr, *args, [], *csc)
        assert torch.equal(out.cpu(), torch.zeros(4, 2, 5)) and torch.equal(st.cpu(), torch.zeros(4, 2, 2))
        assert torch.equal(out_e.cpu(), torch.zeros(4, 2, De))
        grads = ops.attention_dot_backward(*csr, *args, out, out_e, st, torch.randn_like(out), torch.randn_like(out_e),
                                           [], *csc)
        for gr, shape in zip(grads, [(4, 2, 5), (3, 2, 5), (3, 2, 5), (4, 2, De), (0, De)]):
            assert gr.device.type == "cuda" and torch.equal(gr.cpu(), torch.zeros(shape))


def test_attention_dot_is_deterministic_and_gradchecks():
    from gnncompile.data.synthetic import power_law_graph

    ei = power_law_graph(2000, 60_000, seed=2)
    csr = [t.to(DEV) for t in ops.build_csr(ei[1], ei[0], 2000, 2000)]
    csc = transpose_structure(*csr, 2000)
    args = (*dot_inputs(torch.float32, 2000, 2000, ei.shape[1], 4, 16, 6), 0.25, 0.1, torch.tensor(3))
    gen = torch.Generator().manual_seed(0)
    g, ge = rnd(gen, torch.float32, 2000, 4, 16), rnd(gen, torch.float32, 2000, 4, 6)
    runs = []
    for _ in range(2):
        out, out_e, st = ops.attention_dot(*csr, *args, [], *csc)
        runs.append((out, out_e, st, *ops.attention_dot_backward(*csr, *args, out, out_e, st, g, ge, [], *csc)))
    for a, b in zip(*runs):
        assert torch.equal(a, b)
    csr, csc = case_graph(N=9, M=17, E=40, seed=5)
    ins = tuple(t.requires_grad_() for t in dot_inputs(torch.float64, 9, 17, 40, 2, 3, 4))
    for p in (0.0, 0.3):
        def f(*t):
            out, out_e, _ = ops.attention_dot(*csr, *t, 0.5, p, torch.tensor(11) if p else None, [], *csc)
            return out, out_e

        assert torch.autograd.gradcheck(f, ins)


def test_attention_dot_bad_input_raises():
    csr, csc = case_graph()
    N, M, E = csc[0].numel() - 1, csr[0].numel() - 1, csr[1].numel()
    q, k, v, qe, ea = dot_inputs(torch.float32, N, M, E, 2, 4, 3)
    with pytest.raises(ValueError, match="edge_attr is on cpu"):
        ops.attention_dot(*csr, q, k, v, qe, ea.cpu(), 0.5, 0.0, None, [])
    with pytest.raises(ValueError, match="come together"):
        ops.attention_dot(*csr, q, k, v, None, ea, 0.5, 0.0, None, [])
    bad = csr[1].clone()
    bad[0] = -1
    with pytest.raises(IndexError, match="out of range"):
        ops.attention_dot(csr[0], bad, csr[2], q, k, v, qe, ea, 0.5, 0.0, None, [])
    out, out_e, st = ops.attention_dot(*csr, q, k, v, qe, ea, 0.5, 0.0, None, [], *csc)
    with pytest.raises(ValueError, match="transpose"):
        ops.attention_dot_backward(*csr, q, k, v, qe, ea, 0.5, 0.0, None, out, out_e, st, torch.ones_like(out),
                                   torch.ones_like(out_e), [], *transpose_structure(*csr, N + 1))
    torch.cuda.synchronize()
    assert torch.isfinite(ops.attention_dot(*csr, q, k, v, qe, ea, 0.5, 0.0, None, [])[0]).all()


# =============================================================================== compiled models
def _compiled_on_cuda(conv, inputs, unverified):
    choices = {"guard": "off", "attention": "fused"}
    if unverified:
        choices["cuda_unverified"] = unverified
    compiled = gnncompile.compile(conv, inner="eager", settings={"choices": choices})
    with gnncompile.compiler.collect() as reports:
        out = compiled(*inputs)
    return out, reports


def _model_case(kind):
    from torch_geometric.nn import GATv2Conv, TransformerConv

    torch._dynamo.reset()
    torch.manual_seed(0)
    conv = (GATv2Conv(16, 8, heads=4, edge_dim=3) if kind == "attention_v2"
            else TransformerConv(16, 8, heads=4, edge_dim=3)).to(DEV)
    gen = torch.Generator().manual_seed(0)
    x = torch.randn(300, 16, generator=gen).to(DEV).requires_grad_()
    ei = torch.randint(0, 300, (2, 3000), generator=gen).to(DEV)
    ea = torch.randn(3000, 3, generator=gen).to(DEV)
    return conv, (x, ei, ea)


@pytest.mark.parametrize("kind", ["attention_v2", "attention_dot"])
def test_compiled_layer_with_edge_features_on_cuda_equals_eager(kind):
    """GATv2Conv / TransformerConv (4 heads, edge_dim 3) compiled with the opt-in
    (choices['cuda_unverified'], GNNCOMPILE_CUDA_UNVERIFIED's setting): the chain is one fused op
    run by the CUDA kernels forward and backward, equal to the eager layer."""
    conv, inputs = _model_case(kind)
    out_c, reports = _compiled_on_cuda(conv, inputs, kind)
    assert sum(r.op_calls.get(kind, 0) for r in reports) == 1, [r.op_calls for r in reports]
    out_e = conv(*inputs)
    torch.testing.assert_close(out_c, out_e, rtol=1e-4, atol=1e-4 * out_e.abs().max().item())
    g = torch.randn_like(out_e)
    params = list(conv.parameters()) + [inputs[0]]
    grads_c, grads_e = torch.autograd.grad(out_c, params, g), torch.autograd.grad(out_e, params, g)
    # the absolute tolerance follows the size of the layer's gradients, not of each tensor's own:
    # TransformerConv's key bias moves every logit of a row by the same amount, so its exact
    # gradient is 0 and both sides hold rounding noise (seen on the H200: |diff| 1.5e-6 where
    # that tensor's largest value was under 1e-3, 29 of its 32 elements over a per-tensor atol)
    scale = max(b.abs().max().item() for b in grads_e)
    for a, b in zip(grads_c, grads_e):
        torch.testing.assert_close(a, b, rtol=1e-4, atol=max(1e-4 * b.abs().max().item(), 1e-5 * scale))


@pytest.mark.parametrize("kind", ["attention_v2", "attention_dot"])
def test_without_the_opt_in_the_chain_stays_on_cuda(kind):
    conv, inputs = _model_case(kind)
    out_c, reports = _compiled_on_cuda(conv, inputs, None)
    assert sum(r.op_calls.get(kind, 0) for r in reports) == 0, [r.op_calls for r in reports]
    torch.testing.assert_close(out_c, conv(*inputs), rtol=1e-4, atol=1e-4)


def test_env_variable_opts_in():
    """GNNCOMPILE_CUDA_UNVERIFIED (through gnncompile.config) reaches the compiled model."""
    from gnncompile import config

    conv, inputs = _model_case("attention_v2")
    with config.override(cuda_unverified="all", guard="off"):
        compiled = gnncompile.compile(conv, inner="eager")
    with gnncompile.compiler.collect() as reports:
        compiled(*inputs)
    assert sum(r.op_calls.get("attention_v2", 0) for r in reports) == 1, [r.op_calls for r in reports]
