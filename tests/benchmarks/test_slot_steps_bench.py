"""benchmarks/slot_steps.py: the interleaved GINE steps run at a tiny size (the copy threshold
lowered to it), the two compiled forms agree bit for bit in their first step, one copy is made
and then hit once a step; below the threshold no copy is made and the benchmark says so."""
from __future__ import annotations

import pytest
import torch

from benchmarks import slot_steps
from gnncompile.ops import slots


def test_runs_and_reports(monkeypatch):
    monkeypatch.setattr(slots, "SLOT_COPY_MIN_EDGES", 0)
    torch._dynamo.reset()
    r = slot_steps.run(200, 16, 4, rounds=2, warmup=0, eager=True)
    assert r["first_step_bitwise_equal"] and r["copies_first_step"] == 1 and r["cache_hits_timed"] == 2
    assert set(r["median_ms"]) == {"slots", "perm", "eager"}
    text = slot_steps.markdown({"command": "x", "cpu": "cpu", "threads": 2, "result": r,
                                "loadavg_before_after": [(0.0, 0.0, 0.0), (0.0, 0.0, 0.0)]})
    assert "perm / slots" in text


def test_below_the_threshold_no_copy():
    torch._dynamo.reset()
    with pytest.raises(RuntimeError, match="copies made 0"):
        slot_steps.run(200, 16, 4, rounds=1, warmup=0, eager=False)
