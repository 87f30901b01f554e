"""gnncompile::extreme_edges_backward: torch's max / min gradient of per-edge messages (messages
computed beforehand, then reduced: EdgeCNN's max over its MLP's output) in one pass per row, against
torch's own scatter_reduce amax / amin gradient (ties, NaN, infinities, empty rows, a zero extreme),
the reference, opcheck and bad input; and the message programs' backward that calls it."""
from __future__ import annotations

import pytest
import torch

from gnncompile.ops import _native
from gnncompile.ops import extremes, reference
from gnncompile.ops import program as P
from shared import _fresh_dynamo  # noqa: F401  (autouse)

ops = torch.ops.gnncompile
NATIVE = pytest.mark.skipif(not _native.native_loaded(), reason="native module not built")
RULE = extremes.torch_rule()


def _graph(M=9, E=70, seed=0, index_dtype=torch.int64):
    """Destinations of E edges (unsorted), the last two rows empty, with runs of duplicate
    destinations; the CSR (rowptr, perm) by destination."""
    g = torch.Generator().manual_seed(seed)
    dst = torch.randint(0, M - 2, (E,), generator=g)
    src = torch.randint(0, M, (E,), generator=g)
    rowptr, col, perm = ops.build_csr(dst.to(index_dtype), src.to(index_dtype), M, M)
    _graph.col = col  # the CSR's sources, for message_reduce
    return dst, rowptr, perm


def _messages(E, F, dtype, seed=0, special=True):
    """Messages with ties (values from a small set), and where ``special`` NaN, +-inf, 0 and -0."""
    g = torch.Generator().manual_seed(seed + 1)
    m = torch.randint(-3, 3, (E, F), generator=g).to(dtype) / 2
    if special:
        m[3, 1] = float("nan")
        m[5, :] = float("-inf")
        m[7, 2] = float("inf")
        m[11, 0] = -0.0
        m[:, -1] = 0.0  # every message of the last feature 0: a tie at the extreme 0
    return m


def _torch_grad(dst, M, m, grad, reduce):
    """torch's gradient, PyG's spelling: scatter_reduce into zeros with include_self=False."""
    E, F = m.shape
    src = m.clone().requires_grad_()
    with torch.enable_grad():
        out = torch.zeros(M, F, dtype=m.dtype).scatter_reduce(0, dst.view(-1, 1).expand(E, F), src,
                                                              "amax" if reduce == "max" else "amin",
                                                              include_self=False)
        g, = torch.autograd.grad(out, src, grad)
    return out.detach(), g


def _slot_order(m, perm):
    return m.index_select(0, perm.long())


def _same(a, b):
    torch.testing.assert_close(a, b, rtol=0, atol=0, equal_nan=True)
    assert torch.equal(torch.signbit(a), torch.signbit(b))  # -0.0 vs 0.0 too


def _grad(M, F, dtype, seed=0, special=False):
    g = torch.randn(M, F, generator=torch.Generator().manual_seed(seed + 2), dtype=torch.float64).to(dtype)
    if special:
        g[0, 0] = float("inf")
        g[1, 1] = float("nan")
        g[2, 2] = 0.0
    return g


def _op(impl):
    return ops.extreme_edges_backward if impl == "native" else reference.extreme_edges_backward


IMPLS = [pytest.param("native", marks=NATIVE), "reference"]


@pytest.mark.parametrize("impl", IMPLS)
@pytest.mark.parametrize("by_slot", [False, True], ids=["edge-order", "slot-order"])
@pytest.mark.parametrize("reduce", ["max", "min"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64], ids=["float32", "float64"])
@pytest.mark.parametrize("special", [False, True], ids=["finite", "special"])
def test_equals_torch(impl, by_slot, reduce, dtype, special):
    M, F = 9, 5
    dst, rowptr, perm = _graph(M)
    E = dst.numel()
    m = _messages(E, F, dtype, special=special)
    grad = _grad(M, F, dtype, special=special)
    out, expect = _torch_grad(dst, M, m, grad, reduce)
    msg = _slot_order(m, perm) if by_slot else m
    got = _op(impl)(rowptr, perm, msg, out, grad, by_slot, *RULE, [])
    _same(got, _slot_order(expect, perm) if by_slot else expect)


@NATIVE
@pytest.mark.parametrize("index_dtype", [torch.int32, torch.int64])
@pytest.mark.parametrize("threads", [1, 2])
def test_native_equals_reference_larger(index_dtype, threads):
    """A power-law-ish graph with hub rows, wide features, several chunks per thread."""
    M, E, F = 300, 4000, 70
    g = torch.Generator().manual_seed(3)
    dst = (torch.rand(E, generator=g) ** 3 * (M - 5)).long()  # skewed, the last rows empty
    src = torch.randint(0, M, (E,), generator=g)
    rowptr, _, perm = ops.build_csr(dst.to(index_dtype), src.to(index_dtype), M, M)
    m = torch.randint(-50, 50, (E, F), generator=g).float() / 7
    grad = torch.randn(M, F, generator=g)
    out, expect = _torch_grad(dst, M, m, grad, "max")
    old = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        got = ops.extreme_edges_backward(rowptr, perm, m, out, grad, False, *RULE, [2])
    finally:
        torch.set_num_threads(old)
    _same(got, expect)
    _same(got, reference.extreme_edges_backward(rowptr, perm, m, out, grad, False, *RULE))


@pytest.mark.parametrize("impl", IMPLS)
@pytest.mark.parametrize("E", [0, 4])
def test_no_edges_and_empty_rows(impl, E):
    """No edge at all, or every edge in one row: the others read nothing and write nothing."""
    M, F = 6, 3
    dst = torch.full((E,), 2, dtype=torch.long)
    rowptr, _, perm = ops.build_csr(dst, dst, M, M)
    m = torch.randn(E, F, dtype=torch.float64)
    grad = torch.randn(M, F, dtype=torch.float64)
    out, expect = _torch_grad(dst, M, m, grad, "max")
    got = _op(impl)(rowptr, perm, m, out, grad, False, *RULE, [])
    assert got.shape == (E, F)
    _same(got, expect)


def test_rule_arguments():
    """count_zeros and nan_gives_nan change the shares as documented (not only torch's rule)."""
    rowptr = torch.tensor([0, 2, 4])
    perm = torch.arange(4)
    m = torch.tensor([[0.0], [-1.0], [float("nan")], [1.0]])
    out = torch.tensor([[0.0], [float("nan")]])
    grad = torch.tensor([[1.0], [1.0]])
    for count_zeros in (False, True):
        for nan_gives_nan in (False, True):
            r = reference.extreme_edges_backward(rowptr, perm, m, out, grad, False, count_zeros, nan_gives_nan)
            assert r[0, 0] == (0.5 if count_zeros else 1.0) and r[1, 0] == 0.0
            assert bool(torch.isnan(r[2:]).all()) == nan_gives_nan
            if not nan_gives_nan:
                assert torch.equal(r[2:], torch.zeros(2, 1))
            if _native.native_loaded():
                _same(ops.extreme_edges_backward(rowptr, perm, m, out, grad, False, count_zeros, nan_gives_nan, []),
                      r)


@pytest.mark.parametrize("impl", IMPLS)
def test_bad_input_raises(impl):
    fn = _op(impl)
    dst, rowptr, perm = _graph()
    E, M, F = dst.numel(), rowptr.numel() - 1, 4
    m = torch.randn(E, F)
    out, grad = torch.randn(M, F), torch.randn(M, F)
    with pytest.raises(ValueError, match="messages must be"):
        fn(rowptr, perm, m[:-1], out, grad, False, *RULE, [])
    with pytest.raises(ValueError, match="out must be"):
        fn(rowptr, perm, m, out[:, :2], grad, False, *RULE, [])
    with pytest.raises(ValueError, match="grad must be"):
        fn(rowptr, perm, m, out, grad[1:], False, *RULE, [])
    with pytest.raises(TypeError, match="float32 or float64"):
        fn(rowptr, perm, m.half(), out.half(), grad.half(), False, *RULE, [])
    with pytest.raises(TypeError, match="float32 or float64"):
        fn(rowptr, perm, m, out.double(), grad, False, *RULE, [])
    with pytest.raises(IndexError, match="perm|out of range"):  # the reference: _edge_rows' words
        bad = perm.clone()
        bad[0] = E + 3
        fn(rowptr, bad, m, out, grad, False, *RULE, [])
    with pytest.raises(IndexError, match="permutation"):
        bad = perm.clone()
        bad[0] = bad[1]
        fn(rowptr, bad, m, out, grad, False, *RULE, [])
    with pytest.raises(ValueError, match="rowptr"):
        bad = rowptr.clone()
        bad[-1] = E - 1
        fn(bad, perm, m, out, grad, False, *RULE, [])


@NATIVE
def test_opcheck():
    dst, rowptr, perm = _graph()
    E, M, F = dst.numel(), rowptr.numel() - 1, 4
    m = _messages(E, F, torch.float64, special=False)
    out, _ = _torch_grad(dst, M, m, torch.zeros(M, F, dtype=torch.float64), "max")
    grad = torch.randn(M, F, dtype=torch.float64)
    for by_slot in (False, True):  # finite messages consistent with out: no NaN (opcheck compares NaN unequal)
        msg = _slot_order(m, perm) if by_slot else m
        torch.library.opcheck(ops.extreme_edges_backward.default, (rowptr, perm, msg, out, grad, by_slot, *RULE, []),
                              test_utils=("test_schema", "test_faketensor", "test_aot_dispatch_static"))


def _load_program():
    return [list(v) for v in P.encode(P.inp(0))]


@pytest.mark.parametrize("side", [P.EDGE, P.SLOT], ids=["edge", "slot"])
@pytest.mark.parametrize("reduce", ["max", "min"])
def test_message_reduce_backward_uses_it(side, reduce):
    """A program that loads per-edge messages: message_reduce's backward is this op's one pass,
    and gives torch's gradient (ties, NaN and infinities in the messages)."""
    M, F = 9, 5
    dst, rowptr, perm = _graph(M)
    E = dst.numel()
    m = _messages(E, F, torch.float64)
    grad = _grad(M, F, torch.float64, special=True)
    _, expect = _torch_grad(dst, M, m, grad, reduce)
    code, consts = _load_program()
    src = (m if side == P.EDGE else _slot_order(m, perm)).clone().requires_grad_()
    with torch.profiler.profile() as prof:
        out, _ = ops.message_reduce(rowptr, _graph.col, perm, [src], [side], code, consts, F, reduce,
                                    [], [], None)
        got, = torch.autograd.grad(out, src, grad)
    assert any(e.name == "gnncompile::extreme_edges_backward" for e in prof.events())
    _same(got, expect if side == P.EDGE else _slot_order(expect, perm))
