"""gnncompile.adapt under torch.distributed: two gloo ranks (subprocesses), rank 0 decides."""
from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap

import pytest

pytestmark = pytest.mark.slow

SCRIPT = textwrap.dedent(r"""
    import json, os, sys, warnings
    warnings.simplefilter("ignore")
    import torch, torch.distributed as dist
    from gnncompile.adapt import AdaptiveLoader
    from gnncompile.data import graph_dataset

    out, rank = sys.argv[1], int(sys.argv[2])
    dist.init_process_group("gloo", init_method="file://" + os.path.join(out, "pg"), rank=rank, world_size=2)
    ds = graph_dataset(301, min_nodes=3, max_nodes=30, num_features=2, seed=3)
    for i, d in enumerate(ds):
        d.gid = torch.tensor([i])

    class Clock:
        t = 0.0
        def __call__(self):
            return self.t

    def run(L, clock, rate, state):
        ids = []
        for b in L:
            state["work"] = int(b.num_nodes) + int(b.edge_index.size(1))
            clock.t += state["work"] / rate(L.setting)
            ids += b.gid.tolist()
            L.step_done()
        return ids

    res = {}
    # 1. time: rank 0 finds 16 graphs 20% faster, rank 1 finds it 20% slower; rank 0 decides
    clock, state = Clock(), {}
    L = AdaptiveLoader(ds, sizes=[8, 16], window=3, shuffle=True, memory=None, clock=clock)
    fast = 1.2 if rank == 0 else 0.8
    ids = run(L, clock, lambda s: 1000.0 * (fast if s.size == 16 else 1.0), state)
    res["time"] = {"ids": ids, "sizes": [h["size"] for h in L.history], "log": L.log}
    # 2. memory: rank 1 needs 100x the bytes per node + edge of rank 0: the reduced model refuses 16
    # (graphs of 10 nodes and 40 edges: 8 of them take 400 kB on rank 1, 16 would take 800 kB)
    ds = graph_dataset(300, min_nodes=10, max_nodes=10, num_features=2, seed=3)
    for i, d in enumerate(ds):
        d.gid = torch.tensor([i])
    clock, state = Clock(), {}
    per = 10 if rank == 0 else 1000
    L = AdaptiveLoader(ds, sizes=[8, 16], window=3, memory=lambda: per * state["work"], memory_budget=700_000,
                       clock=clock)
    ids = run(L, clock, lambda s: 1000.0 * (2.0 if s.size == 16 else 1.0), state)
    res["memory"] = {"ids": ids, "sizes": [h["size"] for h in L.history], "log": L.log,
                     "peak": max(h["peak"] for h in L.history)}
    json.dump(res, open(os.path.join(out, f"{rank}.json"), "w"))
    dist.destroy_process_group()
""")


def test_rank_0_decides_and_every_rank_switches_at_the_same_step(tmp_path):
    script = tmp_path / "adapt_ddp.py"
    script.write_text(SCRIPT)
    env = dict(os.environ, OMP_NUM_THREADS="1")
    procs = [subprocess.Popen([sys.executable, str(script), str(tmp_path), str(r)], env=env,
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) for r in range(2)]
    try:
        for p in procs:
            _, err = p.communicate(timeout=180)
            assert p.returncode == 0, err[-3000:]
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait()
    a, b = (json.loads((tmp_path / f"{r}.json").read_text()) for r in range(2))
    t0, t1 = a["time"], b["time"]
    assert t0["sizes"] == t1["sizes"] and 16 in t0["sizes"]
    assert [(e["step"], e["kind"], e["to"]) for e in t0["log"]] == [(e["step"], e["kind"], e["to"]) for e in t1["log"]]
    assert any(e["kind"] == "keep" for e in t1["log"])  # rank 1's own clock would have reverted
    every = t0["ids"] + t1["ids"]
    assert sorted(set(every)) == list(range(301)) and len(every) - 301 <= 1  # the tail padded by one at most
    m0, m1 = a["memory"], b["memory"]
    assert sorted(m0["ids"] + m1["ids"]) == list(range(300))
    assert m0["sizes"] == m1["sizes"] and set(m0["sizes"]) == {8}
    assert m0["log"] == m1["log"] == []
    assert m1["peak"] <= 700_000
