"""benchmarks/adapt: the driver's rounds (order, pairing, interval, budget counts) and its table,
with the child processes replaced by a stand-in (a real run is the benchmark itself: seconds per
process)."""
from __future__ import annotations

import json
import math

import pytest

from benchmarks import adapt


class FakeRuns:
    """Stands in for adapt._run: fixed runs at 100 graphs/s (size 16 over the budget), adaptive
    at 125 (one of them over the budget: round 3); records the calls."""

    def __init__(self):
        self.calls = []

    def __call__(self, spec, timeout):
        self.calls.append((spec["mode"], spec.get("size"), spec["seed"]))
        n = len(self.calls)
        budget = 1000 + spec["budget_mib"] * 2**20
        if spec["mode"] == "fixed":
            over = spec["size"] == 16
            rate = 100.0 + n  # a drift over the run, seen by both sides
            peak_mib = 200 if over else 90
        else:
            rate = 125.0 + n
            peak_mib = 160 if sum(m == "adaptive" for m, _, _ in self.calls) == 3 else 120
        return {"mode": spec["mode"], "size": spec.get("size"), "seed": spec["seed"], "graphs_per_s": rate,
                "wall_s": 1.0, "steps": 10, "base_rss": 1000, "budget_rss": budget,
                "peak_rss": 1000 + peak_mib * 2**20, "peak_above_base_mib": float(peak_mib),
                "last_epoch_loss": 0.7 + 0.001 * n, "curve": [[8, 0.7, 8, 80, 320]], "log": []}


def test_rounds_alternate_and_pair(monkeypatch, tmp_path):
    fake = FakeRuns()
    monkeypatch.setattr(adapt, "_run", fake)
    assert adapt.main(["--quick", "--sizes", "8,16", "--rounds", "4", "--results-dir", str(tmp_path),
                       "--out", "a"]) == 0
    # first pass: every fixed size, the best within budget with seed 1, adaptive; then 3 rounds alternating
    assert fake.calls == [("fixed", 8, 0), ("fixed", 16, 0), ("fixed", 8, 1), ("adaptive", None, 0),
                          ("adaptive", None, 0), ("fixed", 8, 0),   # round 2: adaptive first
                          ("fixed", 8, 0), ("adaptive", None, 0),   # round 3: fixed first
                          ("adaptive", None, 0), ("fixed", 8, 0)]   # round 4
    p = json.loads((tmp_path / "a.json").read_text())
    rd = p["rounds"]
    assert [r["order"] for r in rd["pairs"]] == ["fixed first", "adaptive first", "fixed first", "adaptive first"]
    ratios = [r["adaptive_graphs_per_s"] / r["fixed_graphs_per_s"] for r in rd["pairs"]]
    assert rd["pairs"][0]["fixed_graphs_per_s"] == 101.0 and rd["pairs"][0]["adaptive_graphs_per_s"] == 129.0
    iv = rd["interval"]
    assert iv["pairs"] == 4 and iv["ratio"] == pytest.approx(math.exp(sum(map(math.log, ratios)) / 4))
    assert iv["low"] < iv["ratio"] < iv["high"]
    assert rd["adaptive_over_budget"] == 1 and rd["adaptive_runs"] == 4 and rd["fixed_over_budget"] == 0
    assert rd["adaptive_max_peak_above_base_mib"] == 160
    md = (tmp_path / "a.md").read_text()
    assert "## Interleaved rounds: best fixed (8 graphs) vs adaptive" in md
    assert f"{iv['ratio']:.2f}x (geometric mean), 95% interval [{iv['low']:.2f}, {iv['high']:.2f}]" in md
    assert "over the 150 MiB budget: 1 of 4" in md


def test_one_round_is_the_single_pass(monkeypatch, tmp_path):
    fake = FakeRuns()
    monkeypatch.setattr(adapt, "_run", fake)
    adapt.main(["--quick", "--sizes", "8,16", "--results-dir", str(tmp_path), "--out", "a"])
    assert len(fake.calls) == 4 and "rounds" not in json.loads((tmp_path / "a.json").read_text())
    with pytest.raises(SystemExit):
        adapt.main(["--quick", "--rounds", "0", "--results-dir", str(tmp_path)])
