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
    budget), fixed node budgets at 110 (2048 over the budget), adaptive at 125 (the third
    adaptive run over the budget: round 2's); a drift of +1 per call seen by all sides."""

    def __init__(self):
        self.calls = []

    def __call__(self, spec, timeout):
        self.calls.append((spec["mode"], spec["by"], spec.get("size"), spec["seed"]))
        n = len(self.calls)
        budget = 1000 + spec["budget_mib"] * 2**20
        if spec["mode"] == "fixed":
            over = spec["size"] in (16, 2048)
            rate = (100.0 if spec["by"] == "graphs" else 110.0) + n
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
    assert adapt.main(["--quick", "--sizes", "8,16", "--node-sizes", "1024,2048", "--seeds", "2", "--rounds", "4",
                       "--results-dir", str(tmp_path), "--out", "a"]) == 0
    G, N, A = ("fixed", "graphs", 8, 0), ("fixed", "nodes", 1024, 0), ("adaptive", "nodes", None, 0)
    # first pass: every fixed setting of both kinds, each best within budget again with seed 1, the
    # adaptive run (by nodes) and the other kind's adaptive run; then 3 rounds, the order rotating
    assert fake.calls == [G, ("fixed", "graphs", 16, 0), N, ("fixed", "nodes", 2048, 0),
                          ("fixed", "graphs", 8, 1), ("fixed", "nodes", 1024, 1), A, ("adaptive", "graphs", None, 0),
                          N, A, G,   # round 2
                          A, G, N,   # round 3
                          G, N, A]   # round 4
    p = json.loads((tmp_path / "a.json").read_text())
    s = p["summary"]
    assert s["best_graphs"]["size"] == 8 and s["best_nodes"]["size"] == 1024
    rd = p["rounds"]
    assert [r["order"] for r in rd["pairs"]] == ["graphs > nodes > adaptive", "nodes > adaptive > graphs",
                                                 "adaptive > graphs > nodes", "graphs > nodes > adaptive"]
    assert rd["pairs"][0]["graphs_graphs_per_s"] == 101.0 and rd["pairs"][0]["adaptive_graphs_per_s"] == 132.0
    for k in ("graphs", "nodes"):
        ratios = [r["adaptive_graphs_per_s"] / r[f"{k}_graphs_per_s"] for r in rd["pairs"]]
        iv = rd[f"vs_{k}"]
        assert iv["pairs"] == 4 and iv["ratio"] == pytest.approx(math.exp(sum(map(math.log, ratios)) / 4))
        assert iv["low"] < iv["ratio"] < iv["high"]
    assert rd["vs_nodes"]["ratio"] < rd["vs_graphs"]["ratio"]
    assert rd["adaptive_over_budget"] == 1 and rd["adaptive_runs"] == 4 and rd["fixed_over_budget"] == 0
    assert rd["adaptive_max_peak_above_base_mib"] == 160
    md = (tmp_path / "a.md").read_text()
    assert "## Interleaved rounds: best fixed graphs, best fixed nodes, adaptive" in md
    iv = rd["vs_graphs"]
    assert f"over 4 interleaved rounds: {iv['ratio']:.2f}x** (geometric mean), 95% interval " \
           f"[{iv['low']:.2f}, {iv['high']:.2f}]" in md
    assert "over the 150 MiB budget: 1 of 4" in md
    assert "**Best fixed node budget within budget: 1024**" in md


def test_one_round_is_the_single_pass(monkeypatch, tmp_path):
    fake = FakeRuns()
    monkeypatch.setattr(adapt, "_run", fake)
    adapt.main(["--quick", "--sizes", "8,16", "--node-sizes", "1024", "--seeds", "2", "--results-dir", str(tmp_path),
                "--out", "a"])
    assert len(fake.calls) == 7 and "rounds" not in json.loads((tmp_path / "a.json").read_text())
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
