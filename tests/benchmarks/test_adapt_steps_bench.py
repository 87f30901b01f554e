"""benchmarks/adapt_steps: the driver's interleaving, the per-run summary at 8192 nodes (epochs 1
on, clean and not clean apart) and the table, with the child processes replaced by a stand-in."""
from __future__ import annotations

import json

import pytest

from benchmarks import adapt_steps


def _rows(mode):
    """Two epochs: epoch 0 at 1024 (adaptive) or 8192, epoch 1 at 8192, every 4th step clean;
    the adaptive run's 8192 steps 2 ms slower."""
    rows = []
    for epoch in range(2):
        for i in range(8):
            size = 1024 if (mode == "adaptive" and epoch == 0) else 8192
            clean = int(i % 4 == 0)
            step = 0.010 + (0.002 if mode == "adaptive" else 0.0) + (0.005 if clean else 0.0)
            rows.append([epoch, size, 8000, 32000, clean, step + 0.001, 0.0005, step, 0.0003, 300 + 1000 * clean,
                         0.02, 0.0, 50.0, 1])
    return rows


def test_modes_interleave_and_the_summary_compares_8192_steps_of_epoch_1_on(monkeypatch, tmp_path):
    calls = []

    def fake(cmd, env, timeout):
        spec = json.loads(cmd[cmd.index("--child") + 1])
        calls.append(spec["mode"])
        return {"mode": spec["mode"], "wall_s": 1.0, "graphs_per_s": 100.0, "releases": 3, "rows": _rows(spec["mode"]),
                "anon_huge_mib": [2.0, 4.0], "log": [[8, "explore", 1024, 2048]],
                "model_guard": [{"kept": "compiled", "recheck": False, "compiled_ms": 4.0, "eager_ms": 5.0}],
                "piece_guard": [[990, 3960, "rewritten"]]}

    monkeypatch.setattr(adapt_steps._common, "run_child", fake)
    assert adapt_steps.main(["--modes", "adaptive,fixed", "--rounds", "2", "--results-dir", str(tmp_path),
                             "--out", "s"]) == 0
    assert calls == ["adaptive", "fixed", "fixed", "adaptive"]
    p = json.loads((tmp_path / "s.json").read_text())
    a, f = p["runs"][0]["summary"], p["runs"][1]["summary"]
    assert a["steps_8192"] == f["steps_8192"] == 8 and a["clean_8192"] == 2
    assert a["plain_ms"] == pytest.approx(12.0) and f["plain_ms"] == pytest.approx(10.0)
    assert a["clean_ms"] == pytest.approx(17.0) and a["plain_faults"] == 300
    assert a["per_size"]["1024"][0] == 8 and "1024" not in f["per_size"] and a["preempted"] == 8
    md = (tmp_path / "s.md").read_text()
    assert "| 1 | adaptive | 100 | 3 | compiled (4.0 / 5.0 ms); pieces: 990/3960 rewritten | 8 (2) | 12.0 | 17.0 |" in md
    with pytest.raises(SystemExit):
        adapt_steps.main(["--modes", "nope", "--results-dir", str(tmp_path)])
