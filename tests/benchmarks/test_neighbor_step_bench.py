"""benchmarks.neighbor_step on a tiny graph: phases that add up to the step, chunks alternating
the thread counts, the profiler's op list, an interleaved arm against the defaults, the result files."""
from __future__ import annotations

import json

import pytest

from benchmarks import neighbor_step

pytestmark = pytest.mark.slow


def test_neighbor_step_tiny(tmp_path):
    assert neighbor_step.main(["--num-nodes", "3000", "--num-edges", "20000", "--fanout", "4", "3",
                               "--batch-size", "64", "--threads", "2", "1", "--chunks", "4", "--steps", "3",
                               "--warmup", "2", "--profile-steps", "2", "--top", "5",
                               "--arms", '[{"threads": 1}]', "--arm-rounds", "2", "--arm-steps", "2",
                               "--folder", str(tmp_path), "--out", "ns"]) == 0
    r = json.loads((tmp_path / "ns.json").read_text())
    assert [c["threads"] for c in r["chunks"]] == [2, 1, 2, 1]
    assert set(r["per_threads"]) == {"2", "1"} and all(p["chunks"] == 2 for p in r["per_threads"].values())
    for c in r["chunks"]:
        # the phases partition each step: their totals over the chunk add up to the steps' total
        total = c["total_ms"]
        parts = sum(total[p] for p in ("load", "forward", "loss", "backward", "optimizer"))
        assert total["step"] > 0 and parts == pytest.approx(total["step"], rel=1e-3)
        assert all(c[p] > 0 for p in ("load", "forward", "backward", "optimizer", "step"))
        assert c["seeds_per_s"] > 0
    assert 1 <= len(r["profile"]) <= 5 and all(o["self_ms_per_step"] >= 0 for o in r["profile"])
    assert r["batch_sizes_example"]["nodes"] >= 64 and r["workload"]["fanout"] == [4, 3]
    base, one = r["arms"]
    assert base["changes"] == {} and one["changes"] == {"threads": 1}
    assert len(base["runs"]) == len(one["runs"]) == 2 and one["ratio"]["pairs"] == 2
    assert one["ratio"]["low"] <= one["ratio"]["ratio"] <= one["ratio"]["high"]
    md = (tmp_path / "ns.md").read_text()
    assert "{'threads': 1}" in md
    table = md.split("| threads |")[1].split("Chunks in order")[0]
    assert table.count("\n| 2 |") == 1 and table.count("\n| 1 |") == 1
