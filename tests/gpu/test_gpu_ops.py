"""CUDA kernels of every gnncompile op: parity with the pure-torch reference (run on CUDA) and
with the CPU kernels, opcheck, gradcheck in float64, edge cases, bad input, determinism, and
the knob space (lanes, vector widths, items per group small enough to cut every row).

Skipped unless a GPU is visible and the extension was built with its CUDA kernels."""
from __future__ import annotations

import itertools

import pytest
import torch

import gnncompile
from gnncompile.ops import reference
from gnncompile.ops.schemas import ops
from gnncompile.ops.structure import transpose_structure

HAS_CUDA_KERNELS = torch.cuda.is_available() and bool(gnncompile.info()["cuda_kernels"])
pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not HAS_CUDA_KERNELS, reason="needs a CUDA device and gnncompile built with CUDA kernels"),
]

DEV = "cuda"
FLOATS = [torch.float32, torch.float64, torch.float16, torch.bfloat16]
INDEX = [torch.int64, torch.int32]
REDUCES = ["sum", "mean", "max", "min"]
# Knob sets: defaults; one lane per row with scalar loads and one item per group (every row
# with an edge is cut, every fix-up path runs); a mid layout; wide groups with big runs.
KNOBS = [[], [1, 32, 1, 1], [8, 4, 2, 3], [32, 8, 8, 4096], [4, 8, 4, 17]]


def tol(dtype):
    return {
        torch.float32: dict(rtol=1e-5, atol=1e-5),
        torch.float64: dict(rtol=1e-12, atol=1e-12),
        torch.float16: dict(rtol=2e-3, atol=2e-3),
        torch.bfloat16: dict(rtol=1.6e-2, atol=1.6e-2),
    }[dtype]


def close(a, b, dtype, scale=1.0):
    t = tol(dtype)
    torch.testing.assert_close(a.double(), b.double(), rtol=t["rtol"], atol=t["atol"] * scale, equal_nan=True)


def graph(num_src, num_dst, num_edges, *, seed=0, hub=False, self_loops=False, dup=False, isolated=0,
          index=torch.int64):
    """An unsorted random edge_index (CPU) with optional hub, self loops, duplicates and
    destination rows that receive nothing."""
    g = torch.Generator().manual_seed(seed)
    src = torch.randint(0, num_src, (num_edges,), generator=g)
    hi = max(num_dst - isolated, 1)
    dst = torch.randint(0, hi, (num_edges,), generator=g)
    if hub and num_edges:
        dst[torch.rand(num_edges, generator=g) < 0.4] = 0
    if self_loops:
        n = min(num_src, num_dst)
        loops = torch.arange(n)
        src, dst = torch.cat([src, loops]), torch.cat([dst, loops])
    if dup and src.numel():
        k = max(src.numel() // 5, 1)
        src, dst = torch.cat([src, src[:k]]), torch.cat([dst, dst[:k]])
    return torch.stack([src, dst]).to(index)


def structure(ei, num_dst, device=DEV):
    ei = ei.to(device)
    return ops.build_csr(ei[1], ei[0], num_dst, int(ei[0].max()) + 1 if ei.numel() else 0)


def cpu(*ts):
    return [t.cpu() if isinstance(t, torch.Tensor) else t for t in ts]


# =============================================================================== build_csr
@pytest.mark.parametrize("index", INDEX)
@pytest.mark.parametrize("num_dst,num_edges", [(1, 50), (7, 0), (200, 3000), (300, 9000), (70_000, 20_000),
                                               (5000, 100_000)])
def test_build_csr_matches_cpu_and_reference(index, num_dst, num_edges):
    ei = graph(40, num_dst, num_edges, seed=num_dst, hub=True, dup=True, index=index)
    num_src = 40
    got = ops.build_csr(ei[1].to(DEV), ei[0].to(DEV), num_dst, num_src)
    want = ops.build_csr(ei[1], ei[0], num_dst, num_src)  # CPU kernel
    ref = reference.build_csr(ei[1].to(DEV), ei[0].to(DEV), num_dst, num_src)
    for g, w, r in zip(got, want, ref):
        assert g.dtype == index and g.device.type == "cuda"
        assert torch.equal(g.cpu(), w)  # stable: identical slot order, not just the same set
        assert torch.equal(g.cpu(), r.cpu())


def test_build_csr_is_stable_with_one_hub():
    E = 50_000
    dst = torch.zeros(E, dtype=torch.long)
    dst[::7] = 3
    src = torch.arange(E) % 11
    rowptr, col, perm = ops.build_csr(dst.to(DEV), src.to(DEV), 300, 11)
    p = perm.cpu()
    for r in range(300):
        seg = p[rowptr[r]:rowptr[r + 1]]
        assert torch.all(seg[1:] > seg[:-1])
    assert torch.equal(col.cpu(), src[p])


@pytest.mark.parametrize("index", INDEX)
@pytest.mark.parametrize("where,value,match", [
    (1, 10, r"edge_index\[1\] \(destination\) holds index 10 at edge 5"),
    (1, -1, r"edge_index\[1\] \(destination\) holds the negative index -1 at edge 5"),
    (0, 9, r"edge_index\[0\] \(source\) holds index 9 at edge 5"),
    (0, -3, r"edge_index\[0\] \(source\) holds the negative index -3 at edge 5"),
])
def test_build_csr_bad_index_raises_and_cuda_survives(index, where, value, match):
    ei = graph(9, 10, 40, index=index)
    ei[where, 5] = value
    ei[where, 20] = value  # the first offending edge is named
    ei = ei.to(DEV)
    with pytest.raises(IndexError, match=match):
        ops.build_csr(ei[1], ei[0], 10, 9)
    torch.cuda.synchronize()
    # The context is intact: a following op runs and is right.
    good = graph(9, 10, 40, index=index)
    x = torch.randn(9, 4, device=DEV)
    s = structure(good, 10)
    out, _ = ops.spmm(*s, None, x, "sum", [])
    ref, _ = reference.spmm(*s, None, x, "sum")
    close(out, ref, torch.float32)


# =============================================================================== spmm
def spmm_inputs(dtype, index, *, wmode, heads=2, C=8, N=30, M=25, E=400, seed=0, hub=True):
    ei = graph(N, M, E, seed=seed, hub=hub, self_loops=True, dup=True, isolated=3, index=index)
    s = structure(ei, M)
    Et = s[1].numel()
    g = torch.Generator().manual_seed(seed + 1)
    if wmode == "head":
        x = torch.randn(N, heads, C, generator=g)
        w = torch.randn(Et, heads, generator=g)
    else:
        x = torch.randn(N, C, generator=g)
        w = {"none": None, "scalar": torch.randn(Et, generator=g), "col": torch.randn(Et, 1, generator=g)}[wmode]
    x = x.to(DEV, dtype)
    w = w.to(DEV, dtype) if w is not None else None
    return s, w, x


@pytest.mark.parametrize("dtype", FLOATS)
@pytest.mark.parametrize("reduce", REDUCES)
@pytest.mark.parametrize("index", INDEX)
@pytest.mark.parametrize("wmode", ["none", "scalar", "col", "head"])
def test_spmm_parity(dtype, reduce, index, wmode):
    for C in (1, 7, 16, 130):
        s, w, x = spmm_inputs(dtype, index, wmode=wmode, C=C, seed=C)
        out, arg = ops.spmm(*s, w, x, reduce, [])
        ref, ref_arg = reference.spmm(*s, w, x, reduce)
        assert out.shape == ref.shape and out.dtype == dtype
        close(out, ref, dtype, scale=4.0)
        cout, carg = ops.spmm(*cpu(*s, w, x), reduce, [])  # the CPU kernel
        close(out.cpu(), cout, dtype, scale=4.0)
        if reduce in ("max", "min"):
            assert torch.equal(arg, ref_arg), "arg must name the first CSR slot reaching the extremum"
            assert torch.equal(arg.cpu(), carg)
        else:
            assert arg.numel() == 0


@pytest.mark.parametrize("knobs", KNOBS)
@pytest.mark.parametrize("reduce", REDUCES)
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
def test_spmm_knob_space_and_cut_rows(knobs, reduce, dtype):
    # A hub row spanning many groups plus many small rows, widths that hit every vector width.
    for C, wmode in ((128, "none"), (24, "scalar"), (6, "head"), (3, "none")):
        s, w, x = spmm_inputs(dtype, torch.int64, wmode=wmode, C=C, N=64, M=40, E=3000, seed=C)
        out, arg = ops.spmm(*s, w, x, reduce, knobs)
        ref, ref_arg = reference.spmm(*s, w, x, reduce)
        close(out, ref, dtype, scale=8.0)
        if reduce in ("max", "min"):
            assert torch.equal(arg, ref_arg)


@pytest.mark.parametrize("knobs", KNOBS[:3])
def test_spmm_is_deterministic(knobs):
    from gnncompile.data.synthetic import power_law_graph

    ei = power_law_graph(5000, 200_000, seed=3)
    s = structure(ei, 5000)
    x = torch.randn(5000, 64, device=DEV)
    w = torch.randn(s[1].numel(), device=DEV)
    for reduce in ("sum", "max"):
        a = ops.spmm(*s, w, x, reduce, knobs)
        b = ops.spmm(*s, w, x, reduce, knobs)
        assert torch.equal(a[0], b[0]) and torch.equal(a[1], b[1])  # bit for bit
        ref = reference.spmm(*s, w, x, reduce)
        torch.testing.assert_close(a[0], ref[0], rtol=1e-4, atol=1e-3)


def test_spmm_power_law_hub_matches_reference():
    from gnncompile.data.synthetic import power_law_graph

    N, E = 20_000, 300_000
    ei = power_law_graph(N, E, seed=1)
    s = structure(ei, N)
    deg = (s[0][1:] - s[0][:-1])
    assert int(deg.max()) > 2000  # a hub that many groups share
    x = torch.randn(N, 64, device=DEV)
    for reduce in REDUCES:
        out, arg = ops.spmm(*s, None, x, reduce, [])
        ref, ref_arg = reference.spmm(*s, None, x, reduce)
        torch.testing.assert_close(out, ref, rtol=1e-4, atol=1e-3)
        if reduce in ("max", "min"):
            assert torch.equal(arg, ref_arg)


@pytest.mark.parametrize("index", INDEX)
def test_spmm_edge_cases(index):
    x = torch.randn(6, 5, device=DEV)
    # no edges: zeros, arg -1
    s = structure(torch.empty(2, 0, dtype=index), 4)
    for reduce in REDUCES:
        out, arg = ops.spmm(*s, None, x, reduce, [])
        assert torch.equal(out, torch.zeros(4, 5, device=DEV))
        if reduce in ("max", "min"):
            assert torch.equal(arg, torch.full((4, 5), -1, device=DEV))
    # no destination rows
    s = structure(torch.empty(2, 0, dtype=index), 0)
    assert ops.spmm(*s, None, x, "sum", [])[0].shape == (0, 5)
    # zero features
    ei = graph(6, 4, 10, index=index)
    s = structure(ei, 4)
    assert ops.spmm(*s, None, torch.randn(6, 0, device=DEV), "max", [])[0].shape == (4, 0)
    # 1-D x, bipartite (num_dst != num_src), isolated rows, self loops, duplicates
    ei = graph(6, 9, 30, self_loops=True, dup=True, isolated=4, index=index)
    s = structure(ei, 9)
    x1 = torch.randn(6, device=DEV)
    for reduce in REDUCES:
        out, arg = ops.spmm(*s, None, x1, reduce, [])
        ref, ref_arg = reference.spmm(*s, None, x1, reduce)
        close(out, ref, torch.float32)
        if reduce in ("max", "min"):
            assert torch.equal(arg, ref_arg)


def test_spmm_nan_and_inf_rows_match_cpu():
    ei = torch.tensor([[0, 1, 2, 3, 0], [0, 0, 1, 1, 2]])
    x = torch.tensor([[float("nan"), 1.0], [float("nan"), -float("inf")], [1.0, -float("inf")],
                      [float("nan"), -float("inf")]])
    for reduce in ("max", "min", "sum"):
        s_cpu = ops.build_csr(ei[1], ei[0], 3, 4)
        want = ops.spmm(*s_cpu, None, x, reduce, [])
        got = ops.spmm(*structure(ei, 3), None, x.to(DEV), reduce, [])
        torch.testing.assert_close(got[0].cpu(), want[0], equal_nan=True)
        assert torch.equal(got[1].cpu(), want[1])


def test_spmm_misaligned_input_falls_back_to_narrow_loads():
    ei = graph(20, 10, 200)
    s = structure(ei, 10)
    base = torch.randn(20 * 16 + 1, device=DEV)
    x = base[1:].view(20, 16)  # 4-byte aligned only: no float4 / float2 loads
    assert x.data_ptr() % 16 != 0
    out, _ = ops.spmm(*s, None, x, "sum", [])
    close(out, reference.spmm(*s, None, x, "sum")[0], torch.float32)


# =============================================================================== edge_dot
@pytest.mark.parametrize("dtype", FLOATS)
@pytest.mark.parametrize("index", INDEX)
@pytest.mark.parametrize("heads,C", [(1, 1), (1, 7), (1, 128), (2, 8), (4, 3), (8, 8), (3, 40), (40, 2)])
def test_edge_dot_parity(dtype, index, heads, C):
    N, M = 30, 25
    ei = graph(N, M, 500, hub=True, self_loops=True, dup=True, isolated=3, index=index, seed=heads * C)
    s = structure(ei, M)
    x = torch.randn(N, heads * C, device=DEV, dtype=dtype)
    g = torch.randn(M, heads * C, device=DEV, dtype=dtype)
    for knobs in ([], [1, 32, 1, 1], [8, 4, 2, 5]):
        out = ops.edge_dot(*s, x, g, heads, knobs)
        ref = reference.edge_dot(*s, x, g, heads)
        close(out, ref, dtype, scale=4.0 * max(C, 1) ** 0.5)
    close(out.cpu(), ops.edge_dot(*cpu(*s, x, g), heads, []), dtype, scale=4.0 * max(C, 1) ** 0.5)


def test_edge_dot_no_edges():
    s = structure(torch.empty(2, 0, dtype=torch.long), 3)
    out = ops.edge_dot(*s, torch.randn(4, 6, device=DEV), torch.randn(3, 6, device=DEV), 2, [])
    assert out.shape == (0, 2)


# =============================================================================== edge_softmax
@pytest.mark.parametrize("dtype", FLOATS)
@pytest.mark.parametrize("index", INDEX)
@pytest.mark.parametrize("shape", [(), (1,), (4,), (3,), (40,), (2, 3)])
def test_edge_softmax_and_backward_parity(dtype, index, shape):
    N, M = 30, 25
    ei = graph(N, M, 600, hub=True, self_loops=True, dup=True, isolated=3, index=index, seed=len(shape))
    s = structure(ei, M)
    rowptr, perm = s[0], s[2]
    E = perm.numel()
    scores = (torch.randn(E, *shape, device=DEV) * 3).to(dtype)
    scores[:5] = float("-inf")  # rows whose every score is -inf must not produce NaN
    grad = torch.randn(E, *shape, device=DEV).to(dtype)
    for knobs in ([], [0, 0, 0, 1], [0, 0, 0, 7], [0, 0, 0, 4096]):
        y = ops.edge_softmax(rowptr, perm, scores, knobs)
        close(y, reference.edge_softmax(rowptr, perm, scores), dtype)
        gs = ops.edge_softmax_backward(rowptr, perm, y, grad, knobs)
        close(gs, reference.edge_softmax_backward(rowptr, perm, y, grad), dtype, scale=4.0)
    close(y.cpu(), ops.edge_softmax(*cpu(rowptr, perm, scores), []), dtype)
    close(gs.cpu(), ops.edge_softmax_backward(*cpu(rowptr, perm, y, grad), []), dtype, scale=4.0)


def test_edge_softmax_all_neg_inf_row_is_zero_not_nan():
    ei = torch.tensor([[0, 1, 2], [0, 0, 1]])
    s = structure(ei, 2)
    scores = torch.tensor([-float("inf"), -float("inf"), 1.0], device=DEV)
    y = ops.edge_softmax(s[0], s[2], scores, [])
    assert torch.equal(y.cpu(), torch.tensor([0.0, 0.0, 1.0]) / (1 + 1e-16))


def test_edge_softmax_power_law_hub():
    from gnncompile.data.synthetic import power_law_graph

    N, E = 20_000, 300_000
    ei = power_law_graph(N, E, seed=2)
    s = structure(ei, N)
    scores = torch.randn(E, 4, device=DEV) * 4
    y = ops.edge_softmax(s[0], s[2], scores, [])
    # Against the float64 reference: a float32 reference sums a hub row of thousands of edges
    # with atomics in another order and is itself off by ~2e-5 relative (seen on an H200: 1 of
    # 1.2M elements beyond rtol=1e-5).
    ref = reference.edge_softmax(s[0], s[2], scores.double()).float()
    torch.testing.assert_close(y, ref, rtol=1e-4, atol=1e-6)
    g = torch.randn(E, 4, device=DEV)
    torch.testing.assert_close(ops.edge_softmax_backward(s[0], s[2], y, g, []),
                               reference.edge_softmax_backward(s[0], s[2], y, g), rtol=1e-4, atol=1e-6)


# =============================================================================== attention
def attention_case(dtype, index, *, H=4, C=8, N=40, M=50, E=400, edge=True, seed=0):
    """GAT-style attention inputs on CUDA: a graph with a hub, self loops and duplicates whose
    destination rows 45..49 receive nothing (M > N: the self loops stop at N), its CSR and CSC,
    and x [N, H, C], a_src [N, H], a_dst [M, H], a_edge [E, H] (or None)."""
    ei = graph(N, M, E, seed=seed, hub=True, self_loops=True, dup=True, isolated=5, index=index)
    csr = structure(ei, M)
    csc = transpose_structure(*csr, N)
    g = torch.Generator().manual_seed(seed + 1)

    def rnd(*shape, scale=1.0):
        return (torch.randn(*shape, generator=g, dtype=torch.float64) * scale).to(dtype).to(DEV)

    x = rnd(N, H, C)
    a_s, a_d = rnd(N, H, scale=1.5), rnd(M, H, scale=1.5)
    a_e = rnd(csr[1].numel(), H) if edge else None
    return csr, csc, (x, a_s, a_d, a_e)


def attention_close(a, b, dtype):
    """Gradients: sums over many edges (a hub), compared at a tolerance scaled by the tensor."""
    close(a, b, dtype, scale=4.0 * max(1.0, b.double().abs().max().item() if b.numel() else 1.0))


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("index", INDEX)
@pytest.mark.parametrize("edge", [False, True])
@pytest.mark.parametrize("p", [0.0, 0.3])
@pytest.mark.parametrize("H,C", [(4, 8), (3, 5), (1, 300), (40, 2)])
def test_attention_matches_cpu_and_reference(dtype, index, edge, p, H, C):
    """Forward and backward against the CPU kernel (same inputs, .cpu()) and the pure-torch
    reference, with and without a_edge and dropout (one seed: the counter hash gives CUDA the
    CPU's mask), for head shapes that take each lane layout: C below, above and far above a warp
    (C = 300: a head's features in several passes), and more heads than lanes (H = 40)."""
    csr, csc, (x, a_s, a_d, a_e) = attention_case(dtype, index, H=H, C=C, edge=edge)
    M, E = csr[0].numel() - 1, csr[1].numel()
    args = (x, a_s, a_d, a_e, 0.2, p, torch.tensor(1234) if p else None)
    out, st = ops.attention(*csr, *args, [], *csc)
    acc = torch.float64 if dtype == torch.float64 else torch.float32
    assert out.device.type == "cuda" and out.shape == (M, H, C) and out.dtype == dtype
    assert st.device.type == "cuda" and st.shape == (M, 2, H) and st.dtype == acc
    c_out, c_st = ops.attention(*cpu(*csr), *cpu(*args), [], *cpu(*csc))
    r_out, r_st = reference.attention(*csr, *args, [])
    close(out.cpu(), c_out, dtype)
    close(st.cpu(), c_st, dtype)
    close(out, r_out, dtype)
    close(st, r_st, dtype)
    empty = (csr[0][1:] == csr[0][:-1]).cpu()
    assert empty.any()
    assert torch.equal(out.cpu()[empty], torch.zeros_like(c_out[empty]))
    assert torch.equal(st.cpu()[empty], torch.zeros_like(c_st[empty]))

    g = torch.randn(out.shape, generator=torch.Generator().manual_seed(9), dtype=torch.float64).to(dtype).to(DEV)
    got = ops.attention_backward(*csr, *args, out, st, g, [], *csc)
    want = ops.attention_backward(*cpu(*csr), *cpu(*args), out.cpu(), st.cpu(), g.cpu(), [], *cpu(*csc))
    ref = reference.attention_backward(*csr, *args, out, st, g, [], *csc)
    for a, b, r in zip(got, want, ref):
        assert a.device.type == "cuda" and a.dtype == b.dtype == dtype and a.shape == b.shape == r.shape
        attention_close(a.cpu(), b, dtype)
        attention_close(a, r, dtype)
    assert got[3].shape == ((E, H) if edge else (0, H))
    assert torch.equal(got[2].cpu()[empty], torch.zeros_like(want[2][empty]))


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_attention_16bit_matches_cpu(dtype):
    """16-bit features: the coefficients are rounded to the features' dtype as on the CPU."""
    csr, csc, (x, a_s, a_d, a_e) = attention_case(dtype, torch.int64, seed=3)
    args = (x, a_s, a_d, a_e, 0.2, 0.3, torch.tensor(7))
    out, st = ops.attention(*csr, *args, [], *csc)
    c_out, c_st = ops.attention(*cpu(*csr), *cpu(*args), [], *cpu(*csc))
    close(out.cpu(), c_out, dtype, scale=2.0)
    close(st.cpu(), c_st, torch.float32, scale=10.0)
    g = torch.randn(out.shape, generator=torch.Generator().manual_seed(4)).to(dtype).to(DEV)
    got = ops.attention_backward(*csr, *args, out, st, g, [], *csc)
    want = ops.attention_backward(*cpu(*csr), *cpu(*args), out.cpu(), st.cpu(), g.cpu(), [], *cpu(*csc))
    for a, b in zip(got, want):
        assert a.dtype == b.dtype == dtype and a.shape == b.shape
        attention_close(a.cpu(), b, dtype)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_attention_dropout_mask_is_the_cpus(dtype):
    """One edge per destination row: every coefficient is exp(0) / (1 + 1e-16) = 1 before
    dropout, so out shows the mask itself (1 / (1 - p) kept, 0 dropped): CUDA's, the CPU's and
    the dropout op's masks of the [E, H] coefficients agree exactly."""
    N, E, H, C, p = 50, 3000, 4, 2, 0.3
    gen = torch.Generator().manual_seed(3)
    src = torch.randint(0, N, (E,), generator=gen)
    dst = torch.randperm(E, generator=gen)  # row i's edge id is not i
    x = torch.ones(N, H, C, dtype=dtype)
    a_s, a_d = torch.randn(N, H, generator=gen).to(dtype), torch.randn(E, H, generator=gen).to(dtype)
    seed = torch.tensor(77)
    csr_c = ops.build_csr(dst, src, E, N)
    csr_g = ops.build_csr(dst.to(DEV), src.to(DEV), E, N)
    out_c, _ = ops.attention(*csr_c, x, a_s, a_d, None, 0.2, p, seed, [])
    out_g, _ = ops.attention(*csr_g, x.to(DEV), a_s.to(DEV), a_d.to(DEV), None, 0.2, p, seed, [])
    assert torch.equal(out_g.cpu(), out_c)
    kept = ops.dropout(torch.ones(E, H, dtype=torch.float64), p, seed) != 0  # edge order
    assert torch.equal(out_c[:, :, 0] != 0, kept[csr_c[2].long()])
    assert 0.25 < 1 - kept.double().mean().item() < 0.35


def test_attention_no_edges_and_rows_without_edges():
    for edge in (False, True):
        s = structure(torch.empty(2, 0, dtype=torch.long), 4)
        csc = transpose_structure(*s, 3)
        x = torch.randn(3, 2, 5, device=DEV)
        a_s, a_d = torch.randn(3, 2, device=DEV), torch.randn(4, 2, device=DEV)
        a_e = torch.randn(0, 2, device=DEV) if edge else None
        args = (x, a_s, a_d, a_e, 0.2, 0.3, torch.tensor(1))
        out, st = ops.attention(*s, *args, [], *csc)
        assert torch.equal(out.cpu(), torch.zeros(4, 2, 5)) and torch.equal(st.cpu(), torch.zeros(4, 2, 2))
        gx, gs, gd, ge = ops.attention_backward(*s, *args, out, st, torch.randn(4, 2, 5, device=DEV), [], *csc)
        assert torch.equal(gx.cpu(), torch.zeros(3, 2, 5)) and torch.equal(gs.cpu(), torch.zeros(3, 2))
        assert torch.equal(gd.cpu(), torch.zeros(4, 2)) and ge.shape == (0, 2) and ge.device.type == "cuda"
    # rows 0 and 3 receive nothing, row 2 only a -inf logit (coefficient 0, as the CPU's)
    src, dst = torch.tensor([0, 1, 2, 0, 1]), torch.tensor([1, 1, 2, 4, 4])
    rowptr, col, perm = ops.build_csr(dst.to(DEV), src.to(DEV), 5, 3)
    csc = transpose_structure(rowptr, col, perm, 3)
    x = torch.randn(3, 1, 4, device=DEV)
    a_s = torch.tensor([[3.0], [-2.0], [float("-inf")]], device=DEV)
    args = (x, a_s, torch.zeros(5, 1, device=DEV), None, 0.2, 0.0, None)
    out, st = ops.attention(rowptr, col, perm, *args, [], *csc)
    c_out, c_st = ops.attention(*cpu(rowptr, col, perm), *cpu(*args), [], *cpu(*csc))
    torch.testing.assert_close(out.cpu(), c_out, rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(st.cpu(), c_st, rtol=1e-5, atol=1e-6)
    assert torch.equal(out.cpu()[[0, 2, 3]], torch.zeros(3, 1, 4))


def test_attention_is_deterministic_and_gradchecks():
    from gnncompile.data.synthetic import power_law_graph

    ei = power_law_graph(2000, 60_000, seed=2)
    s = structure(ei, 2000)
    csc = transpose_structure(*s, 2000)
    gen = torch.Generator().manual_seed(0)
    x, a_s, a_d = (torch.randn(*shape, generator=gen).to(DEV) for shape in ((2000, 4, 16), (2000, 4), (2000, 4)))
    g = torch.randn(2000, 4, 16, generator=gen).to(DEV)
    runs = []
    for _ in range(2):
        out, st = ops.attention(*s, x, a_s, a_d, None, 0.2, 0.1, torch.tensor(3), [], *csc)
        runs.append((out, *ops.attention_backward(*s, x, a_s, a_d, None, 0.2, 0.1, torch.tensor(3), out, st, g, [],
                                                  *csc)))
    for a, b in zip(*runs):
        assert torch.equal(a, b)
    # float64 gradcheck through the autograd registration (the CUDA backward), dropout on: the
    # mask is a function of the seed, so the op is a deterministic function of its inputs
    csr, csc, (x, a_s, a_d, a_e) = attention_case(torch.float64, torch.int64, H=2, C=3, N=9, M=12, E=40, seed=5)
    ins = tuple(t.requires_grad_() for t in (x, a_s, a_d, a_e))
    for p in (0.0, 0.3):
        def f(*t):
            return ops.attention(*csr, *t, 0.2, p, torch.tensor(11) if p else None, [], *csc)[0]

        assert torch.autograd.gradcheck(f, ins)


def test_attention_device_mismatch_raises():
    csr, csc, (x, a_s, a_d, a_e) = attention_case(torch.float32, torch.int64)
    with pytest.raises(ValueError, match="a_src is on cpu"):
        ops.attention(*csr, x, a_s.cpu(), a_d, a_e, 0.2, 0.0, None, [], *csc)
    with pytest.raises(ValueError, match="needs a seed, one int64 on the CPU"):
        ops.attention(*csr, x, a_s, a_d, a_e, 0.2, 0.3, torch.tensor(1, device=DEV), [], *csc)


@pytest.mark.parametrize("opt_in", [True, False])
def test_compiled_gatconv_on_cuda_equals_eager(opt_in):
    """GATConv(16, 8, heads=4) compiled against the eager layer on CUDA, forward and backward: with
    the opt-in (choices['cuda_unverified'] = 'attention') its attention is one
    gnncompile::attention run by the CUDA kernels; by default the chain stays, edge_softmax + spmm
    (the fused kernel's one warp per row loses on hub rows, passes/attention.py CUDA_STATUS)."""
    from torch_geometric.nn import GATConv

    torch._dynamo.reset()
    torch.manual_seed(0)
    conv = GATConv(16, 8, heads=4).to(DEV)
    gen = torch.Generator().manual_seed(0)
    x = torch.randn(300, 16, generator=gen).to(DEV).requires_grad_()
    ei = torch.randint(0, 300, (2, 3000), generator=gen).to(DEV)
    choices = {"guard": "off", "attention": "fused"}
    if opt_in:
        choices["cuda_unverified"] = "attention"
    compiled = gnncompile.compile(conv, inner="eager", settings={"choices": choices})
    with gnncompile.compiler.collect() as reports:
        out_c = compiled(x, ei)
    calls = [r.op_calls for r in reports]
    if opt_in:
        assert sum(c.get("attention", 0) for c in calls) == 1, calls
    else:
        assert sum(c.get("attention", 0) for c in calls) == 0, calls
        assert sum(c.get("edge_softmax", 0) for c in calls) == 1 and sum(c.get("spmm", 0) for c in calls) >= 1, calls
        assert any("one warp per destination row" in str(r) for r in reports)
    out_e = conv(x, ei)
    torch.testing.assert_close(out_c, out_e, rtol=1e-4, atol=1e-4 * out_e.abs().max().item())
    g = torch.randn_like(out_e)
    params = list(conv.parameters()) + [x]
    for a, b in zip(torch.autograd.grad(out_c, params, g), torch.autograd.grad(out_e, params, g)):
        torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-4 * max(b.abs().max().item(), 1e-3))


# =============================================================================== issue-15 checks
@pytest.mark.parametrize("knobs", [[], [1, 32, 1, 1], [4, 8, 4, 17]])
@pytest.mark.parametrize("reduce", ["max", "min"])
def test_spmm_nan_in_rows_cut_between_groups_matches_cpu(knobs, reduce):
    """A NaN message propagates (as on the CPU and in scatter_reduce) also when the row is cut
    between groups and its runs are combined in the fix-up pass; the arg is the first NaN."""
    g = torch.Generator().manual_seed(7)
    ei = graph(30, 6, 400, seed=7, hub=True)
    x = torch.randn(30, 33, generator=g)
    x[torch.rand(30, 33, generator=g) < 0.05] = float("nan")
    x[torch.rand(30, 33, generator=g) < 0.05] = float("inf")
    s_cpu = ops.build_csr(ei[1], ei[0], 6, 30)
    want, want_arg = ops.spmm(*s_cpu, None, x, reduce, [])
    got, got_arg = ops.spmm(*structure(ei, 6), None, x.to(DEV), reduce, knobs)
    torch.testing.assert_close(got.cpu(), want, equal_nan=True)
    assert torch.equal(got_arg.cpu(), want_arg)


def test_trusted_structures_are_not_validated_per_call():
    """build_csr's output (and a clone_structure copy) is known valid: ops on it never wait on
    the host (a synchronising call raises in sync-debug mode "error"). An untrusted copy is
    validated (and waited on) once."""
    ei = graph(100, 80, 2000)
    s = structure(ei, 80)
    x = torch.randn(100, 16, device=DEV)
    sc = torch.randn(s[1].numel(), device=DEV)
    copy = ops.clone_structure(list(s))
    plain = tuple(t.clone() for t in s)
    ops.spmm(*plain, None, x, "sum", [])  # validated here, with a host wait
    ops.edge_softmax(plain[0], plain[2], sc, [])  # and its perm checked to be a permutation
    torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode("error")
    try:
        for t in (s, copy, plain):
            ops.spmm(*t, None, x, "max", [])
            ops.edge_softmax(t[0], t[2], sc, [])
    finally:
        torch.cuda.set_sync_debug_mode(0)


def test_perm_that_repeats_an_edge_id_raises_on_cuda():
    ei = graph(10, 8, 60)
    rowptr, col, perm = structure(ei, 8)
    dup = perm.clone()
    dup[1] = dup[0]
    with pytest.raises(IndexError, match="exactly once"):
        ops.edge_softmax(rowptr, dup, torch.randn(perm.numel(), device=DEV), [])
    with pytest.raises(IndexError, match="exactly once"):
        ops.edge_dot(rowptr, col, dup, torch.randn(10, 4, device=DEV), torch.randn(8, 4, device=DEV), 1, [])
    ops.spmm(rowptr, col, dup, torch.randn(perm.numel(), device=DEV), torch.randn(10, 4, device=DEV), "sum", [])


def test_wide_rows_with_narrow_knobs_fit_the_grid():
    """Explicit lanes = 1 and vec = 1 on 70k features would need 70k feature tiles (grid y is
    at most 65535): the launch rule widens the groups instead."""
    ei = graph(20, 10, 200)
    s = structure(ei, 10)
    x = torch.randn(20, 70_000, device=DEV)
    for reduce in ("sum", "max"):
        out, arg = ops.spmm(*s, None, x, reduce, [1, 0, 1, 0])
        ref, ref_arg = reference.spmm(*s, None, x, reduce)
        close(out, ref, torch.float32)
        if reduce == "max":
            assert torch.equal(arg, ref_arg)


def test_profile_sized_items_do_not_blow_up_scratch():
    """items_per_group = 1 from a profile tuned on a tiny graph, on a large one: bounded."""
    from gnncompile.data.synthetic import power_law_graph

    ei = power_law_graph(200_000, 4_000_000, seed=5)
    s = structure(ei, 200_000)
    x = torch.randn(200_000, 128, device=DEV)
    torch.cuda.reset_peak_memory_stats()
    base = torch.cuda.memory_allocated()
    out, _ = ops.spmm(*s, None, x, "max", [0, 0, 0, 1])
    peak = torch.cuda.max_memory_allocated() - base
    assert peak < 3 * out.numel() * (4 + 8) + (64 << 20), peak  # out + arg + scratch of one slot a row
    torch.testing.assert_close(out, reference.spmm(*s, None, x, "max")[0])


def test_max_min_backward_is_deterministic():
    from gnncompile.data.synthetic import power_law_graph

    ei = power_law_graph(2000, 60_000, seed=2)
    s = structure(ei, 2000)
    t = ops.clone_structure(list(s))  # any structure; the CSC is built inside backward
    grads = []
    for _ in range(2):
        x = torch.randn(2000, 32, device=DEV, generator=torch.Generator(DEV).manual_seed(0)).requires_grad_()
        w = torch.rand(s[1].numel(), device=DEV, generator=torch.Generator(DEV).manual_seed(1)).requires_grad_()
        out, _ = ops.spmm(*t, w, x, "max", [])
        out.sum().backward()
        grads.append((x.grad, w.grad))
    assert torch.equal(grads[0][0], grads[1][0]) and torch.equal(grads[0][1], grads[1][1])


# =============================================================================== bad input
def test_bad_structure_raises_and_cuda_survives():
    ei = graph(10, 8, 60)
    rowptr, col, perm = structure(ei, 8)
    x = torch.randn(10, 4, device=DEV)
    bad_col = col.clone()
    bad_col[3] = 10
    with pytest.raises(IndexError, match="source index out of range"):
        ops.spmm(rowptr, bad_col, perm, None, x, "sum", [])
    bad_col[3] = -2
    with pytest.raises(IndexError, match="source index out of range"):
        ops.edge_dot(rowptr, bad_col, perm, x, torch.randn(8, 4, device=DEV), 1, [])
    bad_perm = perm.clone()
    bad_perm[0] = perm.numel()
    with pytest.raises(IndexError, match="perm holds an edge id"):
        ops.edge_softmax(rowptr, bad_perm, torch.randn(perm.numel(), device=DEV), [])
    bad_rowptr = rowptr.clone()
    bad_rowptr[-1] += 5
    with pytest.raises(ValueError, match="rowptr must start at 0 and end"):
        ops.spmm(bad_rowptr, col, perm, None, x, "max", [])
    bad_rowptr = rowptr.clone()
    bad_rowptr[2], bad_rowptr[3] = rowptr[3] + 1, rowptr[2]
    with pytest.raises(ValueError, match="non-decreasing"):
        ops.spmm(bad_rowptr, col, perm, None, x, "sum", [])
    with pytest.raises(ValueError, match="unknown reduce"):
        ops.spmm(rowptr, col, perm, None, x, "prod", [])
    with pytest.raises(ValueError, match="is on cpu"):
        ops.spmm(rowptr.cpu(), col, perm, None, x, "sum", [])
    with pytest.raises(TypeError, match="does not match x dtype"):
        ops.spmm(rowptr, col, perm, torch.randn(perm.numel(), device=DEV, dtype=torch.float64), x, "sum", [])
    torch.cuda.synchronize()
    out, _ = ops.spmm(rowptr, col, perm, None, x, "mean", [])
    close(out, reference.spmm(rowptr, col, perm, None, x, "mean")[0], torch.float32)


def test_public_api_on_cuda():
    ei = graph(50, 50, 400).to(DEV)
    x = torch.randn(50, 16, device=DEV)
    w = torch.rand(400, device=DEV)
    import torch_geometric.utils as pyg

    for reduce in REDUCES:
        got = gnncompile.ops.spmm(ei, x, w, reduce)
        want = pyg.scatter(x[ei[0]] * w.view(-1, 1), ei[1], dim=0, dim_size=50, reduce=reduce)
        torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)
    sc = torch.randn(400, 2, device=DEV)
    torch.testing.assert_close(gnncompile.ops.edge_softmax(ei, sc, 50), pyg.softmax(sc, ei[1], num_nodes=50),
                               rtol=1e-5, atol=1e-6)


def test_fingerprint_matches_cpu_and_reference():
    for index in INDEX:
        t = torch.randint(-2**31, 2**31 - 1, (2, 300_001)).to(index)
        want = int(ops.fingerprint(t))
        assert int(ops.fingerprint(t.to(DEV))) == want
        assert int(reference.fingerprint(t.to(DEV))) == want
    empty = torch.empty(0, dtype=torch.long)
    assert int(ops.fingerprint(empty.to(DEV))) == int(ops.fingerprint(empty))


def test_structure_check_modes_on_cuda():
    """Default mode ("cpu"): a CUDA edge_index is trusted by its version counter, so a lookup
    never waits for the device; "all": a write through .data is seen (one wait per lookup)."""
    import torch_geometric.utils as pyg
    from gnncompile.ops import structure as cache

    ei = graph(50, 50, 400).to(DEV)
    x = torch.randn(50, 8, device=DEV)
    saved = cache.structure_check()
    try:
        cache.set_structure_check("cpu")
        gnncompile.ops.spmm(ei, x)
        torch.cuda.synchronize()
        torch.cuda.set_sync_debug_mode("error")
        try:
            gnncompile.ops.spmm(ei, x)
        finally:
            torch.cuda.set_sync_debug_mode(0)
        cache.set_structure_check("all")
        ei.data[0, :200] = 0
        want = pyg.scatter(x[ei[0]], ei[1], dim=0, dim_size=50, reduce="sum")
        torch.testing.assert_close(gnncompile.ops.spmm(ei, x), want, rtol=1e-5, atol=1e-5)
    finally:
        cache.set_structure_check(saved)


# =============================================================================== opcheck
def _opcheck_cases():
    ei = graph(12, 10, 80, self_loops=True, dup=True, isolated=2)
    s = structure(ei, 10)
    E = s[1].numel()
    x = torch.randn(12, 6, device=DEV, requires_grad=True)
    xh = torch.randn(12, 2, 3, device=DEV, requires_grad=True)
    w = torch.rand(E, device=DEV, requires_grad=True)
    wh = torch.rand(E, 2, device=DEV, requires_grad=True)
    cases = [
        (ops.build_csr, (ei[1].to(DEV), ei[0].to(DEV), 10, 12)),
        (ops.edge_dot, (*s, x.detach(), torch.randn(10, 6, device=DEV), 2, [])),
        (ops.edge_softmax, (s[0], s[2], torch.randn(E, 2, device=DEV, requires_grad=True), [])),
        (ops.edge_softmax_backward, (s[0], s[2], torch.rand(E, 2, device=DEV), torch.randn(E, 2, device=DEV), [])),
    ]
    for reduce in REDUCES:
        cases.append((ops.spmm, (*s, w, x, reduce, [])))
    cases.append((ops.spmm, (*s, wh, xh, "sum", [8, 4, 1, 5])))
    cases.append((ops.spmm, (*s, None, x, "max", [1, 32, 1, 1])))
    return cases


@pytest.mark.parametrize("case", range(10))
def test_opcheck(case):
    op, args = _opcheck_cases()[case]
    torch.library.opcheck(op, args)


# =============================================================================== gradcheck
@pytest.mark.parametrize("reduce", REDUCES)
@pytest.mark.parametrize("wmode", ["none", "scalar", "head"])
def test_spmm_gradcheck_float64(reduce, wmode):
    ei = graph(9, 7, 30, self_loops=True, isolated=1, seed=5)
    s = structure(ei, 7)
    E = s[1].numel()
    if wmode == "head":
        x = torch.randn(9, 2, 3, device=DEV, dtype=torch.float64, requires_grad=True)
        w = torch.randn(E, 2, device=DEV, dtype=torch.float64, requires_grad=True)
    else:
        x = torch.randn(9, 4, device=DEV, dtype=torch.float64, requires_grad=True)
        w = torch.randn(E, device=DEV, dtype=torch.float64, requires_grad=True) if wmode == "scalar" else None
    inputs = (x, w) if w is not None else (x,)

    def fn(*t):
        return ops.spmm(*s, t[1] if len(t) > 1 else None, t[0], reduce, [4, 8, 0, 3])[0]

    assert torch.autograd.gradcheck(fn, inputs, eps=1e-6, atol=1e-6)


def test_edge_softmax_gradcheck_float64():
    ei = graph(9, 7, 40, self_loops=True, isolated=1, seed=6)
    s = structure(ei, 7)
    sc = torch.randn(s[1].numel(), 3, device=DEV, dtype=torch.float64, requires_grad=True)
    assert torch.autograd.gradcheck(lambda t: ops.edge_softmax(s[0], s[2], t, [0, 0, 0, 2]), (sc,))


def test_public_spmm_gradcheck_float64():
    ei = graph(9, 9, 40, self_loops=True, seed=7).to(DEV)
    x = torch.randn(9, 3, device=DEV, dtype=torch.float64, requires_grad=True)
    w = torch.rand(40 + 9, device=DEV, dtype=torch.float64, requires_grad=True)
    assert torch.autograd.gradcheck(lambda a, b: gnncompile.ops.spmm(ei, a, b, "mean"), (x, w))


def test_every_index_float_combination_runs():
    # Touch every (index, dtype) instantiation once with a wide row (feature tiles > 1).
    for index, dtype in itertools.product(INDEX, FLOATS):
        s, w, x = spmm_inputs(dtype, index, wmode="scalar", C=300, N=12, M=9, E=60)
        close(ops.spmm(*s, w, x, "sum", [])[0], reference.spmm(*s, w, x, "sum")[0], dtype, scale=8.0)


# =============================================================================== fuzzing
try:
    from hypothesis import given, settings, strategies as st

    HAVE_HYPOTHESIS = True
except ImportError:  # pragma: no cover
    HAVE_HYPOTHESIS = False

if HAVE_HYPOTHESIS:

    @settings(max_examples=60, deadline=None)
    @given(
        num_src=st.integers(1, 40), num_dst=st.integers(1, 40), num_edges=st.integers(0, 300),
        feats=st.integers(1, 70), reduce=st.sampled_from(REDUCES), weighted=st.booleans(),
        lanes=st.sampled_from([0, 1, 2, 8, 32]), vec=st.sampled_from([0, 1, 2, 4]),
        items=st.sampled_from([0, 1, 2, 5, 64]), seed=st.integers(0, 2**16), hub=st.booleans(),
        index=st.sampled_from(INDEX),
    )
    def test_fuzz_spmm_and_softmax_against_reference(num_src, num_dst, num_edges, feats, reduce, weighted,
                                                     lanes, vec, items, seed, hub, index):
        ei = graph(num_src, num_dst, num_edges, seed=seed, hub=hub, index=index)
        s = ops.build_csr(ei[1].to(DEV), ei[0].to(DEV), num_dst, num_src)
        assert torch.equal(s[2].cpu(), ops.build_csr(ei[1], ei[0], num_dst, num_src)[2])
        g = torch.Generator().manual_seed(seed)
        x = torch.randn(num_src, feats, generator=g).to(DEV)
        w = torch.randn(num_edges, generator=g).to(DEV) if weighted else None
        knobs = [lanes, 0, vec, items]
        out, arg = ops.spmm(*s, w, x, reduce, knobs)
        ref, ref_arg = reference.spmm(*s, w, x, reduce)
        torch.testing.assert_close(out, ref, rtol=1e-5, atol=1e-5)
        if reduce in ("max", "min"):
            assert torch.equal(arg, ref_arg)
        sc = torch.randn(num_edges, 2, generator=g).to(DEV)
        torch.testing.assert_close(ops.edge_softmax(s[0], s[2], sc, knobs), reference.edge_softmax(s[0], s[2], sc),
                                   rtol=1e-5, atol=1e-6)
        gd = torch.randn(num_dst, feats, generator=g).to(DEV)
        torch.testing.assert_close(ops.edge_dot(*s, x, gd, 1, knobs), reference.edge_dot(*s, x, gd, 1),
                                   rtol=1e-5, atol=1e-4)
