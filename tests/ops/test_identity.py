"""The one identity rule of the compiled path's caches (gnncompile/ops/identity.py): each way a
tensor can change, the helper's verdict on it, and the structure cache, the hoisted results and
the native record of trusted structures acting on that verdict alike.

The tests under "where the copies of the rule disagreed" fail on the code before the rule was
made one (each says what the old code did)."""
from __future__ import annotations

import gc
import threading

import pytest
import torch

import gnncompile
from gnncompile.ops import hoisted, spmm, structure

ops = torch.ops.gnncompile
N, E = 30, 120


def _graph(seed: int = 0, n: int = N, e: int = E):
    g = torch.Generator().manual_seed(seed)
    return torch.randint(0, n, (2, e), generator=g), torch.randn(n, 4, generator=g)


@pytest.fixture
def identity():
    from gnncompile.ops import identity

    return identity


@pytest.fixture
def check_mode():
    saved = structure.structure_check()
    yield structure.set_structure_check
    structure.set_structure_check(saved)


def _verdict(identity, t, before, mode="cpu"):
    return before.compare(identity.Look(t, mode))


# ----------------------------------------------------------------------------- the helper, case by case
@pytest.mark.parametrize("mode", ["off", "cpu", "all"])
def test_an_unchanged_tensor_is_the_same(identity, mode):
    ei, _ = _graph()
    rec = identity.Identity(identity.Look(ei, mode))
    assert _verdict(identity, ei, rec, mode) == identity.SAME
    ei.sum(), ei[0].clone(), ei.t()  # reading it, and views of it, change nothing
    assert _verdict(identity, ei, rec, mode) == identity.SAME


@pytest.mark.parametrize("how", ["setitem", "add_", "through a view", "copy_", "resize_", "set_"])
def test_an_in_place_op_moves_it(identity, how):
    ei, _ = _graph()
    rec = identity.Identity(identity.Look(ei, "off"))
    if how == "setitem":
        ei[0, 0] = ei[0, 0] + 1
    elif how == "add_":
        ei.add_(1)
    elif how == "through a view":
        ei[1].fill_(0)
    elif how == "copy_":
        ei.copy_(ei.flip(1))
    elif how == "resize_":
        ei.resize_(2, E // 2)
    else:
        ei.set_(ei.clone())
    assert _verdict(identity, ei, rec, "off") == identity.MOVED


def test_a_version_bump_alone_moves_it(identity):
    """The same content, a moved version counter: the rule does not look past the counter."""
    ei, _ = _graph()
    rec = identity.Identity(identity.Look(ei, "cpu"))
    torch.autograd.graph.increment_version(ei)
    assert _verdict(identity, ei, rec) == identity.MOVED


def test_another_tensor_of_the_same_state_is_other(identity):
    """A view of all of ei has its version counter (shared), data pointer, shape, strides, dtype
    and device: only the weak reference tells it apart."""
    ei, _ = _graph()
    rec = identity.Identity(identity.Look(ei, "cpu"))
    alias = ei.view_as(ei)
    assert identity.Look(alias, "cpu").state == identity.Look(ei, "cpu").state
    assert _verdict(identity, alias, rec) == identity.OTHER


def test_a_freed_tensor_whose_id_and_memory_are_reused_is_other(identity):
    """on_death runs once, with the key, when the tensor dies; a tensor made afterwards over the
    same memory, with the same state (the same address, version counter, shape, strides, dtype
    and device: both are views of one buffer) and, often, the same id, is another tensor."""
    buf = torch.randint(0, N, (4 * E,), generator=torch.Generator().manual_seed(1))
    ei = buf[: 2 * E].view(2, E)
    died = []
    rec = identity.Identity(identity.Look(ei, "off"), died.append)
    key = id(ei)
    assert rec.key == key
    del ei
    gc.collect()
    assert died == [key] and rec.ref() is None
    again = buf[: 2 * E].view(2, E)
    look = identity.Look(again, "off")
    assert look.state == rec.state  # nothing but the object tells them apart
    assert rec.compare(look) == identity.OTHER
    assert rec.compare(identity.Look(again, "cpu")) == identity.OTHER  # the same content, too


def test_dropping_an_identity_first_never_runs_on_death(identity):
    ei, _ = _graph()
    died = []
    rec = identity.Identity(identity.Look(ei, "off"), died.append)
    del rec
    del ei
    gc.collect()
    assert died == []


@pytest.mark.parametrize("how", ["other storage", "same memory, other shape", "same memory, transposed",
                                 "same memory, other dtype"])
def test_a_data_swap_moves_it(identity, how):
    """``ei.data = other`` keeps the version counter (and the object): the data pointer moves,
    or, for the same memory seen otherwise, the shape, the strides or the dtype."""
    ei, _ = _graph()
    rec = identity.Identity(identity.Look(ei, "off"))
    v, p = ei._version, ei.data_ptr()
    if how == "other storage":
        ei.data = ei.data.clone()
    elif how == "same memory, other shape":
        ei.data = ei.data[:, : E // 2]
    elif how == "same memory, transposed":
        ei.data = ei.data.reshape(E, 2).t()
    else:  # the same shape and strides, read as int32 (low and high words of the first half)
        ei.data = ei.data.view(torch.int32).as_strided((2, E), (E, 1))
    assert ei._version == v and (how == "other storage") == (ei.data_ptr() != p)  # the premise
    assert _verdict(identity, ei, rec, "off") == identity.MOVED


@pytest.mark.parametrize("how", ["numpy", "data"])
def test_the_fingerprint_catches_a_write_that_moves_nothing(identity, how):
    ei, _ = _graph()
    recs = {m: identity.Identity(identity.Look(ei, m)) for m in ("off", "cpu", "all")}
    state = identity.Look(ei, "off").state
    if how == "numpy":
        ei.numpy()[0, :10] = 0
    else:
        ei.data[1, :10] = 1
    assert identity.Look(ei, "off").state == state  # the premise: only the content changed
    assert _verdict(identity, ei, recs["cpu"], "cpu") == identity.REWRITTEN
    assert _verdict(identity, ei, recs["all"], "all") == identity.REWRITTEN
    assert _verdict(identity, ei, recs["off"], "off") == identity.SAME  # missed, as documented
    # an identity made without the check recorded the fingerprint anyway: a later checking look sees it
    assert _verdict(identity, ei, recs["off"], "cpu") == identity.REWRITTEN


def test_an_inference_tensor_is_always_fingerprinted(identity):
    with torch.inference_mode():
        ei = _graph()[0].clone()
    look = identity.Look(ei, "off")
    assert look.checked and look.state[0] is None and identity.checks(ei, "off")
    rec = identity.Identity(look)
    with torch.inference_mode():
        ei[0, :5] = 0
    assert _verdict(identity, ei, rec, "off") == identity.REWRITTEN


def test_the_identity_records_the_look_not_a_later_state(identity):
    """What is recorded is the look taken before computing (settled then): an edit made after
    the look, while the result is computed from the content the look saw, is a change."""
    ei, _ = _graph()
    look = identity.Look(ei, "off").settle()
    ei.numpy()[1, 0] += 1  # behind the version counter, after the look
    assert identity.Identity(look).compare(identity.Look(ei, "cpu")) == identity.REWRITTEN
    look = identity.Look(ei, "off").settle()
    ei[0, 0] = ei[0, 0] + 1  # in place, after the look
    assert identity.Identity(look).compare(identity.Look(ei, "off")) == identity.MOVED


# ----------------------------------------------------------------------------- the caches act on the verdict alike
class _Double(torch.nn.Module):
    def forward(self, ei):
        return (ei * 2,)


EDITS = {
    "nothing": lambda ei: None,
    "in place": lambda ei: ei[1, :10].add_(1).remainder_(N),
    "version bump": torch.autograd.graph.increment_version,
    "data: other storage": lambda ei: setattr(ei, "data", ei.data.clone()),
    "data: same memory, other shape": lambda ei: setattr(ei, "data", ei.data[:, : E // 2]),
    "numpy write": lambda ei: ei.numpy().__setitem__((0, slice(0, 10)), 0),
}


@pytest.mark.parametrize("mode", ["off", "cpu"])
@pytest.mark.parametrize("edit", list(EDITS))
def test_both_caches_follow_the_one_verdict(identity, fresh_cache, check_mode, mode, edit):
    """For each edit, the structure cache rebuilds and the hoisted cache recomputes exactly when
    the helper's verdict is not SAME, and their results are right after it (except where the
    verdict is documented to miss: a write behind the version counter with the check off)."""
    check_mode(mode)
    hoisted.CACHE.clear()
    key, region = hoisted.register(torch.fx.symbolic_trace(_Double()))
    ei, x = _graph(3)
    rec = identity.Identity(identity.Look(ei, mode))
    structure.CACHE.get(ei, N)
    (out,) = hoisted.CACHE.get(key, [ei], [])
    EDITS[edit](ei)
    verdict = _verdict(identity, ei, rec, mode)
    expect = {"nothing": "same", "in place": "moved", "version bump": "moved", "data: other storage": "moved",
              "data: same memory, other shape": "moved",
              "numpy write": "rewritten" if mode == "cpu" else "same"}[edit]
    assert verdict == expect
    s = structure.CACHE.get(ei, N)
    (out,) = hoisted.CACHE.get(key, [ei], [])
    again = verdict != identity.SAME
    assert structure.cache_info()["builds"] == 1 + again
    assert hoisted.hoist_info()["computes"] == 1 + again
    if not (edit == "numpy write" and mode == "off"):
        assert torch.equal(out, ei * 2)
        assert s.num_edges == ei.shape[1]
        torch.testing.assert_close(spmm(ei, x), torch.zeros(N, 4).index_add_(0, ei[1], x[ei[0]]))
    del region


# ----------------------------------------------------------------------------- where the copies of the rule disagreed
def test_native_record_forgets_a_structure_given_other_storage(native):
    """The native record knew a structure's tensors by TensorImpl and version only, where the
    Python caches also compare the data pointer: ``perm.data = other`` (same TensorImpl, same
    version) left the new perm trusted as a permutation, and edge_softmax / edge_dot wrote
    through a perm that repeats edge ids (outputs left unwritten) instead of raising."""
    ei, x = _graph(7)
    for op in ("edge_softmax", "edge_dot"):
        rowptr, col, perm = ops.build_csr(ei[1], ei[0], N, N)  # trusted: perm is a permutation
        v = perm._version
        perm.data = torch.zeros_like(perm)  # every slot names edge 0
        assert perm._version == v
        with pytest.raises(IndexError, match="exactly once"):
            if op == "edge_softmax":
                ops.edge_softmax(rowptr, perm, torch.randn(E, 2), [])
            else:
                ops.edge_dot(rowptr, col, perm, x, torch.randn(N, 4), 1, [])


@pytest.mark.gpu
@pytest.mark.skipif(not (torch.cuda.is_available() and gnncompile.info()["cuda_kernels"]),
                    reason="needs a CUDA device and gnncompile built with CUDA kernels")
def test_native_record_forgets_a_cuda_structure_seen_through_other_sizes():
    """Same TensorImpl, version and data pointer, other sizes: ``perm.data = perm[:E/2]`` (its
    first half, contiguous). The CPU kernels check rowptr's ends against perm on every call;
    the CUDA kernels trust a recorded structure, and the old record (TensorImpl + version) still
    held this one as validated, so edge_softmax walked rowptr to the old E and read scores past
    its E/2 rows. Now it is validated again and refused."""
    ei, _ = _graph(8)
    ei = ei.cuda()
    rowptr, col, perm = ops.build_csr(ei[1], ei[0], N, N)
    half = perm.data[: E // 2]
    assert half.data_ptr() == perm.data_ptr() and half.is_contiguous()
    perm.data = half
    with pytest.raises(ValueError, match="rowptr must start at 0 and end at the number of edges"):
        ops.edge_softmax(rowptr, perm, torch.randn(E // 2, 2, device="cuda"), [])


def test_structure_cache_sees_a_data_swap_to_a_view_of_the_same_memory(fresh_cache, h, check_mode):
    """``ei.data = ei.data[:, :k]`` keeps the version and the data pointer: with the check off
    the old rule (version + pointer) handed back the structure of all E edges."""
    check_mode("off")
    ei, x = _graph(9)
    spmm(ei, x)
    ei.data = ei.data[:, :50]
    torch.testing.assert_close(spmm(ei, x), h.expected_spmm(ei, x))
    assert structure.cache_info()["builds"] == 2


def test_hoisted_cache_sees_a_data_swap_to_a_view_of_the_same_memory(check_mode):
    check_mode("off")
    hoisted.CACHE.clear()
    key, region = hoisted.register(torch.fx.symbolic_trace(_Double()))
    ei, _ = _graph(10)
    hoisted.CACHE.get(key, [ei], [])
    ei.data = ei.data[:, :50]
    (out,) = hoisted.CACHE.get(key, [ei], [])
    assert torch.equal(out, ei * 2)


def _edit_while_computing(target, attr, call, edit, monkeypatch):
    """Runs ``call()`` in a thread, with ``target.attr`` wrapped to finish its work and then
    wait while ``edit()`` changes the input in the main thread."""
    real = getattr(target, attr)
    done, edited = threading.Event(), threading.Event()

    def slow(*args):
        out = real(*args)
        done.set()
        assert edited.wait(30)
        return out

    monkeypatch.setattr(target, attr, slow)
    failed = []

    def run():
        try:
            call()
        except BaseException as exc:  # reported by the main thread
            failed.append(exc)

    th = threading.Thread(target=run)
    th.start()
    assert done.wait(30)
    edit()
    edited.set()
    th.join(30)
    monkeypatch.setattr(target, attr, real)
    assert not th.is_alive() and not failed, failed


def test_structure_cache_records_what_it_built_from(fresh_cache, h, check_mode, monkeypatch):
    """An in-place edit while the structure is being built (another thread): the old cache
    recorded the version it read after the build, so the structure of the old content was a hit
    for the new one from then on (with the check off, or on CUDA by default; with the check on,
    the fingerprint, taken before the build, caught it)."""
    check_mode("off")
    ei, x = _graph(11)

    def edit():
        ei[0, :40] = 0

    _edit_while_computing(structure, "build", lambda: structure.CACHE.get(ei, N), edit, monkeypatch)
    torch.testing.assert_close(spmm(ei, x), h.expected_spmm(ei, x))


@pytest.mark.parametrize("mode", ["off", "cpu"])
def test_hoisted_cache_records_what_it_computed_from(check_mode, monkeypatch, mode):
    """The same for a region: the old cache read the version, and with the check off the
    fingerprint too, after the region ran, so a result of the old content stayed a hit. With
    the check on the fingerprint of the look caught it; the version now does, in either mode."""
    check_mode(mode)
    hoisted.CACHE.clear()
    key, region = hoisted.register(torch.fx.symbolic_trace(_Double()))
    ei, _ = _graph(12)

    def edit():
        ei[0, :40] = 0

    _edit_while_computing(hoisted.CACHE, "_compute", lambda: hoisted.CACHE.get(key, [ei], []), edit, monkeypatch)
    (out,) = hoisted.CACHE.get(key, [ei], [])
    assert torch.equal(out, ei * 2)
    assert hoisted.hoist_info()["computes"] == 2


def test_compiled_model_sees_a_data_swap_to_a_view_of_the_same_memory(check_mode):
    """End to end, with the check off: GCN's hoisted region and structure ops called with an
    edge_index whose .data became its own first half (same object, version and address)."""
    from torch_geometric.nn import models

    check_mode("off")
    torch._dynamo.reset()
    structure.clear_cache()
    torch.manual_seed(0)
    model = models.GCN(4, 8, 2, 3)
    compiled = gnncompile.compile(model, dynamic=True)
    ei, x = _graph(13)
    torch.testing.assert_close(compiled(x, ei), model(x, ei))
    ei.data = ei.data[:, :60]
    torch.testing.assert_close(compiled(x, ei), model(x, ei))
