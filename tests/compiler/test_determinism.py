"""Every op the compiled models run gives the same bits, forward and backward, on every run
and for any number of threads (the documented promise): each case runs 5 times on 2 threads
and 5 times on 1 thread, and all 10 results are compared bit for bit. Graphs are large enough
that the kernels split their rows over both threads, and have duplicate edges (max / min
ties) and NaN (max / min rows that take torch's formula) where that matters."""
from __future__ import annotations

import pytest
import torch

import gnncompile  # noqa: F401  (loads the ops)
from gnncompile.ops import program as P

ops = torch.ops.gnncompile
N, E, F, H = 3000, 36000, 16, 4


def _graph(seed=0):
    g = torch.Generator().manual_seed(seed)
    src = torch.randint(0, N, (E,), generator=g)
    dst = (torch.randint(0, N, (E,), generator=g) ** 1).clamp(max=N - 2)  # node N - 1 has no in-edge
    dst[: E // 10] = dst[E // 10: 2 * (E // 10)]  # duplicate edges: ties for max / min
    src[: E // 10] = src[E // 10: 2 * (E // 10)]
    return torch.stack([src, dst]), g


def _bits(t: torch.Tensor) -> torch.Tensor:
    if t.is_floating_point():
        return t.contiguous().view(torch.int64 if t.element_size() == 8 else torch.int32
                                   if t.element_size() == 4 else torch.int16)
    return t


def _same_bits(a, b) -> bool:
    return len(a) == len(b) and all(x.shape == y.shape and torch.equal(_bits(x), _bits(y)) for x, y in zip(a, b))


def _grads(outs, leaves, seed=1):
    g = torch.Generator().manual_seed(seed)
    gs = [torch.randn(o.shape, generator=g, dtype=o.dtype) for o in outs]
    return list(torch.autograd.grad(outs, leaves, gs, allow_unused=True))


def case_spmm(reduce, weight):
    def run():
        ei, g = _graph()
        x = torch.randn(N, H, F // H, generator=g) if weight == "head" else torch.randn(N, F, generator=g)
        x[5, 0] = float("nan")
        x.requires_grad_()
        w = None
        if weight == "edge":
            w = torch.rand(E, generator=g).requires_grad_()
        elif weight == "head":
            w = torch.rand(E, H, generator=g).requires_grad_()
        rowptr, col, perm = ops.build_csr(ei[1], ei[0], N, N)
        rt, ct, pt = ops.build_csr(ei[0], ei[1], N, N)
        out, arg = ops.spmm(rowptr, col, perm, w, x, reduce, [], rt, ct, pt)
        return [out, arg] + [t for t in _grads([out], [x] + ([w] if w is not None else [])) if t is not None]
    return run


def case_edge_softmax():
    def run():
        ei, g = _graph()
        s = torch.randn(E, H, generator=g, requires_grad=True)
        rowptr, col, perm = ops.build_csr(ei[1], ei[0], N, N)
        a = ops.edge_softmax(rowptr, perm, s, [])
        return [a] + _grads([a], [s])
    return run


def case_edge_dot_and_gather():
    def run():
        ei, g = _graph()
        x = torch.randn(N, F, generator=g, requires_grad=True)
        go = torch.randn(N, F, generator=g, requires_grad=True)
        rowptr, col, perm = ops.build_csr(ei[1], ei[0], N, N)
        d = ops.edge_dot(rowptr, col, perm, x, go, 1, [])
        xe = ops.gather(x, ei[1], rowptr, perm, [])
        return [d, xe] + _grads([d, xe], [x, go])
    return run


PROGRAMS = {  # (expression over inputs 0 = x_j, 1 = x_i, 2 = edge, 3 = param) ; sides
    "tanh-mul": P.node("mul", P.node("tanh", P.inp(0)), P.node("add", P.inp(2), P.inp(3))),
    "relu-sub-div": P.node("div", P.node("relu", P.node("sub", P.inp(0), P.inp(1))),
                           P.node("add", P.node("abs", P.inp(3)), P.const(1.0))),
}


def case_program(reduce, name):
    def run():
        ei, g = _graph()
        x = torch.randn(N, F, generator=g)
        x[7, 1] = float("nan")
        x.requires_grad_()
        e = torch.randn(E, F, generator=g, requires_grad=True)
        p = torch.randn(1, F, generator=g, requires_grad=True)
        rowptr, col, perm = ops.build_csr(ei[1], ei[0], N, N)
        code, consts = P.encode(PROGRAMS[name])
        ins, sides = [x, x, e, p], [P.COL, P.ROW, P.EDGE, P.CONST]
        if reduce == "edges":
            out = ops.message_edges(rowptr, col, perm, ins, sides, code, consts, F, F, False, [], [], None)
            res = [out]
        else:
            out, arg = ops.message_reduce(rowptr, col, perm, ins, sides, code, consts, F, reduce, [], [], None)
            res = [out, arg]
        return res + _grads([out], [x, e, p])
    return run


def case_dropout():
    def run():
        x = torch.randn(2000, 300, generator=torch.Generator().manual_seed(0), requires_grad=True)
        y = ops.dropout(x, 0.3, torch.tensor(17))
        return [y] + _grads([y], [x])
    return run


def case_build_csr_and_fingerprint():
    def run():
        ei, _ = _graph()
        return list(ops.build_csr(ei[1], ei[0], N, N)) + [ops.fingerprint(ei)]
    return run


def case_neighbor_sample():
    def run():
        from gnncompile.data import NeighborSampler
        from torch_geometric.data import Data
        from torch_geometric.sampler import NodeSamplerInput

        ei, _ = _graph()
        data = Data(edge_index=ei, num_nodes=N)
        s = NeighborSampler(data, [10, 5], seed=3)
        out = s.sample_from_nodes(NodeSamplerInput(None, torch.arange(0, N, 7)))
        return [out.node, out.row, out.col, out.edge]
    return run


CASES = {
    **{f"spmm-{r}-{w}": case_spmm(r, w) for r in ("sum", "mean", "max", "min") for w in ("none", "edge", "head")},
    "edge_softmax": case_edge_softmax(),
    "edge_dot+gather": case_edge_dot_and_gather(),
    **{f"program-{r}-{n}": case_program(r, n) for r in ("sum", "mean", "max", "min", "edges") for n in PROGRAMS},
    "dropout": case_dropout(),
    "build_csr+fingerprint": case_build_csr_and_fingerprint(),
    "neighbor_sample": case_neighbor_sample(),
}


@pytest.mark.parametrize("name", list(CASES))
def test_bitwise_equal_across_runs_and_threads(name):
    run = CASES[name]
    threads = torch.get_num_threads()
    results = []
    try:
        for t in (2, 1):
            torch.set_num_threads(t)
            for _ in range(5):
                results.append([r.detach().clone() for r in run()])
    finally:
        torch.set_num_threads(threads)
    first = results[0]
    for i, r in enumerate(results[1:], 1):
        assert _same_bits(first, r), f"run {i} ({'2' if i < 5 else '1'} thread(s)) differs from the first"
