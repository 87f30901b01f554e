"""Data-parallel training's data: NeighborLoader's seed sharding (DistributedSampler's split, one
shuffle shared by every rank, set_epoch) and shared_graph (one graph and one sampler CSC per host,
in shared memory).

The unit tests run in this process (a rank's batches are rebuilt from explicit num_replicas and
rank); the process tests (slow) start ranks as subprocesses with the environment torchrun gives."""
from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import textwrap
import time
import warnings

import pytest
import torch

from gnncompile.data import NeighborLoader, NeighborSampler, SharedInfo, shared_graph
from gnncompile.data import shared as _shared
from gnncompile.data.synthetic import power_law_graph
from gnncompile.ops import structure as _structure

with warnings.catch_warnings():
    warnings.simplefilter("ignore")
    from torch_geometric.data import Data, HeteroData


def graph(N=1001, E=8000, seed=1, F=4):
    g = torch.Generator().manual_seed(seed)
    return Data(x=torch.randn(N, F, generator=g), edge_index=power_law_graph(N, E, seed=seed),
                y=torch.randint(0, 3, (N,), generator=g), train_mask=torch.rand(N, generator=g) < 0.5)


def hetero_graph(papers=301, authors=120, seed=0):
    g = torch.Generator().manual_seed(seed)

    def ei(ns, nd, E):
        return torch.stack([torch.randint(0, ns, (E,), generator=g), torch.randint(0, nd, (E,), generator=g)])

    d = HeteroData()
    d["paper"].x = torch.randn(papers, 4, generator=g)
    d["author"].x = torch.randn(authors, 4, generator=g)
    d["paper", "cites", "paper"].edge_index = ei(papers, papers, 5 * papers)
    d["author", "writes", "paper"].edge_index = ei(authors, papers, 2 * papers)
    d["paper", "rev_writes", "author"].edge_index = d["author", "writes", "paper"].edge_index.flip(0)
    return d


def seeds_of(loader, input_type=None):
    """Each batch's seed nodes (global ids)."""
    out = []
    for b in loader:
        if input_type is None:
            out.append(b.n_id[:b.batch_size].clone())
        else:
            out.append(b[input_type].n_id[:b[input_type].batch_size].clone())
    return out


def rank_loaders(data, R, **kw):
    kw.setdefault("seed", 5)
    return [NeighborLoader(data, [3, 2], num_replicas=R, rank=r, **kw) for r in range(R)]


def batches_equal(a, b) -> bool:
    return len(a) == len(b) and all(torch.equal(x, y) for x, y in zip(a, b))


# ----------------------------------------------------------------------------- sharding
@pytest.mark.parametrize("R", [2, 3])
@pytest.mark.parametrize("shuffle", [True, False])
def test_shards_cover_every_node_with_padding_and_equal_batch_counts(R, shuffle):
    data, n, B = graph(), 1001, 100
    loaders = rank_loaders(data, R, batch_size=B, shuffle=shuffle)
    per_rank = -(-n // R)
    for _ in range(2):  # two epochs
        shards = [torch.cat(seeds_of(L)) for L in loaders]
        assert [s.numel() for s in shards] == [per_rank] * R
        assert {len(L) for L in loaders} == {-(-per_rank // B)}
        every = torch.cat(shards)
        assert torch.equal(every.unique(), torch.arange(n))  # covering
        assert every.numel() - n == per_rank * R - n  # only the padding repeats
    # the DataLoader's own drop_last leaves every rank the same number of (full) batches
    dropped = rank_loaders(data, R, batch_size=B, shuffle=shuffle, drop_last=True)
    counts = [len(seeds_of(L)) for L in dropped]
    assert counts == [per_rank // B] * R and {len(L) for L in dropped} == {per_rank // B}


def test_shards_are_the_distributed_sampler_split():
    """Rank r takes positions r, r + R, ... of the epoch's order, padded by wrapping around (as
    torch's DistributedSampler, drop_last=False); unshuffled the order is 0..n-1."""
    data, R = graph(N=10, E=30), 4
    got = [torch.cat(seeds_of(L)).tolist() for L in rank_loaders(data, R, batch_size=2)]
    order = list(range(10)) + [0, 1]
    assert got == [order[r::R] for r in range(R)]
    ref = torch.utils.data.DistributedSampler(range(10), num_replicas=R, rank=1, shuffle=False)
    assert got[1] == list(ref)
    # fewer nodes than ranks: the order wraps around as often as it takes
    tiny = [torch.cat(seeds_of(L)).tolist() for L in rank_loaders(graph(N=2, E=3), 5, batch_size=4)]
    assert tiny == [[0], [1], [0], [1], [0]]


def test_shard_drop_last_cuts_the_tail():
    data, n, R = graph(), 1001, 3
    loaders = rank_loaders(data, R, batch_size=100, shuffle=True, shard_drop_last=True)
    shards = [torch.cat(seeds_of(L)) for L in loaders]
    assert [s.numel() for s in shards] == [n // R] * R
    every = torch.cat(shards)
    assert every.unique().numel() == every.numel() == n // R * R  # no repeats, the tail left out


def test_one_shuffle_per_epoch_shared_by_all_ranks_and_set_epoch_reproduces_it():
    data, R = graph(), 2
    loaders = rank_loaders(data, R, batch_size=50, shuffle=True)
    epochs = []
    assert [L.epoch for L in loaders] == [0] * R  # before the first iteration: the next one's
    for e in range(3):
        runs = [seeds_of(L) for L in loaders]
        assert [L.epoch for L in loaders] == [e] * R  # the last one begun
        # the ranks' seeds interleave one order of all nodes: rank r holds its positions r, r + R, ...
        order = torch.stack([torch.cat(r) for r in runs], 1).reshape(-1)
        assert torch.equal(order[:1001].sort().values, torch.arange(1001))
        epochs.append(runs)
    assert not torch.equal(torch.cat(epochs[0][0]), torch.cat(epochs[1][0]))  # a new shuffle each epoch
    # set_epoch(k): the next iteration is epoch k (its shuffle and its batches), then k + 1, ...
    fresh = rank_loaders(data, R, batch_size=50, shuffle=True)
    fresh[1].set_epoch(1)
    assert fresh[1].epoch == 1
    again = seeds_of(fresh[1])
    assert batches_equal(again, epochs[1][1]) and fresh[1].epoch == 1
    assert batches_equal(seeds_of(fresh[1]), epochs[2][1]) and fresh[1].epoch == 2
    # and the sampled subgraphs, not only the seeds
    a, b = rank_loaders(data, R, batch_size=50, shuffle=True)[1], rank_loaders(data, R, batch_size=50, shuffle=True)[1]
    a.set_epoch(2)
    for _ in range(2):
        list(b)
    for x, y in zip(a, b):
        assert torch.equal(x.n_id, y.n_id) and torch.equal(x.e_id, y.e_id)
    with pytest.raises(ValueError, match="epoch"):
        a.set_epoch(-1)


def test_unsharded_loader_epochs_and_set_epoch():
    """Without sharding the epoch counts up by itself as before; set_epoch names the next one."""
    data = graph()
    L = NeighborLoader(data, [3], batch_size=100, shuffle=True, seed=9)
    e0, e1 = seeds_of(L), seeds_of(L)
    assert L.epoch == 1 and not batches_equal(e0, e1)
    L.set_epoch(0)
    assert batches_equal(seeds_of(L), e0) and batches_equal(seeds_of(L), e1)
    # one replica, rank 0: the unsharded loader's batches
    one = NeighborLoader(data, [3], batch_size=100, shuffle=True, seed=9, num_replicas=1, rank=0)
    assert batches_equal([b.n_id for b in one], [b.n_id for b in NeighborLoader(data, [3], batch_size=100,
                                                                                shuffle=True, seed=9)])


def test_rank_batches_depend_on_seed_epoch_rank_not_on_workers():
    data = graph(N=400, E=3000)
    kw = dict(batch_size=64, shuffle=True, seed=21, num_replicas=3, rank=2)
    a = [b.n_id for b in NeighborLoader(data, [4, 3], **kw)]
    b = [b.n_id for b in NeighborLoader(data, [4, 3], num_workers=1, **kw)]
    assert batches_equal(a, b)
    c = [b.n_id for b in NeighborLoader(data, [4, 3], **dict(kw, rank=1))]
    assert not batches_equal(a, c)


def test_hetero_input_nodes_are_sharded():
    data, R = hetero_graph(), 2
    loaders = [NeighborLoader(data, [3, 2], input_nodes=("paper", None), batch_size=40, shuffle=True, seed=3,
                              num_replicas=R, rank=r) for r in range(R)]
    shards = [torch.cat(seeds_of(L, "paper")) for L in loaders]
    assert [s.numel() for s in shards] == [151, 151] and {len(L) for L in loaders} == {4}
    assert torch.equal(torch.cat(shards).unique(), torch.arange(301))
    mask = torch.arange(301) % 3 == 0  # 101 input nodes
    masked = [NeighborLoader(data, [2], input_nodes=("paper", mask), batch_size=16, seed=3, num_replicas=R,
                             rank=r) for r in range(R)]
    got = torch.cat([torch.cat(seeds_of(L, "paper")) for L in masked])
    assert got.numel() == 102 and torch.equal(got.unique(), mask.nonzero().view(-1))


def test_sharding_errors():
    data = graph(N=50, E=200)
    with pytest.raises(ValueError, match="rank must be in"):
        NeighborLoader(data, [2], num_replicas=2, rank=2, seed=0)
    with pytest.raises(ValueError, match="rank must be in"):
        NeighborLoader(data, [2], num_replicas=2, rank=-1, seed=0)
    with pytest.raises(ValueError, match="num_replicas must be >= 1"):
        NeighborLoader(data, [2], num_replicas=0, rank=0, seed=0)
    with pytest.raises(TypeError, match="num_replicas must be an int"):
        NeighborLoader(data, [2], num_replicas=2.0, rank=0, seed=0)
    with pytest.raises(RuntimeError, match="no process group is initialized"):
        NeighborLoader(data, [2], distributed=True, seed=0)
    with pytest.raises(RuntimeError, match="rank"):
        NeighborLoader(data, [2], num_replicas=2, seed=0)  # the rank would come from the process group
    with pytest.raises(ValueError, match="seed="):
        NeighborLoader(data, [2], num_replicas=2, rank=0)
    # explicit values need no process group, also with distributed=True
    assert NeighborLoader(data, [2], distributed=True, num_replicas=2, rank=1, seed=0).rank == 1


def test_distributed_with_a_one_rank_process_group(tmp_path):
    import torch.distributed as dist

    if not dist.is_available() or dist.is_initialized():
        pytest.skip("torch.distributed unavailable or already initialized")
    dist.init_process_group("gloo", init_method=f"file://{tmp_path / 'pg'}", rank=0, world_size=1)
    try:
        data = graph(N=100, E=500)
        L = NeighborLoader(data, [2], distributed=True, batch_size=10, shuffle=True)  # seed broadcast
        assert (L.num_replicas, L.rank) == (1, 0) and len(seeds_of(L)) == 10
        with pytest.raises(ValueError, match="rank must be in"):
            NeighborLoader(data, [2], distributed=True, num_replicas=2, rank=3)
        assert NeighborLoader(data, [2], distributed=True, num_replicas=4, rank=3, seed=1).num_replicas == 4
    finally:
        dist.destroy_process_group()


# ----------------------------------------------------------------------------- shared_graph, in-process
@pytest.fixture
def fresh_env(monkeypatch):
    for k in ("LOCAL_RANK", "LOCAL_WORLD_SIZE", "GROUP_RANK", "TORCHELASTIC_RUN_ID", "MASTER_ADDR", "MASTER_PORT",
              "TORCHELASTIC_RESTART_COUNT"):
        monkeypatch.delenv(k, raising=False)
    monkeypatch.setenv("TORCHELASTIC_RUN_ID", f"unit-{os.getpid()}-{time.monotonic_ns()}")
    return monkeypatch


def _our_dirs():
    return sorted(f for f in os.listdir(_shared._base_dir()) if f.startswith(f"gnncompile-{os.getuid()}-"))


def test_shared_graph_single_process_just_builds(fresh_env):
    calls = []
    before = _our_dirs()
    d = shared_graph("single", lambda: calls.append(1) or graph(N=30, E=60))
    assert calls == [1] and d.shared_info.role == "single" and _our_dirs() == before
    assert not NeighborSampler(d, [2]).shared_csc


@pytest.mark.parametrize("hetero", [False, True])
def test_shared_graph_builder_maps_its_files_and_the_sampler_uses_the_shared_csc(fresh_env, hetero):
    """Local rank 0's own view: the graph comes back mapped from the files, equal to build()'s;
    the loader samples from the shared CSC (no structure built) the same batches as over a
    private copy."""
    fresh_env.setenv("LOCAL_WORLD_SIZE", "2")
    ref = hetero_graph() if hetero else graph()
    d = shared_graph(f"builder-{hetero}", lambda: ref.clone())
    try:
        info = d.shared_info
        assert isinstance(info, SharedInfo) and info.role == "built" and os.path.isdir(info.path)
        assert os.path.exists(os.path.join(info.path, "manifest.json"))
        if hetero:
            for store, ref_store in zip(d.stores, ref.stores):
                assert list(store.keys()) == list(ref_store.keys())
                for k in ref_store.keys():
                    assert torch.equal(store[k], ref_store[k])
        else:
            assert list(d.keys()) == list(ref.keys()) and all(torch.equal(d[k], ref[k]) for k in ref.keys())
        kw = dict(batch_size=50, shuffle=True, seed=4, num_replicas=2, rank=1)
        if hetero:
            kw["input_nodes"] = ("paper", None)
        builds = _structure.cache_info()["builds"]
        L = NeighborLoader(d, [3, 2], **kw)
        assert L.node_sampler.shared_csc and _structure.cache_info()["builds"] == builds
        P = NeighborLoader(ref, [3, 2], **kw)
        assert not P.node_sampler.shared_csc
        for a, b in zip(L, P):
            if hetero:
                for t in a.node_types:
                    assert torch.equal(a[t].n_id, b[t].n_id)
                for et in a.edge_types:
                    assert torch.equal(a[et].e_id, b[et].e_id) and torch.equal(a[et].edge_index, b[et].edge_index)
            else:
                assert torch.equal(a.n_id, b.n_id) and torch.equal(a.e_id, b.e_id)
                assert torch.equal(a.edge_index, b.edge_index) and torch.equal(a.x, b.x)
        # a replaced edge_index is not the one the shared CSC describes: the sampler builds its own
        if not hetero:
            d2 = d.clone()
            assert not NeighborSampler(d2, [2]).shared_csc
    finally:
        shutil.rmtree(d.shared_info.path, ignore_errors=True)


def test_shared_graph_reader_never_maps_a_stale_runs_files(fresh_env):
    """Files of the same name whose writer is gone (a crashed earlier run) are ignored by the
    readers and replaced by the builder."""
    fresh_env.setenv("LOCAL_WORLD_SIZE", "2")
    fresh_env.setenv("LOCAL_RANK", "1")
    key = "stale"
    path = os.path.join(_shared._base_dir(), _shared._dir_name(key, 0, _shared._calls.get(key, 0) + 1))
    os.mkdir(path, 0o700)
    try:
        dead = {"pid": os.getpid(), "start": "not-this-process"}
        _shared._write_json(os.path.join(path, "owner.json"), dead)
        _shared._write_json(os.path.join(path, "manifest.json"),
                            {"format": _shared._FORMAT, "key": key, "owner": dead, "hetero": False, "entries": [],
                             "csc": []})
        t0 = time.monotonic()
        with pytest.raises(TimeoutError, match="stale run") as e:
            shared_graph(key, graph, timeout=0.3)
        assert time.monotonic() - t0 < 5 and "local rank 0" in str(e.value)
        # the builder replaces them (its generation counter is this process's second call)
        fresh_env.setenv("LOCAL_RANK", "0")
        _shared._calls[key] = 0
        d = shared_graph(key, lambda: graph(N=20, E=40), timeout=1)
        assert d.shared_info.role == "built" and d.shared_info.path == path
        assert _shared._read_json(os.path.join(path, "owner.json"))["pid"] == os.getpid()
    finally:
        shutil.rmtree(path, ignore_errors=True)


def test_shared_graph_refuses_what_it_cannot_share(fresh_env):
    fresh_env.setenv("LOCAL_WORLD_SIZE", "2")
    before = _our_dirs()

    def with_object():
        d = graph(N=10, E=20)
        d.meta = object()
        return d

    with pytest.raises(TypeError, match="'meta'"):
        shared_graph("bad-attr", with_object, timeout=0.2)
    with pytest.raises(TypeError, match="Data or HeteroData"):
        shared_graph("bad-type", lambda: 3, timeout=0.2)
    with pytest.raises(ValueError, match="key"):
        shared_graph("", graph)
    assert _our_dirs() == before  # the failed builds left nothing behind


# ----------------------------------------------------------------------------- processes
RANK_SCRIPT = textwrap.dedent(r"""
    import json, os, sys, time, warnings
    warnings.simplefilter("ignore")
    import torch
    from torch_geometric.data import Data
    from gnncompile.data import NeighborLoader
    from gnncompile.data.shared import shared_graph, stats
    from gnncompile.data.synthetic import power_law_graph
    from gnncompile.ops import structure

    out, mode, N, E = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4])
    me = os.environ["GROUP_RANK"] + "." + os.environ["LOCAL_RANK"]

    def smaps():
        try:
            rows = [l.split() for l in open("/proc/self/smaps_rollup")]
        except OSError:
            return {}
        return {r[0].rstrip(":"): int(r[1]) * 1024 for r in rows if len(r) == 3}

    def build():
        with open(os.path.join(out, "builds"), "a") as f:
            f.write(me + "\n")
        if mode == "fail":
            time.sleep(0.5)
            raise ValueError("no such dataset")
        g = torch.Generator().manual_seed(0)
        return Data(x=torch.randn(N, 16, generator=g), edge_index=power_law_graph(N, E),
                    y=torch.randint(0, 3, (N,), generator=g), name="g")

    before = smaps()
    t0 = time.monotonic()
    try:
        d = shared_graph("proc-test", build, timeout=float(os.environ.get("WAIT", "60")))
    except Exception as e:
        json.dump({"error": f"{type(e).__name__}: {e}", "after": time.monotonic() - t0},
                  open(os.path.join(out, me + ".json"), "w"))
        sys.exit(0)
    L = NeighborLoader(d, [5, 3], batch_size=256, shuffle=True, seed=11, num_replicas=2, rank=1)
    d.x.sum(); d.edge_index.sum(); d.y.sum()  # every page resident
    s = L.node_sampler
    s.colptr.sum(); (s._pairs if s._pairs is not None else s.row).sum()
    after = smaps()
    batches = [b.n_id for b in L]
    torch.save({"x": d.x.clone(), "edge_index": d.edge_index.clone(), "batches": batches},
               os.path.join(out, me + ".pt"))
    json.dump({"role": d.shared_info.role, "path": d.shared_info.path, "nbytes": d.shared_info.nbytes,
               "stats": stats(), "structure_builds": structure.cache_info()["builds"], "shared_csc": s.shared_csc,
               "name": d.name, "before": before, "after": after},
              open(os.path.join(out, me + ".json"), "w"))
    # as in training: nobody leaves before every rank of the test has its graph
    open(os.path.join(out, me + ".done"), "w").close()
    want = int(os.environ["EXPECT"])
    while sum(f.endswith(".done") for f in os.listdir(out)) < want:
        time.sleep(0.05)
""")


def _launch(tmp_path, ranks, mode="ok", N=2000, E=16000, extra=None):
    """Starts one process per (group_rank, local_rank, local_world_size); returns their results."""
    run_id = f"test-{os.getpid()}-{time.monotonic_ns()}"
    script = tmp_path / "rank.py"
    script.write_text(RANK_SCRIPT)
    procs = []
    for group_rank, local_rank, lws in ranks:
        env = dict(os.environ, OMP_NUM_THREADS="1", TORCHELASTIC_RUN_ID=run_id, GROUP_RANK=str(group_rank),
                   LOCAL_RANK=str(local_rank), LOCAL_WORLD_SIZE=str(lws), EXPECT=str(len(ranks)), **(extra or {}))
        procs.append(subprocess.Popen([sys.executable, str(script), str(tmp_path), mode, str(N), str(E)], env=env,
                                      stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True))
    results = {}
    try:
        for p, (group_rank, local_rank, _) in zip(procs, ranks):
            _, err = p.communicate(timeout=120)
            assert p.returncode == 0, err[-3000:]
            me = f"{group_rank}.{local_rank}"
            results[me] = json.loads((tmp_path / f"{me}.json").read_text())
            if (tmp_path / f"{me}.pt").exists():
                results[me].update(torch.load(tmp_path / f"{me}.pt"))
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait()
    builds = (tmp_path / "builds").read_text().split() if (tmp_path / "builds").exists() else []
    return results, builds


def _pss_shmem(r) -> int:
    return r["after"].get("Pss_Shmem", -1)


@pytest.mark.slow
def test_two_local_ranks_share_one_graph_and_one_csc(tmp_path):
    before = _our_dirs()
    res, builds = _launch(tmp_path, [(0, 0, 2), (0, 1, 2)], N=100_000, E=1_000_000)
    w, r = res["0.0"], res["0.1"]
    assert builds == ["0.0"]  # build() ran once, on local rank 0
    assert (w["role"], r["role"]) == ("built", "mapped") and w["path"] == r["path"]
    assert w["stats"] == {"graph_builds": 1, "csc_builds": 1, "mapped": 0}
    assert r["stats"] == {"graph_builds": 0, "csc_builds": 0, "mapped": 1}
    assert w["structure_builds"] == r["structure_builds"] == 0 and w["shared_csc"] and r["shared_csc"]
    assert torch.equal(w["x"], r["x"]) and torch.equal(w["edge_index"], r["edge_index"]) and r["name"] == "g"
    assert batches_equal(w["batches"], r["batches"])
    assert not os.path.exists(w["path"]) and _our_dirs() == before  # nothing left in /dev/shm
    if _pss_shmem(r) >= 0:  # the reader is charged half the shared pages, no private copy
        nbytes = r["nbytes"]
        assert _pss_shmem(r) < 0.6 * nbytes
        grown = r["after"]["Private_Dirty"] - r["before"]["Private_Dirty"]
        assert grown < 0.5 * nbytes, (grown, nbytes)
        print(f"reader: nbytes {nbytes >> 20} MiB, Pss_Shmem {_pss_shmem(r) >> 20} MiB, Private_Dirty grown "
              f"{grown >> 20} MiB")


@pytest.mark.slow
def test_a_failing_build_fails_the_other_rank_promptly(tmp_path):
    before = _our_dirs()
    res, builds = _launch(tmp_path, [(0, 0, 2), (0, 1, 2)], mode="fail", extra={"WAIT": "90"})
    assert builds == ["0.0"]
    assert res["0.0"]["error"] == "ValueError: no such dataset"
    err = res["0.1"]["error"]
    assert err.startswith("RuntimeError") and "build() failed on local rank 0" in err and "no such dataset" in err
    assert res["0.1"]["after"] < 30  # not the 90 s timeout
    assert _our_dirs() == before


@pytest.mark.slow
def test_two_nodes_on_one_host_each_build_their_own(tmp_path):
    """GROUP_RANK tells torchrun's nodes apart (--nnodes=2 on loopback): local rank 0 of each
    builds and writes its own files, alive at the same time, without colliding. (With one local
    rank a node just builds: test_shared_graph_single_process_just_builds.)"""
    before = _our_dirs()
    res, builds = _launch(tmp_path, [(0, 0, 2), (1, 0, 2)], N=500, E=2000)
    assert sorted(builds) == ["0.0", "1.0"]
    assert res["0.0"]["role"] == res["1.0"]["role"] == "built" and res["0.0"]["path"] != res["1.0"]["path"]
    assert torch.equal(res["0.0"]["x"], res["1.0"]["x"])
    assert _our_dirs() == before


GLOO_SCRIPT = textwrap.dedent(r"""
    import json, os, sys, warnings
    warnings.simplefilter("ignore")
    import torch, torch.distributed as dist
    from torch_geometric.data import Data
    from gnncompile.data import NeighborLoader
    from gnncompile.data.synthetic import power_law_graph

    out, rank = sys.argv[1], int(sys.argv[2])
    dist.init_process_group("gloo", init_method="file://" + os.path.join(out, "pg"), rank=rank, world_size=2)
    torch.manual_seed(rank)  # the ranks would draw different seeds
    d = Data(x=torch.zeros(301, 1), edge_index=power_law_graph(301, 2000))
    L = NeighborLoader(d, [2], distributed=True, batch_size=32, shuffle=True)
    seeds = [b.n_id[:b.batch_size].tolist() for b in L]
    json.dump({"seed": L.seed, "rank": L.rank, "seeds": seeds, "len": len(L)},
              open(os.path.join(out, f"{rank}.json"), "w"))
    dist.destroy_process_group()
""")


@pytest.mark.slow
def test_distributed_loader_over_gloo_agrees_on_the_seed(tmp_path):
    script = tmp_path / "gloo.py"
    script.write_text(GLOO_SCRIPT)
    env = dict(os.environ, OMP_NUM_THREADS="1")
    procs = [subprocess.Popen([sys.executable, str(script), str(tmp_path), str(r)], env=env,
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) for r in range(2)]
    try:
        for p in procs:
            _, err = p.communicate(timeout=120)
            assert p.returncode == 0, err[-3000:]
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait()
    a, b = (json.loads((tmp_path / f"{r}.json").read_text()) for r in range(2))
    assert a["seed"] == b["seed"] and (a["rank"], b["rank"]) == (0, 1) and a["len"] == b["len"] == 5
    every = sum(a["seeds"], []) + sum(b["seeds"], [])
    assert len(every) == 302 and sorted(set(every)) == list(range(301))
