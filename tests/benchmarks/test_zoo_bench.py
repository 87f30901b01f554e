"""benchmarks.zoo's report: the paired steps' interval decides faster / slower / no difference,
and the markdown counts and names them (no model is run here)."""
from __future__ import annotations

from benchmarks import zoo


def _row(name, speedup, interval):
    return {"name": name, "agree": True, "eager_ms": speedup, "gnncompile_ms": 1.0, "speedup": speedup,
            "interval": interval, "guard": [], "fused": 1, "pieces": 1, "breaks": 0, "fused_op_calls": 2}


def test_verdict_follows_the_interval():
    assert zoo.verdict(_row("a", 1.3, [1.1, 1.5])) == "faster"
    assert zoo.verdict(_row("b", 0.97, [0.93, 1.01])) == "no difference measured"
    assert zoo.verdict(_row("c", 0.9, [0.85, 0.95])) == "slower"
    assert zoo.verdict(_row("d", 1.0, None)) == "no difference measured"


def test_markdown_counts_and_names_the_slower_entries():
    rows = [_row("A", 1.3, [1.1, 1.5]), _row("B", 0.97, [0.93, 1.01]), _row("C", 0.9, [0.85, 0.95]),
            {"name": "D", "error": "rc 1: boom"}]
    p = {"rows": rows, "machine": {"torch": "x"}, "nodes": 10, "degree": 2, "steps": 4, "threads": 1,
         "cpu": "cpu", "loadavg_before_after": [[0.1, 0.1, 0.1], [0.2, 0.2, 0.2]], "command": "cmd"}
    md = zoo.markdown(p)
    assert "faster in 1, no difference measured in 1, slower in 1 (C)." in md
    assert "| C | 0.90 | 1.00 | 0.90x | 0.90x [0.85, 0.95] |" in md
    header, rule = [ln for ln in md.splitlines() if ln.startswith("|")][:2]
    assert all(ln.count("|") == header.count("|") for ln in md.splitlines() if ln.startswith("| "))
    assert rule.count("|") == header.count("|")


def test_resume_keeps_measured_entries_of_the_same_options_only(tmp_path):
    import json

    import pytest

    opts = {"nodes": 10, "degree": 2, "steps": 4, "threads": 1, "guard": "time"}
    path = tmp_path / "z.partial.json"
    assert zoo._resumed(path, opts, ["A"]) == ({}, [])
    rows = [_row("A", 1.3, [1.1, 1.5]), {"name": "B", "error": "timeout"}, _row("C", 1.0, None)]
    sessions = [{"command": "c1", "loadavg_before": [0.5, 0.5, 0.5]}]
    path.write_text(json.dumps({"options": opts, "rows": rows, "sessions": sessions}))
    done, got_sessions = zoo._resumed(path, opts, ["A", "B"])
    assert list(done) == ["A"] and got_sessions == sessions  # B failed: runs again; C not asked for
    with pytest.raises(SystemExit, match="was run with"):
        zoo._resumed(path, {**opts, "steps": 60}, ["A"])
    path.write_text("{not json")
    with pytest.raises(SystemExit, match="not a partial run"):
        zoo._resumed(path, opts, ["A"])


def test_stop_after_leaves_the_partial_result_for_resume(tmp_path):
    import json

    import pytest

    opts = {"nodes": 2000, "degree": 8, "steps": 60, "threads": 2, "guard": "time"}
    partial = tmp_path / "z.partial.json"
    partial.write_text(json.dumps({"options": opts, "rows": [_row("GCNConv", 1.3, [1.1, 1.5])],
                                   "sessions": [{"command": "c1", "loadavg_before": [0.5, 0.5, 0.5]}]}))
    with pytest.raises(SystemExit) as stop:  # GCNConv kept; SGConv not started (no child runs)
        zoo.main(["--only", "GCNConv,SGConv", "--results-dir", str(tmp_path), "--out", "z", "--resume",
                  "--stop-after", "0"])
    assert stop.value.code == 3
    kept = json.loads(partial.read_text())
    assert [r["name"] for r in kept["rows"]] == ["GCNConv"] and not (tmp_path / "z.md").exists()
