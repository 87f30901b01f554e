"""The structure cache against edits it cannot see through the version counter (issue 14):
writes through ``.numpy()`` / ``.data``, and inference tensors, which have no version counter.
Also: the content fingerprint op those checks use, the switch that turns them off, and the
native record of trusted structures under a write that bypasses the version counter."""
from __future__ import annotations

import gc
import warnings
import weakref

import pytest
import torch

import gnncompile
from gnncompile.ops import edge_softmax, reference, spmm, structure

with warnings.catch_warnings():
    warnings.simplefilter("ignore")
    import torch_geometric.nn as gnn

ops = torch.ops.gnncompile
N, E, F = 30, 120, 8

EDITS = ("numpy", "data")


def _bypassing_write(ei: torch.Tensor, how: str, row: int, values: torch.Tensor) -> None:
    """ei[row, :len(values)] = values without moving ei's version counter."""
    before = ei._version
    if how == "numpy":
        ei.numpy()[row, :values.numel()] = values.numpy()
    else:
        ei.data[row, :values.numel()] = values
    assert ei._version == before  # the premise: the cache cannot see it by the version counter


def _graph(seed: int, n: int = N, e: int = E):
    g = torch.Generator().manual_seed(seed)
    return torch.randint(0, n, (2, e), generator=g), torch.randn(n, F, generator=g)


@pytest.fixture
def check_mode():
    """Restores the cache's check mode after a test that changes it."""
    saved = structure.structure_check()
    yield structure.set_structure_check
    structure.set_structure_check(saved)


# ----------------------------------------------------------------------------- the fingerprint op
@pytest.mark.parametrize("dtype", [torch.int64, torch.int32], ids=str)
@pytest.mark.parametrize("shape", [(0,), (1,), (2, 7), (2, 100_003)], ids=str)
def test_fingerprint_matches_reference(native, dtype, shape):
    g = torch.Generator().manual_seed(1)
    t = torch.randint(-2**31, 2**31 - 1, shape, generator=g).to(dtype)
    got = ops.fingerprint(t)
    assert got.shape == () and got.dtype == torch.int64
    assert int(got) == int(reference.fingerprint(t))
    assert int(ops.fingerprint(t.t().contiguous().t())) == int(got)  # a strided view: its values count


def test_fingerprint_sees_every_single_edit_and_a_swap(native):
    ei, _ = _graph(2, e=40)
    base = int(ops.fingerprint(ei))
    seen = {base}
    for i in range(ei.numel()):
        edited = ei.clone().view(-1)
        edited[i] += 1
        seen.add(int(ops.fingerprint(edited.view(2, -1))))
    assert len(seen) == ei.numel() + 1  # every edit changes it, and each differently
    swapped = ei.clone()
    swapped[0, [3, 4]] = torch.tensor([7, 9])
    other = swapped.clone()
    other[0, [3, 4]] = torch.tensor([9, 7])
    assert int(ops.fingerprint(swapped)) != int(ops.fingerprint(other))
    assert int(ops.fingerprint(ei[:, :0])) != int(ops.fingerprint(ei[:, :1] * 0))


def test_fingerprint_does_not_depend_on_the_thread_count(native):
    t = torch.randint(0, 1000, (2, 300_000))
    threads = torch.get_num_threads()
    try:
        torch.set_num_threads(1)
        one = int(ops.fingerprint(t))
    finally:
        torch.set_num_threads(threads)
    assert int(ops.fingerprint(t)) == one


def test_fingerprint_rejects_a_float_tensor():
    with pytest.raises(TypeError, match="unsupported index dtype"):
        ops.fingerprint(torch.ones(3))


# ----------------------------------------------------------------------------- writes that bypass the version counter
@pytest.mark.parametrize("how", EDITS)
def test_spmm_sees_a_write_that_bypasses_the_version_counter(fresh_cache, h, how):
    ei, x = _graph(3)
    torch.testing.assert_close(spmm(ei, x), h.expected_spmm(ei, x))
    _bypassing_write(ei, how, 0, torch.zeros(20, dtype=ei.dtype))  # sources: all edges from node 0
    _bypassing_write(ei, how, 1, torch.full((10,), 5, dtype=ei.dtype))
    torch.testing.assert_close(spmm(ei, x), h.expected_spmm(ei, x))
    torch.testing.assert_close(spmm(ei, x, reduce="max"), h.expected_spmm(ei, x, reduce="max"))
    info = structure.cache_info()
    assert info["builds"] == 2 and info["stale"] == 1 and info["entries"] == 1, info


@pytest.mark.parametrize("how", EDITS)
def test_edge_softmax_sees_a_write_that_bypasses_the_version_counter(fresh_cache, h, how):
    ei, _ = _graph(4)
    s = torch.randn(E, 2)
    edge_softmax(ei, s, N)
    _bypassing_write(ei, how, 1, torch.arange(30, dtype=ei.dtype) % 3)
    torch.testing.assert_close(edge_softmax(ei, s, N), h.expected_softmax(ei, s, N))


def test_switch_off_trusts_the_version_counter(fresh_cache, h, check_mode):
    """With the check off an identity hit is not confirmed: the bypassing write is missed (that
    is what the switch trades for the pass over edge_index); an in-place op is still seen."""
    ei, x = _graph(5)
    check_mode("off")
    before = spmm(ei, x)
    _bypassing_write(ei, "data", 0, torch.zeros(40, dtype=ei.dtype))
    torch.testing.assert_close(spmm(ei, x), before)  # stale, as documented
    ei[1, 0] = ei[1, 0].item()  # moves the version counter
    torch.testing.assert_close(spmm(ei, x), h.expected_spmm(ei, x))
    assert structure.cache_info()["stale"] == 0 and structure.cache_info()["check"] == "off"


def test_check_mode_setting_and_environment(monkeypatch, check_mode):
    with pytest.raises(ValueError, match="mode must be one of off, cpu, all"):
        check_mode("yes")
    for raw, mode in (("", "cpu"), ("0", "off"), ("off", "off"), ("1", "cpu"), ("2", "all"), ("ALL", "all")):
        monkeypatch.setenv("GNNCOMPILE_STRUCTURE_CHECK", raw)
        assert structure.check_mode_from_env() == mode
    monkeypatch.setenv("GNNCOMPILE_STRUCTURE_CHECK", "maybe")  # a clear error naming the variable
    with pytest.raises(gnncompile.config.ConfigError, match="GNNCOMPILE_STRUCTURE_CHECK='maybe'"):
        structure.check_mode_from_env()
    check_mode("all")
    assert gnncompile.ops.structure_check() == "all"


def _compiled_pair(kind: str):
    torch.manual_seed(0)
    if kind == "SAGE":
        model = gnn.models.GraphSAGE(F, 16, 2, 4)
    else:
        model = gnn.models.GIN(F, 16, 2, 4)
    return model, gnncompile.compile(model)


@pytest.mark.parametrize("kind", ["SAGE", "GIN"])
def test_compiled_model_sees_writes_that_bypass_the_version_counter(kind):
    """The compiled graphs' structure ops look edge_index up by identity, then by content: after
    an edit through .numpy() and one through .data the result is eager PyG's on the edited graph."""
    torch._dynamo.reset()
    model, compiled = _compiled_pair(kind)
    ei, x = _graph(6)
    torch.testing.assert_close(compiled(x, ei), model(x, ei))
    _bypassing_write(ei, "numpy", 0, torch.zeros(50, dtype=ei.dtype))
    torch.testing.assert_close(compiled(x, ei), model(x, ei))
    _bypassing_write(ei, "data", 1, torch.full((50,), 3, dtype=ei.dtype))
    out = compiled(x, ei)
    torch.testing.assert_close(out, model(x, ei))
    out.sum().backward()  # the backward structure (CSC) is the edited graph's too
    grads = [p.grad.clone() for p in compiled.parameters()]
    model.zero_grad()
    model(x, ei).sum().backward()
    for got, p in zip(grads, model.parameters()):
        torch.testing.assert_close(got, p.grad)


# ----------------------------------------------------------------------------- the native record of trusted structures
def test_trusted_structure_written_through_data_raises_not_crashes(native):
    """build_csr's output is trusted (not validated per call); a write through .data does not
    move its version counter, so it stays trusted, but the CPU kernels range-check every index
    as they read: IndexError / ValueError, never an out-of-bounds read."""
    ei, x = _graph(7, n=200, e=5000)
    for reduce in ("sum", "max"):
        rowptr, col, perm = ops.build_csr(ei[1], ei[0], 200, 200)
        col.data[4000] = 10**6
        with pytest.raises(IndexError, match="source index out of range"):
            ops.spmm(rowptr, col, perm, None, x, reduce, [])
        rowptr, col, perm = ops.build_csr(ei[1], ei[0], 200, 200)
        perm.data[123] = -7
        with pytest.raises(IndexError, match="perm holds an edge id outside"):
            ops.spmm(rowptr, col, perm, torch.rand(5000), x, reduce, [])
        rowptr, col, perm = ops.build_csr(ei[1], ei[0], 200, 200)
        rowptr.data[100] = 10**7
        with pytest.raises(ValueError, match="rowptr must be non-decreasing"):
            ops.spmm(rowptr, col, perm, None, x, reduce, [])


# ----------------------------------------------------------------------------- inference tensors
def _inference_graph(seed: int):
    with torch.inference_mode():
        ei, x = _graph(seed)
        ei, x = ei.clone(), x.clone()
    assert ei.is_inference() and x.is_inference()
    return ei, x


def test_ops_take_inference_tensors(fresh_cache, h):
    ei, x = _inference_graph(8)
    s = torch.randn(E, 2)
    for inside in (True, False):
        with torch.inference_mode(inside):
            torch.testing.assert_close(spmm(ei, x, reduce="mean"), h.expected_spmm(ei, x, reduce="mean"))
            torch.testing.assert_close(edge_softmax(ei, s, N), h.expected_softmax(ei, s, N))
    assert structure.cache_info()["builds"] == 1  # one structure, reused inside and outside


def test_inference_tensor_edited_in_place_is_seen_with_the_check_off(fresh_cache, h, check_mode):
    """An inference tensor has no version counter: an in-place edit is seen by its fingerprint,
    even with the check switched off for other tensors."""
    ei, x = _inference_graph(8)
    check_mode("off")
    with torch.inference_mode():
        spmm(ei, x)
        ei[0, :40] = 1
        torch.testing.assert_close(spmm(ei, x), h.expected_spmm(ei, x))
    assert structure.cache_info()["stale"] == 1


def test_structures_built_in_inference_mode_are_normal_tensors(fresh_cache):
    ei, x = _inference_graph(9)
    with torch.inference_mode():
        s = structure.structure(ei, N)
        t = s.transposed(N)
    assert not any(v.is_inference() for v in (s.rowptr, s.col, s.perm, *t))
    # so a later call with autograd may save them for backward
    xg = x.clone().requires_grad_()
    spmm(ei, xg).sum().backward()
    torch.testing.assert_close(xg.grad, torch.bincount(ei[0], minlength=N).float().view(-1, 1).expand(N, F))


@pytest.mark.parametrize("kind", ["GCN", "SAGE"])
def test_compiled_model_takes_inference_tensors(kind):
    torch._dynamo.reset()
    torch.manual_seed(0)
    model = gnn.models.GCN(F, 16, 2, 4) if kind == "GCN" else gnn.models.GraphSAGE(F, 16, 2, 4)
    compiled = gnncompile.compile(model)
    ei, x = _inference_graph(10)
    with torch.inference_mode():
        want = model(x, ei)
        torch.testing.assert_close(compiled(x, ei), want)
    with torch.no_grad():  # outside inference mode (with autograd, eager PyG refuses them too)
        torch.testing.assert_close(compiled(x, ei), want)
        torch.testing.assert_close(model(x, ei), want)


def test_cache_does_not_keep_an_inference_edge_index_alive(fresh_cache):
    ei, x = _inference_graph(11)
    ref = weakref.ref(ei)
    with torch.inference_mode():
        spmm(ei, x)
    assert len(fresh_cache) == 1
    del ei
    gc.collect()
    assert ref() is None and len(fresh_cache) == 0
