"""benchmarks/adapt_fanout: the driver's first pass (every fixed size, the best within budget
again with other seeds, the adaptive run), its rounds (alternating order, pairing, the
interval, budget counts) and the table, with the child processes replaced by a stand-in."""
from __future__ import annotations

import json
import math

import pytest

from benchmarks import adapt_fanout


class FakeRuns:
    """Fixed sizes at 1000 + size seeds/s, 512 and up over the budget; adaptive at 1400,
    its second run over the budget; a drift of +1 per call."""

    def __init__(self):
        self.calls = []

    def __call__(self, spec, timeout):
        self.calls.append((spec["mode"], spec.get("size") if spec["mode"] == "fixed" else None, spec["seed"]))
        n = len(self.calls)
        budget = 1000 + spec["budget_mib"] * 2**20
        if spec["mode"] == "fixed":
            rate = 1000.0 + spec["size"] + n
            peak_mib = 100 if spec["size"] >= 512 else 50
        else:
            rate = 1400.0 + n
            peak_mib = 70 if sum(c[0] == "adaptive" for c in self.calls) == 2 else 60
        loss = 1.0 + 0.01 * n
        fans = [f for f in spec["fanouts"] for _ in range(spec["epochs_per_fanout"])]
        return {"mode": spec["mode"], "size": spec.get("size"), "seed": spec["seed"], "seeds_per_s": rate,
                "wall_s": 1.0, "steps": 10, "base_rss": 1000, "budget_rss": budget,
                "peak_rss": 1000 + peak_mib * 2**20, "peak_above_base_mib": float(peak_mib),
                "epoch_loss": [loss] * len(fans), "last_epoch_loss": loss,
                "epochs": [{"fanout": f, "seconds": 0.1, "seeds_per_s": rate, "sizes": [128],
                            "peak_above_base_mib": float(peak_mib), "work_per_seed": 10.0} for f in fans],
                "curve": [[128, 1.0, 128, 100, 200, 0.01, 50.0, 1, e] for e in range(len(fans))],
                "releases": 0,
                "log": [{"step": 1, "epoch": 0, "kind": "explore", "from": {"size": 128}, "to": {"size": 256},
                         "gain": None, "predicted_bytes": 1000 + 2**20, "reason": "trying"}]}


def test_first_pass_and_alternating_rounds(monkeypatch, tmp_path):
    fake = FakeRuns()
    monkeypatch.setattr(adapt_fanout, "_run", fake)
    assert adapt_fanout.main(["--quick", "--sizes", "128,256,512", "--seeds", "2", "--rounds", "3",
                              "--budget-mib", "64", "--results-dir", str(tmp_path), "--out", "f"]) == 0
    S, B, A = ("fixed", 128, 0), ("fixed", 256, 0), ("adaptive", None, 0)
    assert fake.calls == [S, B, ("fixed", 512, 0), ("fixed", 256, 1), A,
                          A, B, S,   # round 2: adaptive first, every size within the budget (not 512)
                          S, B, A]   # round 3
    p = json.loads((tmp_path / "f.json").read_text())
    assert p["summary"]["best"]["size"] == 256  # 512 is faster but over the budget
    rd = p["rounds"]
    assert [r["order"] for r in rd["pairs"]] == ["fixed > adaptive", "adaptive > fixed 256 > fixed 128",
                                                 "fixed 128 > fixed 256 > adaptive"]
    assert rd["sizes"] == [128, 256] and set(rd["vs_size"]) == {"128", "256"}
    r128 = [r["adaptive_seeds_per_s"] / r["fixed_by_size"]["128"]["seeds_per_s"] for r in rd["pairs"]]
    assert rd["vs_size"]["128"]["ratio"]["ratio"] == pytest.approx(math.exp(sum(map(math.log, r128)) / 3))
    assert rd["vs_size"]["256"]["ratio"]["ratio"] == pytest.approx(rd["ratio"]["ratio"])
    assert rd["within_all_rounds"] == [128, 256] and rd["best_within_all"] == 256
    ratios = [r["adaptive_seeds_per_s"] / r["fixed_seeds_per_s"] for r in rd["pairs"]]
    iv = rd["ratio"]
    assert iv["pairs"] == 3 and iv["ratio"] == pytest.approx(math.exp(sum(map(math.log, ratios)) / 3))
    assert iv["low"] < iv["ratio"] < iv["high"]
    assert rd["adaptive_over_budget"] == 1 and rd["adaptive_runs"] == 3 and rd["fixed_over_budget"] == 0
    md = (tmp_path / "f.md").read_text()
    assert "**Best fixed seed batch size within budget: 256**" in md
    assert f"over 3 interleaved rounds: {iv['ratio']:.2f}x** (geometric mean)" in md
    assert "over the 64 MiB budget: 1 of 3" in md
    over = [r for r in rd["pairs"] if not r["adaptive_within"]]  # where the run over the budget peaked
    assert len(over) == 1 and over[0]["adaptive_peak_step"]["peak_mib"] == 50.0 and over[0]["adaptive_log"]
    assert f"- Round {over[0]['round']}, adaptive over the budget: peak 50.0 MiB at step 0" in md
    assert "## The adaptive run's switches (first pass)" in md and "| 1 | 0 | [5, 5] | explore | 128 | 256 |" in md
    assert (tmp_path / "f.png").exists()
    # the work model's table: the fixed runs' full batches (here only 128's) against the model on the same graph
    rows = p["work_model"]
    assert {r["size"] for r in rows} == {128} and len(rows) == len(p["args"]["fanouts"])
    assert all(r["measured"] == pytest.approx(300 / 128) and r["model"] > 0 for r in rows)
    assert "## Work per seed: measured vs the work model" in md and "| 128 | 2.3 / " in md
    assert "Fixed sizes within the budget in every round: 128, 256; the fastest of them: **256**" in md
    # a second locked stretch: 2 more rounds after the file's 3, the same sizes, the order going on alternating
    fake.calls.clear()
    assert adapt_fanout.main(["--more-rounds", "f", "--rounds", "3", "--results-dir", str(tmp_path)]) == 0
    assert fake.calls == [A, B, S, S, B, A]
    q = json.loads((tmp_path / "f.json").read_text())
    assert [r["round"] for r in q["rounds"]["pairs"]] == [1, 2, 3, 4, 5]
    assert q["rounds"]["ratio"]["pairs"] == 5 and q["rounds"]["vs_size"]["128"]["runs"] == 5
    assert "then python -m benchmarks adapt_fanout --more-rounds f" in q["command"]
    with pytest.raises(SystemExit):
        adapt_fanout.main(["--more-rounds", "nothing", "--rounds", "3", "--results-dir", str(tmp_path)])


def test_bad_fanouts_are_refused(tmp_path):
    with pytest.raises(SystemExit):
        adapt_fanout.main(["--fanouts", "5,5;10", "--results-dir", str(tmp_path)])
    with pytest.raises(SystemExit):
        adapt_fanout.main(["--fanouts", "0,5", "--results-dir", str(tmp_path)])


def _epochs(rows):
    return [{"fanout": f, "seconds": t, "peak_above_base_mib": m} for f, t, m in rows]


def test_ceiling_takes_each_fanouts_fastest_size_within_budget():
    small = {"size": 256, "epochs": _epochs([([5, 5], 2.0, 40), ([40, 40], 4.0, 90)])}
    mid = {"size": 512, "epochs": _epochs([([5, 5], 1.0, 60), ([40, 40], 3.0, 120)])}
    big = {"size": 1024, "epochs": _epochs([([5, 5], 0.5, 80), ([40, 40], 2.0, 200)])}  # over at [40, 40] only
    o = adapt_fanout.oracle([small, mid, big, {"error": "x"}], 128, 512)
    assert [(c["fanout"], c["size"]) for c in o["choice"]] == [([5, 5], 1024), ([40, 40], 512)]
    assert o["seconds"] == 3.5 and o["best_fixed_seconds"] == 4.0
    assert abs(o["ratio"] - 4.0 / 3.5) < 1e-12
    # a budget no size meets at one fanout: no ceiling
    assert adapt_fanout.oracle([small, mid, big], 30, 512) is None
