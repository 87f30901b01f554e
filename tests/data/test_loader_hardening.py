"""PooledLoader hardening (issue 14): a new loader sees a changed dataset, one live iterator per
loader, workers that die with their parent and ignore SIGINT, validated constructor arguments.

Worker tests run under ``guard``: a SIGALRM that fails the test instead of letting a hang block
the suite. Tests that kill or interrupt a loader's parent run it in a subprocess."""
from __future__ import annotations

import math
import os
import signal
import sys
import threading
import time
import warnings

import pytest
import torch

from gnncompile.data import PooledLoader, loader as loader_mod
from gnncompile.data.synthetic import graph_dataset

with warnings.catch_warnings():
    warnings.simplefilter("ignore")
    from torch_geometric.data import Batch, Data
    from torch_geometric.loader import DataLoader

posix_only = pytest.mark.skipif(not hasattr(signal, "SIGALRM") or not sys.platform.startswith("linux"),
                                reason="forked workers, signals and /proc: Linux only")
DS = graph_dataset(120, 3, 12, num_features=5, seed=5)
KEYS = ("x", "edge_index", "y", "batch", "ptr")


class _Hang(Exception):
    pass


@pytest.fixture
def guard():
    """``guard(seconds)``: raise _Hang in the test if it is still running after ``seconds``."""
    old = signal.getsignal(signal.SIGALRM)

    def arm(seconds: float) -> None:
        def on_alarm(signum, frame):
            raise _Hang(f"still running after {seconds} s: a hang")
        signal.signal(signal.SIGALRM, on_alarm)
        signal.setitimer(signal.ITIMER_REAL, seconds)

    yield arm
    signal.setitimer(signal.ITIMER_REAL, 0)
    signal.signal(signal.SIGALRM, old)


def _same(a, b, keys=KEYS):
    assert a.num_graphs == b.num_graphs
    for k in keys:
        assert a[k].dtype == b[k].dtype, k
        assert torch.equal(a[k], b[k]), k


def _pyg_epoch(ds, seed, **kw):
    torch.manual_seed(seed)
    return list(DataLoader(ds, **kw))


def _check_epoch(it, expected):
    n = 0
    for a, b in zip(it, expected):
        _same(a, b)
        n += 1
    assert n == len(expected)


# ------------------------------------------------------------------ 5: a changed dataset
def _whole(ds, **kw):
    """The dataset as one batch from a new PooledLoader, checked against PyG's collation."""
    loader = PooledLoader(ds, batch_size=len(ds), **kw)
    (got,) = list(loader)
    _same(got, Batch.from_data_list(list(ds)))
    return loader


def test_new_loader_sees_items_changed_in_place():
    ds = graph_dataset(30, 3, 8, num_features=4, seed=1)
    first = _whole(ds)
    assert _whole(ds)._store is first._store  # unchanged: the store is reused
    ds[3].x.add_(1.0)  # a torch op (bumps the tensor's version)
    _whole(ds)
    ds[5].x.numpy()[0, 0] = 99.0  # through numpy: no version bump, same tensor, same pointer
    _whole(ds)
    ds[6].edge_index.numpy()[0, 0] = 0
    _whole(ds)


def test_new_loader_sees_replaced_items():
    ds = graph_dataset(30, 3, 8, num_features=4, seed=2)
    _whole(ds)
    ds[4] = Data(x=torch.randn(11, 4), edge_index=torch.tensor([[0, 10], [10, 0]]), y=torch.tensor([1]))
    _whole(ds)
    ds[7].x = torch.randn_like(ds[7].x)  # an attribute replaced, same shape
    _whole(ds)
    # sizes moved between graphs, the concatenation unchanged: item 8 takes item 9's first row
    a, b = ds[8], ds[9]
    a.x, b.x = torch.cat([a.x, b.x[:1]]), b.x[1:]
    b.edge_index = b.edge_index.clamp(max=b.x.size(0) - 1)
    _whole(ds)


# ------------------------------------------------------------------ 6: one iterator at a time
def _iterators_case(num_workers, persistent=False):
    kw = dict(batch_size=16, shuffle=True)
    loader = PooledLoader(DS, pool_size=3, num_workers=num_workers, persistent_workers=persistent, **kw)
    try:
        a = iter(loader)
        next(a)
        next(a)
        expected = _pyg_epoch(DS, 11, **kw)
        torch.manual_seed(11)
        b = iter(loader)  # ends a: its next() raises instead of yielding overwritten batches
        with pytest.raises(RuntimeError, match="ended by a newer iter"):
            next(a)
        _check_epoch(b, expected)
        with pytest.raises(RuntimeError, match="one iterator at a time"):
            for _ in zip(loader, loader):
                pass
        # abandoned half-way, still referenced: a new iter() works
        it = iter(loader)
        next(it)
        expected = _pyg_epoch(DS, 12, **kw)
        torch.manual_seed(12)
        it = iter(loader)
        _check_epoch(it, expected)
        loader.close()  # ends the live iterator too
        c = iter(loader)
        loader.close()
        with pytest.raises(RuntimeError, match="close"):
            next(c)
    finally:
        loader.close()


def test_concurrent_iterators_inline():
    _iterators_case(0)


@posix_only
@pytest.mark.parametrize("persistent", [False, True])
def test_concurrent_iterators_with_workers(guard, persistent):
    guard(60)
    _iterators_case(2, persistent)


def test_dataset_length_change_raises():
    ds = graph_dataset(20, 3, 6, num_features=3, seed=3)
    loader = PooledLoader(ds, batch_size=4)
    ds.append(ds[0])
    with pytest.raises(RuntimeError, match="build a new one"):
        iter(loader)


# ------------------------------------------------------------------ 8: arguments
@pytest.mark.parametrize("kw", [
    {"batch_size": 0}, {"batch_size": -3}, {"batch_size": 2.5}, {"batch_size": "4"}, {"batch_size": True},
    {"batch_size": None}, {"pool_size": 0}, {"pool_size": 1.5}, {"pool_size": "2"}, {"num_workers": -1},
    {"num_workers": 2.0}, {"num_workers": "2"}, {"timeout": 0}, {"timeout": -1.0}, {"timeout": math.nan},
    {"timeout": "5"}, {"follow_batch": "x"}, {"exclude_keys": 3}, {"generator": 5},
])
def test_bad_arguments_raise_value_error(kw):
    with pytest.raises(ValueError, match="PooledLoader: " + next(iter(kw))):
        PooledLoader(DS, **kw)


def test_not_a_dataset():
    with pytest.raises(ValueError, match="sequence of graphs"):
        PooledLoader(5)


def test_numpy_integers_are_accepted():
    np = pytest.importorskip("numpy")
    loader = PooledLoader(DS, batch_size=np.int64(40), pool_size=np.int32(2))
    assert len(loader) == 3


def test_huge_num_workers_is_clamped(monkeypatch, guard):
    with pytest.warns(UserWarning, match="num_workers=1000000 clamped"):
        loader = PooledLoader(DS, batch_size=40, num_workers=10**6)
    assert loader.num_workers == loader_mod._WORKERS_PER_CPU * os.cpu_count()
    if sys.platform.startswith("linux"):  # the clamp is what forks: 1 per CPU here
        guard(60)
        monkeypatch.setattr(loader_mod, "_WORKERS_PER_CPU", 1)
        with pytest.warns(UserWarning, match="clamped"):
            loader = PooledLoader(DS, batch_size=40, num_workers=10**6, persistent_workers=True)
        try:
            torch.manual_seed(0)
            list(loader)
            assert len(loader._workers) == os.cpu_count()
        finally:
            loader.close()


def test_pool_size_is_bounded(monkeypatch, guard):
    guard(20)  # allocating 10**9 slots would not end
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # more slots than batches: dropped silently
        loader = PooledLoader(DS, batch_size=16, pool_size=10**9)
    assert loader.pool_size == len(loader._host) == len(loader) == 8
    # a memory budget of 3 slots: clamped, with a warning, and the batches are still right
    per_slot = PooledLoader(DS, batch_size=16)._store.slot_bytes()
    monkeypatch.setattr(loader_mod, "_pool_budget", lambda: 3 * per_slot + 1)
    with pytest.warns(UserWarning, match="pool_size=6 clamped to 3"):
        loader = PooledLoader(DS, batch_size=16, shuffle=True, pool_size=6)
    assert len(loader._host) == 3
    expected = _pyg_epoch(DS, 4, batch_size=16, shuffle=True)
    torch.manual_seed(4)
    _check_epoch(loader, expected)


def test_huge_batch_size_allocates_for_the_dataset_only():
    loader = PooledLoader(DS, batch_size=10**7)
    assert loader._host[0]["ptr"].numel() == len(DS) + 1
    (got,) = list(loader)
    _same(got, Batch.from_data_list(list(DS)))


@posix_only
def test_stuck_worker_times_out(guard):
    guard(60)
    ds = graph_dataset(20, 3, 6, num_features=3, seed=9)  # its own store, patched below
    loader = PooledLoader(ds, batch_size=4, num_workers=1, timeout=1.0)

    def stuck(*args):
        threading.Event().wait()
    loader._store.collate_into = stuck  # in the forked worker
    try:
        with pytest.raises(RuntimeError, match="timeout"):
            next(iter(loader))
    finally:
        loader.close()


# ------------------------------------------------------------------ 9 + SIGINT: worker lifetime
def _gone(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] in ("Z", "X")  # a zombie is dead
    except FileNotFoundError:
        return True


def _parent_role(mode: str, conn) -> None:
    """A loader's parent, in a forked child (no interpreter start-up): reports its workers' pids
    on ``conn``, then waits to be killed (``main``, ``thread``: workers forked from a thread that
    stays alive), or runs epochs until a Ctrl-C and reports the workers' exit codes."""
    os.setsid()  # its own process group, as a terminal's job
    signal.signal(signal.SIGINT, signal.default_int_handler)
    if mode == "main":  # only the parent-death signal can end these workers within the test
        loader_mod._PARENT_POLL_S = 3600.0
    loader = PooledLoader(graph_dataset(200, 3, 12, num_features=4, seed=1), batch_size=8, shuffle=True,
                          num_workers=2, persistent_workers=True)

    workers = []

    def start():
        it = iter(loader)
        next(it)
        workers[:] = loader._workers
        conn.send([p.pid for p in workers])
        return it

    if mode == "thread":
        threading.Thread(target=lambda: (start(), threading.Event().wait()), daemon=True).start()
        threading.Event().wait()
    try:  # from here a Ctrl-C may come at any point
        start()
        if mode == "main":
            threading.Event().wait()
        while True:
            for _ in loader:
                pass
    except KeyboardInterrupt:
        loader.close()
        conn.send([p.exitcode for p in workers])


def _parent(mode):
    """The process running _parent_role(mode), its end of the pipe, and its workers' pids."""
    import multiprocessing as mp

    ctx = mp.get_context("fork")
    here, there = ctx.Pipe()
    proc = ctx.Process(target=_parent_role, args=(mode, there))
    proc.start()
    assert here.poll(30), "the parent did not start its workers"
    pids = here.recv()
    assert len(pids) == 2
    return proc, here, pids


def _reap_orphans(pids):
    for p in pids:
        if not _gone(p):
            os.kill(p, signal.SIGKILL)  # workers of this test's parent, left behind


@posix_only
@pytest.mark.parametrize("mode", ["main", "thread"])
def test_workers_die_with_a_killed_parent(guard, mode):
    # main: the kernel's parent-death signal (the poll is slowed to an hour); thread: the
    # workers' getppid() poll (no death signal: it would follow the forking thread)
    guard(60)
    proc, _, pids = _parent(mode)
    try:
        proc.kill()
        proc.join()
        for _ in range(100):  # poll, up to 10 s
            if all(_gone(p) for p in pids):
                break
            time.sleep(0.1)
        assert all(_gone(p) for p in pids), "workers outlived their killed parent"
    finally:
        _reap_orphans(pids)


@posix_only
def test_ctrl_c_reaches_the_parent_which_stops_the_workers(guard):
    guard(60)
    proc, conn, pids = _parent("ctrl-c")
    try:
        os.killpg(proc.pid, signal.SIGINT)  # as a terminal's Ctrl-C: the whole process group
        assert conn.poll(30), "the parent did not stop its workers"
        assert conn.recv() == [0, 0]  # stopped by the parent, not killed by SIGINT
        proc.join(30)
        assert proc.exitcode == 0
    finally:
        if proc.is_alive():
            proc.kill()
        _reap_orphans(pids)


@posix_only
def test_a_ctrl_c_after_a_result_left_the_queue_stops_the_workers_at_once(guard):
    # A Ctrl-C that lands after a result was taken from the queue but before the pass counted
    # it: the pass must not wait (up to its timeout) for a result that will never come again.
    guard(20)
    loader = PooledLoader(DS, batch_size=8, shuffle=True, num_workers=2, persistent_workers=True,
                          timeout=60)
    real, calls, workers = loader._result, [], []

    def taken_then_interrupted(tag):
        out = real(tag)
        calls.append(tag)
        if len(calls) == 3:
            workers[:] = loader._workers
            raise KeyboardInterrupt  # as the signal handler would, after the queue's get returned
        return out

    loader._result = taken_then_interrupted
    try:
        it = iter(loader)
        with pytest.raises(KeyboardInterrupt):
            for _ in it:
                pass
        assert len(workers) == 2 and loader._workers == []  # stopped, not drained
        assert [p.exitcode for p in workers] == [0, 0]
        loader._result = real
        expected = _pyg_epoch(DS, 4, batch_size=8, shuffle=True)
        torch.manual_seed(4)  # the next pass starts fresh workers and is whole
        _check_epoch(loader, expected)
    finally:
        loader.close()


@posix_only
def test_workers_ignore_sigint(guard):
    guard(60)
    kw = dict(batch_size=16, shuffle=True)
    loader = PooledLoader(DS, num_workers=2, persistent_workers=True, **kw)
    try:
        torch.manual_seed(0)
        it = iter(loader)
        next(it)
        workers = list(loader._workers)
        for p in workers:
            os.kill(p.pid, signal.SIGINT)
        for seed in (1, 2):  # two more epochs on the same workers
            expected = _pyg_epoch(DS, seed, **kw)
            torch.manual_seed(seed)
            _check_epoch(loader, expected)
        assert [p.pid for p in loader._workers] == [p.pid for p in workers]
    finally:
        loader.close()
    assert [p.exitcode for p in workers] == [0, 0]


@posix_only
def test_workers_outlive_the_thread_that_forked_them(guard):
    # the parent-death signal follows the forking thread: not armed when that is not the main one
    guard(60)
    kw = dict(batch_size=16, shuffle=True)
    loader = PooledLoader(DS, num_workers=2, persistent_workers=True, **kw)
    try:
        tid = []
        t = threading.Thread(target=lambda: (tid.append(threading.get_native_id()), list(loader)))
        t.start()
        t.join()
        pids = [p.pid for p in loader._workers]
        while os.path.exists(f"/proc/self/task/{tid[0]}"):  # the thread fully gone from the kernel
            time.sleep(0.01)
        expected = _pyg_epoch(DS, 3, **kw)
        torch.manual_seed(3)
        _check_epoch(loader, expected)
        assert [p.pid for p in loader._workers] == pids and not any(_gone(p) for p in pids)
    finally:
        loader.close()
