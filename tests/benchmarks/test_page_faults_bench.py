"""benchmarks.page_faults: the summary and table from given runs (medians, the ratio to the first
setting, errors shown, first losses compared), the HUGE:CACHE settings parsed, and one child step
loop in this process on a small graph. Speed is not asserted."""
from __future__ import annotations

import math

import pytest

from benchmarks import page_faults


def _run(wall, faults, loss=1.5, hits=0):
    return {"rows": [{"wall_s": w, "minflt": f, "sys_s": w / 4, "user_s": w, "cache_hits": hits, "cache_misses": 0}
                     for w, f in zip(wall, faults)],
            "first_loss": loss, "huge_pages": "x", "buffer_cache": "y", "advised_bytes": 0,
            "cache_held_peak_bytes": hits << 20, "maxrss_bytes": 100 << 20}


def test_summary_takes_medians_over_every_step_and_the_table_the_ratio():
    off = page_faults.summary([_run([0.3, 0.2, 0.25], [50, 50, 50]), _run([0.21], [40])])
    on = page_faults.summary([_run([0.1, 0.2], [2, 4], hits=7), {"error": "rc 1: boom"}])
    assert off["wall_s"] == pytest.approx(0.23) and off["minflt"] == 50 and off["steps"] == 4
    assert on["wall_s"] == pytest.approx(0.15) and on["processes"] == 1 and on["first_losses"] == [1.5]
    assert on["cache_hits"] == 7 and on["cache_held_peak_bytes"] == 7 << 20 and off["cache_hits"] == 0
    p = {"summary": {"GCN": {"auto:off": off, "auto:auto": on},
                     "GIN": {"auto:off": page_faults.summary([{"error": "rc 9: x"}]), "auto:auto": on}},
         "machine": {"cpu": "c", "torch": "t"}, "nodes": 10, "threads": 2, "rounds": 1, "repeats": 3,
         "thp_mode": "madvise", "loadavg_before_after": [(0, 0, 0), (1, 1, 1)], "command": "cmd"}
    md = page_faults.markdown(p)
    assert "| GCN | auto:auto | 150.0 | 3 |" in md and f"| {0.23 / 0.15:.2f}x |" in md
    assert "| 7 / 0 |" in md
    assert "| GIN | auto:off | error: rc 9: x" in md
    assert "GCN bit-equal across settings" in md
    p["summary"]["GCN"]["auto:auto"] = page_faults.summary([_run([0.1], [2], loss=1.25)])
    assert "GCN DIFFER" in page_faults.markdown(p)


def test_settings_are_huge_colon_cache():
    assert page_faults.parse_setting("auto:auto") == ("auto", "auto")
    assert page_faults.parse_setting("off:512") == ("off", 512)
    assert page_faults.parse_setting("auto") == ("auto", "off")  # the form before the cache
    for bad in ("on:auto", "auto:on", "auto:-1"):
        with pytest.raises(ValueError, match="setting"):
            page_faults.parse_setting(bad)
    with pytest.raises(SystemExit):
        page_faults.main(["--settings", "auto:maybe"])


def test_child_steps_and_counts_on_a_small_graph():
    out = page_faults.child("GCN", 2000, "auto", repeats=2, threads=1)
    assert len(out["rows"]) == 2 and math.isfinite(out["first_loss"])
    assert all(r["wall_s"] > 0 and r["minflt"] >= 0 and r["sys_s"] >= 0 for r in out["rows"])
    assert isinstance(out["huge_pages"], str) and out["maxrss_bytes"] > 0
