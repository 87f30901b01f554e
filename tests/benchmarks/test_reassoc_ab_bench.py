"""The default-against-reassociate A/B (benchmarks/reassoc_ab.py): its children are the models
benchmark's gnncompile variants, the rounds interleave, --append adds to the same measurement."""
from __future__ import annotations

import json

import pytest

from benchmarks import _common, reassoc_ab


def _measure(side, model, r):
    ms = {"base": 300.0, "head": 250.0, "eager": 1300.0, "csr": 500.0}[side] + r
    return {"median_s": ms / 1e3, "first_loss": 2.5 + (1e-7 if side == "head" else 0.0) if side in ("base", "head")
            else 0.0, "graph": "g", "rel_err": 0.0, "guard": []}


def test_stand_in_run_writes_the_report_and_appends(tmp_path, monkeypatch):
    monkeypatch.setattr(_common, "cpu_model", lambda: "Test CPU (family 0 model 0)")
    argv = ["--rounds", "2", "--results-dir", str(tmp_path), "--name", "ab"]
    assert reassoc_ab.main(argv, measure=_measure) == 0
    p = json.loads((tmp_path / "ab.json").read_text())
    assert len(p["runs"]) == 2 * 4 and p["cpu"].startswith("Test CPU")
    gcn = p["summary"]["models"]["GCN"]
    assert gcn["pairs"] == 2 and 1.19 < gcn["speedup"]["ratio"] < 1.21  # 300 / 250
    md = (tmp_path / "ab.md").read_text()
    assert "| GCN | 300.5 | 250.5 | 1.20x" in md and "default / reassociate ms: 300 / 250, 301 / 251" in md and "| eager |" in md and "| csr |" in md
    assert reassoc_ab.main(argv[:1] + ["1", "--append"] + argv[2:], measure=_measure) == 0
    p = json.loads((tmp_path / "ab.json").read_text())
    assert p["rounds"] == [0, 1, 2] and len(p["sessions"]) == 2
    with pytest.raises(SystemExit):  # other options: not the same measurement
        reassoc_ab.main(["--repeats", "3", "--append"] + argv[2:], measure=_measure)


def test_children_are_the_models_benchmarks_variants():
    assert reassoc_ab.SIDES == {"base": "gnncompile", "head": "gnncompile-reassoc"}
    from benchmarks import models

    assert "gnncompile-reassoc" in models.__doc__
