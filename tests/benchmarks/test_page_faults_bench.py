"""benchmarks.page_faults: the summary and table from given runs (medians, the off / on ratio,
errors shown), and one child step loop in this process on a small graph. Speed is not asserted."""
from __future__ import annotations

import math

import pytest

from benchmarks import page_faults


def _run(wall, faults, loss=1.5):
    return {"rows": [{"wall_s": w, "minflt": f, "sys_s": w / 4, "user_s": w} for w, f in zip(wall, faults)],
            "first_loss": loss, "huge_pages": "x", "advised_bytes": 0, "maxrss_bytes": 100 << 20}


def test_summary_takes_medians_over_every_step_and_the_table_the_ratio():
    off = page_faults.summary([_run([0.3, 0.2, 0.25], [50, 50, 50]), _run([0.21], [40])])
    on = page_faults.summary([_run([0.1, 0.2], [2, 4]), {"error": "rc 1: boom"}])
    assert off["wall_s"] == pytest.approx(0.23) and off["minflt"] == 50 and off["steps"] == 4
    assert on["wall_s"] == pytest.approx(0.15) and on["processes"] == 1 and on["first_losses"] == [1.5]
    p = {"summary": {"GCN": {"off": off, "auto": on}, "GIN": {"off": page_faults.summary([{"error": "rc 9: x"}]),
                                                              "auto": on}},
         "machine": {"cpu": "c", "torch": "t"}, "nodes": 10, "threads": 2, "rounds": 1, "repeats": 3,
         "thp_mode": "madvise", "loadavg_before_after": [(0, 0, 0), (1, 1, 1)], "command": "cmd"}
    md = page_faults.markdown(p)
    assert "| GCN | auto | 150.0 | 3 |" in md and f"{0.23 / 0.15:.2f}x" in md
    assert "| GIN | off | error: rc 9: x" in md


def test_child_steps_and_counts_on_a_small_graph():
    out = page_faults.child("GCN", 2000, "auto", repeats=2, threads=1)
    assert len(out["rows"]) == 2 and math.isfinite(out["first_loss"])
    assert all(r["wall_s"] > 0 and r["minflt"] >= 0 and r["sys_s"] >= 0 for r in out["rows"])
    assert isinstance(out["huge_pages"], str) and out["maxrss_bytes"] > 0
