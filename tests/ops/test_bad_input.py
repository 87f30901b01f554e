"""Bad input raises a Python exception with a clear message; never a crash, never garbage.

After every test, a good call must still work (the autouse fixture checks it)."""
from __future__ import annotations

import os
import subprocess
import sys

import pytest
import torch

from gnncompile.ops import structure
from gnncompile.ops import edge_softmax, spmm

ops = torch.ops.gnncompile


@pytest.fixture(autouse=True)
def good_call_still_works(h):
    yield
    g = torch.Generator().manual_seed(99)
    ei = h.random_graph(7, 25, generator=g)
    x = torch.randn(7, 3, generator=g)
    w = torch.randn(25, generator=g)
    for reduce in ("sum", "max"):
        h.assert_close(spmm(ei, x, w, reduce=reduce), h.expected_spmm(ei, x, w, reduce))
    s = torch.randn(25, generator=g)
    h.assert_close(edge_softmax(ei, s, num_dst=7), h.expected_softmax(ei, s, 7))
    rowptr, col, perm = ops.build_csr(ei[1], ei[0], 7, 7)
    out, _ = ops.spmm(rowptr, col, perm, w, x, "mean", [])
    h.assert_close(out, h.expected_spmm(ei, x, w, "mean"))


X = torch.randn(4, 3)
EI = torch.tensor([[0, 1, 2], [1, 2, 3]])


# ----------------------------------------------------------------------------- indices
@pytest.mark.parametrize("index_dtype", (torch.int64, torch.int32), ids=str)
def test_source_index_out_of_range(index_dtype):
    ei = torch.tensor([[0, 4], [1, 2]], dtype=index_dtype)
    with pytest.raises(IndexError, match=r"edge_index\[0\] \(source\) holds index 4, out of range for 4"):
        spmm(ei, X)


@pytest.mark.parametrize("index_dtype", (torch.int64, torch.int32), ids=str)
def test_destination_index_out_of_range(index_dtype):
    ei = torch.tensor([[0, 1], [1, 4]], dtype=index_dtype)
    with pytest.raises(IndexError, match=r"edge_index\[1\] \(destination\) holds index 4\b.*out of range for 4"):
        spmm(ei, X)
    with pytest.raises(IndexError, match=r"edge_index\[1\] \(destination\) holds index 3\b.*out of range for 3"):
        spmm(torch.tensor([[0, 1], [1, 3]], dtype=index_dtype), X, num_dst=3)
    with pytest.raises(IndexError, match=r"edge_index\[1\] \(destination\) holds index 2\b.*out of range for 2"):
        edge_softmax(torch.tensor([[0, 1], [1, 2]], dtype=index_dtype), torch.randn(2), num_dst=2)


@pytest.mark.parametrize("index_dtype", (torch.int64, torch.int32), ids=str)
def test_negative_index(index_dtype):
    with pytest.raises(IndexError, match=r"edge_index\[0\] \(source\) holds the negative index -1"):
        spmm(torch.tensor([[0, -1], [1, 2]], dtype=index_dtype), X)
    with pytest.raises(IndexError, match=r"edge_index\[1\] \(destination\) holds the negative index -2"):
        spmm(torch.tensor([[0, 1], [1, -2]], dtype=index_dtype), X)
    with pytest.raises(IndexError, match=r"edge_index\[1\] \(destination\) holds the negative index -1"):
        edge_softmax(torch.tensor([[0, 1], [0, -1]], dtype=index_dtype), torch.randn(2))
    with pytest.raises(IndexError, match=r"edge_index\[0\] \(source\) holds the negative index -3"):
        edge_softmax(torch.tensor([[0, -3], [0, 1]], dtype=index_dtype), torch.randn(2))


def test_bad_call_does_not_poison_the_cache(h, fresh_cache):
    ei = torch.tensor([[0, 5], [1, 2]])
    with pytest.raises(IndexError, match="out of range for 4 source nodes"):
        spmm(ei, X)  # x too small for source 5
    x = torch.randn(6, 3)
    torch.testing.assert_close(spmm(ei, x, num_dst=4), h.expected_spmm(ei, x, None, "sum", 4))
    # a bad edge_index fixed in place works afterwards
    bad = torch.tensor([[0, 1], [1, 9]])
    with pytest.raises(IndexError, match="destination"):
        spmm(bad, X)
    bad[1, 1] = 3
    torch.testing.assert_close(spmm(bad, X), h.expected_spmm(bad, X))


def _native_build_csr() -> bool:
    return torch._C._dispatch_has_kernel_for_dispatch_key("gnncompile::build_csr", "CPU")


def test_int32_graph_too_large():
    if not _native_build_csr():
        pytest.skip("reference build_csr would try to allocate 2^31 rows in this process; "
                    "test_int32_graph_too_large_in_fallback covers it under a memory limit")
    ei = torch.tensor([[0, 1], [1, 2]], dtype=torch.int32)
    with pytest.raises(ValueError, match="too large for int32"):
        spmm(ei, X, num_dst=2**31)


INT32_SCRIPT = """
import resource, warnings
resource.setrlimit(resource.RLIMIT_AS, (8 << 30, 8 << 30))  # a failed check must not eat the machine
warnings.simplefilter("ignore")
import torch, gnncompile
from gnncompile.ops import spmm
assert not gnncompile.info()["native"]
try:
    spmm(torch.tensor([[0, 1], [1, 2]], dtype=torch.int32), torch.randn(4, 3), num_dst=2**31)
    print("no error")
except Exception as e:
    print(type(e).__name__ + ": " + str(e).splitlines()[0])
"""


@pytest.mark.skipif(sys.platform != "linux", reason="uses RLIMIT_AS to bound the attempt")
def test_int32_graph_too_large_in_fallback(tmp_path):
    """The reference path must refuse an int32 graph whose node count overflows int32 too."""
    env = dict(os.environ, GNNCOMPILE_DISABLE_NATIVE="1")
    env.pop("PYTHONPATH", None)
    proc = subprocess.run([sys.executable, "-c", INT32_SCRIPT], cwd=tmp_path, env=env,
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    result = proc.stdout.strip().splitlines()[-1]
    assert result.startswith("ValueError:") and "too large for int32" in result, result


# ----------------------------------------------------------------------------- shapes and types
@pytest.mark.parametrize("ei", [torch.zeros(3, 2, dtype=torch.long), torch.zeros(4, dtype=torch.long),
                                torch.zeros(2, 2, 1, dtype=torch.long), torch.zeros(1, 3, dtype=torch.long)],
                         ids=["3xE", "1d", "3d", "1xE"])
def test_edge_index_not_2_by_E(ei):
    with pytest.raises(ValueError, match=r"edge_index must have shape \[2, E\], got \[" + str(ei.size(0))):
        spmm(ei, X)
    with pytest.raises(ValueError, match=r"edge_index must have shape \[2, E\]"):
        edge_softmax(ei, torch.randn(ei.size(-1)))


@pytest.mark.parametrize("dtype", (torch.float32, torch.int16, torch.uint8, torch.bool), ids=str)
def test_edge_index_not_int32_or_int64(dtype):
    with pytest.raises(TypeError, match=rf"edge_index must be int64 or int32, got {dtype}"):
        spmm(EI.to(dtype), X)
    with pytest.raises(TypeError, match=r"edge_index must be int64 or int32"):
        edge_softmax(EI.to(dtype), torch.randn(3))


def test_edge_index_not_a_tensor():
    with pytest.raises(TypeError, match="edge_index must be a torch.Tensor, got list"):
        spmm([[0, 1], [1, 0]], X)


@pytest.mark.parametrize("shape", [(4,), (2,), (3, 1, 1), (0,)], ids=str)
def test_weight_wrong_length_or_rank(shape):
    with pytest.raises(ValueError, match=r"edge_weight must have shape \[E\] or \[E, H\] with E = 3"):
        spmm(EI, X, torch.randn(shape))


def test_weight_heads_need_x_with_heads():
    with pytest.raises(ValueError, match=r"edge_weight of shape \[3, 2\] needs x of shape \[N, 2, C\]"):
        spmm(EI, X, torch.randn(3, 2))
    with pytest.raises(ValueError, match=r"needs x of shape \[N, 2, C\], got \[4, 3, 5\]"):
        spmm(EI, torch.randn(4, 3, 5), torch.randn(3, 2))


def test_weight_dtype_mismatch():
    with pytest.raises(TypeError, match="edge_weight dtype torch.float64 does not match x dtype torch.float32"):
        spmm(EI, X, torch.randn(3, dtype=torch.float64))
    with pytest.raises(TypeError, match="edge_weight must be float32, float64, float16 or bfloat16"):
        spmm(EI, X, torch.ones(3, dtype=torch.long))


def test_x_not_float():
    with pytest.raises(TypeError, match="x must be float32, float64, float16 or bfloat16, got torch.int64"):
        spmm(EI, torch.ones(4, 3, dtype=torch.long))
    with pytest.raises(ValueError, match="x must have a node dimension"):
        spmm(EI, torch.tensor(1.0))


def test_device_mismatch():
    with pytest.raises(ValueError, match="edge_index is on cpu but the features are on meta"):
        spmm(EI, X.to("meta"))
    with pytest.raises(ValueError, match="edge_weight is on meta but x is on cpu"):
        spmm(EI, X, torch.randn(3, device="meta"))
    with pytest.raises(ValueError, match="edge_index is on meta but the features are on cpu"):
        spmm(EI.to("meta"), X)
    with pytest.raises(ValueError, match="edge_index is on cpu but the features are on meta"):
        edge_softmax(EI, torch.randn(3, device="meta"))


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device for a real mismatch")
def test_device_mismatch_cuda():
    with pytest.raises(ValueError, match="edge_index is on cpu but the features are on cuda"):
        spmm(EI, X.cuda())


@pytest.mark.parametrize("reduce", ["prod", "Sum", "", "amax"])
def test_unknown_reduce(reduce):
    with pytest.raises(ValueError, match=rf"unknown reduce '{reduce}'; expected one of sum, mean, max, min"):
        spmm(EI, X, reduce=reduce)


@pytest.mark.parametrize("num_dst", [-1, 2.5, "3", True])
def test_bad_num_dst(num_dst):
    with pytest.raises(ValueError, match="num_dst must be a non-negative int"):
        spmm(EI, X, num_dst=num_dst)
    with pytest.raises(ValueError, match="num_dst must be a non-negative int"):
        edge_softmax(EI, torch.randn(3), num_dst=num_dst)


@pytest.mark.parametrize("shape", [(4,), (2, 3), (), (0,)], ids=str)
def test_scores_wrong_length(shape):
    with pytest.raises(ValueError, match=r"scores must have E = 3 rows, got shape \["):
        edge_softmax(EI, torch.randn(shape))


def test_scores_not_float():
    with pytest.raises(TypeError, match="scores must be float32, float64, float16 or bfloat16"):
        edge_softmax(EI, torch.ones(3, dtype=torch.long))


# ----------------------------------------------------------------------------- raw ops, corrupted structure
@pytest.fixture
def native_ops():
    """The messages below are the native kernels' (the reference is checked separately)."""
    for op in ("build_csr", "spmm", "edge_dot", "edge_softmax", "edge_softmax_backward"):
        if not torch._C._dispatch_has_kernel_for_dispatch_key(f"gnncompile::{op}", "CPU"):
            pytest.skip(f"no native CPU kernel registered for gnncompile::{op}")
    return ops


def _structure():
    return ops.build_csr(EI[1], EI[0], 4, 4)  # rowptr [0,0,1,2,3], col [0,1,2], perm [0,1,2]


def test_raw_spmm_col_out_of_range(native_ops):
    rowptr, col, perm = _structure()
    for bad in ([0, 1, 7], [0, -1, 2], [4, 1, 2]):
        with pytest.raises(IndexError, match=r"gnncompile.spmm: source index out of range .* for 4 source nodes"):
            ops.spmm(rowptr, torch.tensor(bad), perm, None, X, "sum", [])
        with pytest.raises(IndexError, match=r"source index out of range"):
            ops.spmm(rowptr, torch.tensor(bad), perm, None, X, "max", [])


@pytest.mark.parametrize("rowptr", [[0, 0, 1, 2, 2], [1, 1, 2, 3, 3], [0, 0, 1, 2, 4], [0, 0, 1, 2, 10**6]],
                         ids=["short-end", "nonzero-start", "past-end", "huge-end"])
def test_raw_spmm_rowptr_not_spanning_edges(native_ops, rowptr):
    _, col, perm = _structure()
    with pytest.raises(ValueError, match=r"rowptr must start at 0 and end at the number of edges \(3\)"):
        ops.spmm(torch.tensor(rowptr), col, perm, None, X, "sum", [])


@pytest.mark.parametrize("rowptr", [[0, 2, 1, 3, 3], [0, 1000, 0, 3, 3], [0, -5, 1, 3, 3]])
def test_raw_spmm_rowptr_decreasing(native_ops, rowptr):
    _, col, perm = _structure()
    with pytest.raises(ValueError, match="rowptr must be non-decreasing"):
        ops.spmm(torch.tensor(rowptr), col, perm, torch.randn(3), X, "mean", [])


@pytest.mark.parametrize("perm", [[0, 1, 3], [0, -5, 2], [0, 1, 2**40]])
def test_raw_spmm_perm_out_of_range(native_ops, perm):
    rowptr, col, _ = _structure()
    with pytest.raises(IndexError, match=r"perm holds an edge id outside \[0, 3\)"):
        ops.spmm(rowptr, col, torch.tensor(perm), torch.randn(3), X, "sum", [])


def test_raw_spmm_inconsistent_structure(native_ops):
    rowptr, col, perm = _structure()
    with pytest.raises(ValueError, match="col and perm must be 1-D of the same length"):
        ops.spmm(rowptr, col[:2], perm, None, X, "sum", [])
    with pytest.raises(TypeError, match="rowptr, col and perm must share one index dtype"):
        ops.spmm(rowptr.int(), col, perm, None, X, "sum", [])
    with pytest.raises(ValueError, match="rowptr must be 1-D"):
        ops.spmm(rowptr[:0], col, perm, None, X, "sum", [])
    with pytest.raises(ValueError, match="rowptr must be 1-D"):
        ops.spmm(rowptr.view(1, -1), col, perm, None, X, "sum", [])
    with pytest.raises(ValueError, match="unknown reduce 'prod'"):
        ops.spmm(rowptr, col, perm, None, X, "prod", [])
    with pytest.raises(ValueError, match=r"weight must be \[E\] or \[E, H\] with E = 3"):
        ops.spmm(rowptr, col, perm, torch.randn(2), X, "sum", [])
    with pytest.raises(TypeError, match="weight dtype .* does not match x dtype"):
        ops.spmm(rowptr, col, perm, torch.randn(3).double(), X, "sum", [])
    with pytest.raises(TypeError, match="unsupported feature dtype"):
        ops.spmm(rowptr, col, perm, None, torch.ones(4, 3, dtype=torch.long), "sum", [])
    with pytest.raises(ValueError, match=r"a weight of shape \[E, 2\] needs x of shape \[N, 2, C\]"):
        ops.spmm(rowptr, col, perm, torch.randn(3, 2), X, "sum", [])


def test_raw_edge_softmax_corrupted(native_ops):
    rowptr, _, perm = _structure()
    with pytest.raises(ValueError, match=r"gnncompile.edge_softmax: rowptr must start at 0 and end at"):
        ops.edge_softmax(torch.tensor([0, 0, 1, 2, 9]), perm, torch.randn(3), [])
    with pytest.raises(ValueError, match=r"gnncompile.edge_softmax: scores must have E = 3 rows"):
        ops.edge_softmax(rowptr, perm, torch.randn(4), [])
    with pytest.raises(ValueError, match=r"edge_softmax_backward: out and grad shapes differ"):
        ops.edge_softmax_backward(rowptr, perm, torch.randn(3, 2), torch.randn(3, 1), [])


@pytest.mark.parametrize("op", ["edge_softmax", "edge_softmax_backward"])
def test_raw_edge_softmax_perm_out_of_range(native_ops, op):
    rowptr, _, _ = _structure()
    bad = torch.tensor([0, 1, 9])
    args = (torch.randn(3),) if op == "edge_softmax" else (torch.rand(3), torch.randn(3))
    # it must raise; the message should name perm (it is an edge id, not a source index)
    with pytest.raises(IndexError, match=rf"gnncompile.{op}: perm holds an edge id outside \[0, 3\)"):
        getattr(ops, op)(rowptr, bad, *args, [])


def test_raw_edge_dot_corrupted(native_ops):
    rowptr, col, perm = _structure()
    with pytest.raises(IndexError, match=r"gnncompile.edge_dot: source index out of range"):
        ops.edge_dot(rowptr, torch.tensor([0, 1, 9]), perm, X, X, 1, [])
    with pytest.raises(IndexError, match=r"gnncompile.edge_dot: perm holds an edge id outside"):
        ops.edge_dot(rowptr, col, torch.tensor([0, 1, 9]), X, X, 1, [])
    with pytest.raises(ValueError, match=r"g must be \[4, ...\]"):
        ops.edge_dot(rowptr, col, perm, X, X[:2], 1, [])
    with pytest.raises(ValueError, match=r"heads \(2\) must divide the feature count \(3\)"):
        ops.edge_dot(rowptr, col, perm, X, X, 2, [])


def test_raw_build_csr_bad_input(native_ops):
    with pytest.raises(ValueError, match="node counts must be non-negative"):
        ops.build_csr(EI[1], EI[0], -1, 4)
    with pytest.raises(ValueError, match="dst and src must be 1-D of the same length"):
        ops.build_csr(EI[1], EI[0][:2], 4, 4)
    with pytest.raises(TypeError, match="dst and src must share one dtype"):
        ops.build_csr(EI[1], EI[0].int(), 4, 4)
    with pytest.raises(TypeError, match="unsupported index dtype"):
        ops.build_csr(EI[1].float(), EI[0].float(), 4, 4)
    with pytest.raises(IndexError, match=r"edge_index\[1\] \(destination\) holds index 3 at edge 2"):
        ops.build_csr(EI[1], EI[0], 3, 4)
    with pytest.raises(IndexError, match=r"edge_index\[0\] \(source\) holds index 2 at edge 2"):
        ops.build_csr(EI[1], EI[0], 4, 2)


def test_cache_state_is_consistent_after_errors(fresh_cache):
    for bad in (torch.tensor([[0, 1], [1, 9]]), torch.tensor([[0, -1], [1, 0]])):
        with pytest.raises(IndexError):
            spmm(bad, X)
    assert structure.cache_info()["builds"] == 0


DUP_PERM_CASES = {
    # a perm in range that repeats an edge id (and so misses another)
    "edge_softmax": lambda r, c, p: (r, torch.tensor([0, 0, 2]), torch.randn(3)),
    "edge_softmax_backward": lambda r, c, p: (r, torch.tensor([1, 1, 1]), torch.rand(3), torch.randn(3)),
    "edge_dot": lambda r, c, p: (r, c, torch.tensor([2, 0, 2]), X, X, 1),
    # all zeros: in range, but two of the three outputs would never be written
    "edge_softmax-zeros": lambda r, c, p: (r, torch.zeros(3, dtype=p.dtype), torch.randn(3)),
    "edge_softmax_backward-zeros": lambda r, c, p: (r, torch.zeros(3, dtype=p.dtype), torch.rand(3),
                                                    torch.randn(3)),
    "edge_dot-zeros": lambda r, c, p: (r, c, torch.zeros(3, dtype=p.dtype), X, X, 1),
}


@pytest.mark.parametrize("impl", ["registered", "reference"])
@pytest.mark.parametrize("name", sorted(DUP_PERM_CASES))
def test_perm_that_repeats_an_edge_id_raises(name, impl):
    """edge_softmax and edge_dot write out[perm[j]] for every CSR slot: a repeated edge id would
    leave another output unwritten (uninitialised memory returned)."""
    from gnncompile.ops import reference

    args = DUP_PERM_CASES[name](*_structure())
    op = name.split("-")[0]
    with pytest.raises(IndexError, match="exactly once"):
        if impl == "registered":
            getattr(ops, op)(*args, [])
        else:
            getattr(reference, op)(*args)


def test_a_trusted_structure_changed_in_place_is_checked_again(native_ops):
    """build_csr's output is known to be valid (checked once, not per call); changing it in
    place moves its version counter, and the next call checks it again. A copy made by
    clone_structure is known to be valid too, until it is changed."""
    rowptr, col, perm = _structure()
    s = torch.randn(3)
    ops.edge_softmax(rowptr, perm, s, [])
    perm[2] = perm[0]
    with pytest.raises(IndexError, match="exactly once"):
        ops.edge_softmax(rowptr, perm, s, [])
    r2, c2, p2 = ops.clone_structure(list(_structure()))
    torch.testing.assert_close(ops.edge_softmax(r2, p2, s, []), ops.edge_softmax(*_structure()[::2], s, []))
    p2[1] = p2[0]
    with pytest.raises(IndexError, match="exactly once"):
        ops.edge_dot(r2, c2, p2, X, X, 1, [])


REF_CASES = {
    # name: (function, args) with rowptr [0,0,1,2,3], col [0,1,2], perm [0,1,2] as the valid structure
    "spmm-col-oob": ("spmm", lambda r, c, p: (r, torch.tensor([0, 1, 7]), p, None, X, "sum")),
    "spmm-col-neg": ("spmm", lambda r, c, p: (r, torch.tensor([0, -1, 2]), p, None, X, "max")),
    "spmm-rowptr-short": ("spmm", lambda r, c, p: (torch.tensor([0, 0, 1, 2, 2]), c, p, None, X, "sum")),
    "spmm-rowptr-long": ("spmm", lambda r, c, p: (torch.tensor([0, 0, 1, 2, 10**6]), c, p, None, X, "max")),
    "spmm-rowptr-decreasing": ("spmm", lambda r, c, p: (torch.tensor([0, 2, 1, 3, 3]), c, p, None, X, "mean")),
    "spmm-perm-oob": ("spmm", lambda r, c, p: (r, c, torch.tensor([0, 1, 3]), torch.randn(3), X, "sum")),
    "spmm-perm-minus-one": ("spmm", lambda r, c, p: (r, c, torch.tensor([0, -1, 2]), torch.randn(3), X, "sum")),
    "softmax-perm-oob": ("edge_softmax", lambda r, c, p: (r, torch.tensor([0, 1, 9]), torch.randn(3))),
    "softmax-perm-minus-one": ("edge_softmax", lambda r, c, p: (r, torch.tensor([0, -1, 2]), torch.randn(3))),
    "softmax-rowptr": ("edge_softmax", lambda r, c, p: (torch.tensor([0, 0, 1, 2, 9]), p, torch.randn(3))),
    "softmax-bw-perm-minus-one": ("edge_softmax_backward",
                                  lambda r, c, p: (r, torch.tensor([0, -1, 2]), torch.rand(3), torch.randn(3))),
    "edge-dot-col-oob": ("edge_dot", lambda r, c, p: (r, torch.tensor([0, 1, 9]), p, X, X, 1)),
    "edge-dot-perm-minus-one": ("edge_dot", lambda r, c, p: (r, c, torch.tensor([0, -1, 2]), X, X, 1)),
}


@pytest.mark.parametrize("case", sorted(REF_CASES))
def test_reference_ops_raise_on_corrupted_structure(case):
    """The pure-torch fallback must also refuse a corrupted structure (torch's own messages are
    acceptable here) instead of wrapping a negative index around or returning garbage."""
    from gnncompile.ops import reference

    name, make_args = REF_CASES[case]
    with pytest.raises((IndexError, ValueError, RuntimeError)):
        getattr(reference, name)(*make_args(*_structure()))


@pytest.mark.parametrize("case", sorted(REF_CASES))
def test_registered_ops_raise_on_corrupted_structure(case):
    """Whatever kernel is registered (native or reference) raises rather than crashing."""
    name, make_args = REF_CASES[case]
    with pytest.raises((IndexError, ValueError, RuntimeError)):
        getattr(ops, name)(*make_args(*_structure()), [])
