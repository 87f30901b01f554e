"""benchmarks/adapt: the driver's first pass and rounds (order, pairing, both baselines'
intervals, budget counts), the loss-noise check and the table, with the child processes
replaced by a stand-in (a real run is the benchmark itself: seconds per process)."""
from __future__ import annotations

import json
import math

import pytest

from benchmarks import adapt


class FakeRuns:
    """Stands in for adapt._run: fixed graphs-per-batch runs at 100 graphs/s (16 over the
    budget), fixed node budgets at 110 (2048 over the budget), fixed edge budgets at 105 (8192
    over the budget), adaptive at 125 (the third
    adaptive run over the budget: round 2's); a drift of +1 per call seen by all sides."""

    def __init__(self):
        self.calls = []

    def __call__(self, spec, timeout):
        self.calls.append((spec["mode"], spec["by"], spec.get("size"), spec["seed"]))
        n = len(self.calls)
        budget = 1000 + spec["budget_mib"] * 2**20
        if spec["mode"] == "fixed":
            over = spec["size"] in (16, 2048, 8192)
            rate = {"graphs": 100.0, "nodes": 110.0, "edges": 105.0}[spec["by"]] + n
            peak_mib = 200 if over else 90
        else:
            rate = 125.0 + n
            peak_mib = 160 if sum(c[0] == "adaptive" for c in self.calls) == 3 else 120
        loss = 0.7 + 0.001 * n
        return {"mode": spec["mode"], "by": spec["by"], "size": spec.get("size"), "seed": spec["seed"],
                "graphs_per_s": rate, "wall_s": 1.0, "steps": 10, "base_rss": 1000, "budget_rss": budget,
                "peak_rss": 1000 + peak_mib * 2**20, "peak_above_base_mib": float(peak_mib),
                "epoch_loss": [loss], "last_epoch_loss": loss, "curve": [[8, 0.7, 8, 80, 320, 0.01, 50.0]],
                "log": []}


def test_rounds_rotate_and_pair_against_both_baselines(monkeypatch, tmp_path):
    fake = FakeRuns()
    monkeypatch.setattr(adapt, "_run", fake)
    assert adapt.main(["--quick", "--sizes", "8,16", "--node-sizes", "1024,2048", "--edge-sizes", "4096,8192,16384",
                       "--seeds", "2", "--rounds", "4", "--results-dir", str(tmp_path), "--out", "a"]) == 0
    G, N, E, A = (("fixed", "graphs", 8, 0), ("fixed", "nodes", 1024, 0), ("fixed", "edges", 4096, 0),
                  ("adaptive", "nodes", None, 0))
    # first pass: every fixed setting of the three kinds (16384 edges not run: 8192 was over the
    # budget), each best within budget again with seed 1, the adaptive run (by nodes) and the
    # other kind's adaptive run; then 3 rounds, the order rotating
    assert fake.calls == [G, ("fixed", "graphs", 16, 0), N, ("fixed", "nodes", 2048, 0), E, ("fixed", "edges", 8192, 0),
                          ("fixed", "graphs", 8, 1), ("fixed", "nodes", 1024, 1), ("fixed", "edges", 4096, 1), A,
                          ("adaptive", "graphs", None, 0),
                          N, E, A, G,   # round 2
                          E, A, G, N,   # round 3
                          A, G, N, E]   # round 4
    p = json.loads((tmp_path / "a.json").read_text())
    s = p["summary"]
    assert s["best_graphs"]["size"] == 8 and s["best_nodes"]["size"] == 1024 and s["best_edges"]["size"] == 4096
    assert s["best_kind"] == "nodes"
    assert p["skipped"] == [{"mode": "fixed", "by": "edges", "size": 16384, "seed": 0,
                             "skipped": "8192 edges was over the budget already"}]
    rd = p["rounds"]
    assert [r["order"] for r in rd["pairs"]] == ["graphs > nodes > edges > adaptive",
                                                 "nodes > edges > adaptive > graphs",
                                                 "edges > adaptive > graphs > nodes",
                                                 "adaptive > graphs > nodes > edges"]
    assert rd["pairs"][0]["graphs_graphs_per_s"] == 101.0 and rd["pairs"][0]["adaptive_graphs_per_s"] == 135.0
    for k in ("graphs", "nodes", "edges"):
        ratios = [r["adaptive_graphs_per_s"] / r[f"{k}_graphs_per_s"] for r in rd["pairs"]]
        iv = rd[f"vs_{k}"]
        assert iv["pairs"] == 4 and iv["ratio"] == pytest.approx(math.exp(sum(map(math.log, ratios)) / 4))
        assert iv["low"] < iv["ratio"] < iv["high"]
    assert rd["vs_nodes"]["ratio"] < rd["vs_edges"]["ratio"] < rd["vs_graphs"]["ratio"]
    assert rd["adaptive_over_budget"] == 1 and rd["adaptive_runs"] == 4 and rd["fixed_over_budget"] == 0
    assert rd["adaptive_max_peak_above_base_mib"] == 160
    md = (tmp_path / "a.md").read_text()
    assert "## Interleaved rounds: best fixed graphs, best fixed nodes, best fixed edges, adaptive" in md
    assert "| fixed | 16384 edges | 0 | not run: 8192 edges was over the budget already |" in md
    assert "Against the best fixed setting of all (1024 nodes)" in md
    iv = rd["vs_graphs"]
    assert f"over 4 interleaved rounds: {iv['ratio']:.2f}x** (geometric mean), 95% interval " \
           f"[{iv['low']:.2f}, {iv['high']:.2f}]" in md
    assert "over the 150 MiB budget: 1 of 4" in md
    assert "**Best fixed node budget within budget: 1024**" in md


def test_one_round_is_the_single_pass(monkeypatch, tmp_path):
    fake = FakeRuns()
    monkeypatch.setattr(adapt, "_run", fake)
    adapt.main(["--quick", "--sizes", "8,16", "--node-sizes", "1024", "--edge-sizes", "4096", "--seeds", "2",
                "--results-dir", str(tmp_path), "--out", "a"])
    assert len(fake.calls) == 9 and "rounds" not in json.loads((tmp_path / "a.json").read_text())
    for bad in (["--rounds", "0"], ["--seeds", "1"]):
        with pytest.raises(SystemExit):
            adapt.main(["--quick", *bad, "--results-dir", str(tmp_path)])


def test_loss_check_compares_the_gap_with_the_seed_spread():
    def run(seed, losses):
        return {"seed": seed, "epoch_loss": losses}

    lc = adapt.loss_check(run(0, [0.52, 0.62]), [run(0, [0.50, 0.70]), run(1, [0.55, 0.65]), run(2, [0.45, 0.75])])
    assert lc["fixed_mean"] == pytest.approx([0.50, 0.70])
    assert lc["gaps"] == pytest.approx([0.02, 0.08]) and lc["noise"] == pytest.approx([0.10, 0.10])
    assert lc["within"] == [True, True] and lc["last_within"] and lc["better"] == [False, True]
    lc = adapt.loss_check(run(0, [0.52, 0.90]), [run(0, [0.50, 0.70]), run(1, [0.55, 0.65]), run(2, [0.45, 0.75])])
    assert lc["within"] == [True, False] and lc["epochs_within"] == 1 and not lc["last_within"]


def test_the_denser_workload_grows_the_degree_with_the_node_count():
    """workload 'denser': the average degree is linear in the node count, min_degree at
    min_nodes to max_degree at max_nodes; 'uniform' keeps 4. The graphs' nodes, features and
    labels are the same in both."""
    spec = {"graphs": 60, "min_nodes": 8, "max_nodes": 200, "min_degree": 2.0, "max_degree": 16.0}
    assert adapt.degree(dict(spec, workload="denser"), 8) == 2.0
    assert adapt.degree(dict(spec, workload="denser"), 200) == 16.0
    assert adapt.degree(dict(spec, workload="uniform"), 200) == 4.0
    u = adapt._dataset(dict(spec, workload="uniform"))
    d = adapt._dataset(dict(spec, workload="denser"))
    assert [int(g.num_nodes) for g in u] == [int(g.num_nodes) for g in d]
    assert all(bool((a.x == b.x).all()) and int(a.y) == int(b.y) for a, b in zip(u, d))
    deg = [g.num_edges / g.num_nodes for g in d]
    assert deg[0] < 3 and deg[-1] > 14
    assert all(abs(g.num_edges / g.num_nodes - 4) < 0.3 for g in u)


def test_more_rounds_continue_an_earlier_invocation(monkeypatch, tmp_path):
    """--more-rounds NAME: no first pass; the rounds continue NAME's numbering and rotation, and
    the intervals cover the old rounds and the new."""
    fake = FakeRuns()
    monkeypatch.setattr(adapt, "_run", fake)
    assert adapt.main(["--quick", "--sizes", "8", "--node-sizes", "1024", "--edge-sizes", "4096", "--seeds", "2",
                       "--rounds", "2", "--results-dir", str(tmp_path), "--out", "a"]) == 0
    n = len(fake.calls)
    assert adapt.main(["--more-rounds", "a", "--rounds", "3", "--results-dir", str(tmp_path)]) == 0
    assert len(fake.calls) == n + 2 * 4 and all(c[3] == 0 for c in fake.calls[n:])
    rd = json.loads((tmp_path / "a.json").read_text())["rounds"]
    assert [r["round"] for r in rd["pairs"]] == [1, 2, 3, 4]
    assert rd["pairs"][2]["order"] == "edges > adaptive > graphs > nodes"
    assert rd["vs_nodes"]["pairs"] == 4 and rd["adaptive_runs"] == 4
    with pytest.raises(FileNotFoundError):
        adapt.main(["--more-rounds", "missing", "--results-dir", str(tmp_path)])


def test_a_kind_with_no_setting_within_the_budget_is_reported(monkeypatch, tmp_path):
    """Every graphs-per-batch size over the budget: no best of that kind, the rest compares
    against the others (the report used to fail on the other adaptive run's line)."""
    fake = FakeRuns()
    monkeypatch.setattr(adapt, "_run", fake)
    assert adapt.main(["--quick", "--sizes", "16,32", "--node-sizes", "1024", "--edge-sizes", "4096", "--seeds", "2",
                       "--rounds", "2", "--results-dir", str(tmp_path), "--out", "a"]) == 0
    p = json.loads((tmp_path / "a.json").read_text())
    assert "best_graphs" not in p["summary"] and p["rounds"]["sides"] == ["nodes", "edges", "adaptive"]
    assert ("fixed", "graphs", 32, 0) not in fake.calls
    md = (tmp_path / "a.md").read_text()
    assert "Best fixed graphs per batch within budget: none." in md
    assert "The other adaptive run (by='graphs'): " in md and "x the best fixed nodes" in md
