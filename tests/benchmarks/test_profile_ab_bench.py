"""The profile A/B benchmark (benchmarks/profile_ab.py): which settings each side runs, the
refusal of a tuned batch size, the verdict against a target, and one tiny real run whose
children are fresh processes."""
from __future__ import annotations

import json
from pathlib import Path

import pytest

pytest.importorskip("optuna")

from benchmarks import profile_ab  # noqa: E402
from gnncompile import profiles  # noqa: E402
from gnncompile.hardware import device  # noqa: E402

TINY_WL = {"kind": "graphs", "model": "gin", "hidden": 8, "layers": 2, "num_features": 4, "num_classes": 2,
           "compiled": False, "num_graphs": 60, "min_nodes": 3, "max_nodes": 6, "batch_size": 16}


def _doc(settings=None, workload=None, rule=None):
    s = {"knobs": [2], "threads": 1, "batch_size": 16, "pool_size": 3, "num_workers": 0,
         "pin_memory": False, "persistent_workers": False, "inner": None}
    s.update(settings or {})
    doc = profiles.make(device.detect(), workload or TINY_WL, s, tuned=2.0, default=1.0, unit="graphs/s")
    doc["batch_size_rule"] = rule or {"tuned": False, "batch_size": s["batch_size"]}
    return doc


def test_plan_runs_the_profile_as_a_user_applies_it_and_the_tuners_defaults():
    p = profile_ab.plan(_doc(), steps=3, warmup=1)
    assert p["profile"]["loader"] == "pooled" and p["profile"]["pool_size"] == 3
    assert p["profile"]["knobs"] == [2] and p["profile"]["threads"] == 1
    assert p["defaults"]["loader"] == "pyg" and p["defaults"]["batch_size"] == 16
    assert p["workload"]["steps"] == 3 and p["workload"]["warmup"] == 1
    assert p["unit"] == "graphs/s" and not p["batch_size_tuned"]


def test_a_tuned_batch_size_is_refused_unless_allowed():
    wl = dict(TINY_WL, batch_range=[8, 64], default_batch_size=16)
    wl.pop("batch_size")
    doc = _doc({"batch_size": 48}, wl, {"tuned": True, "batch_size": 48})
    assert "refused" in profile_ab.plan(doc, None, None)
    p = profile_ab.plan(doc, None, None, allow_tuned_batch=True)
    # the profile at its own batch size, the defaults at the reference one
    assert p["profile"]["batch_size"] == 48 and p["defaults"]["batch_size"] == 16 and p["batch_size_tuned"]


def test_verdict_reads_the_interval():
    res = {"interval": {"ratio": 1.2, "low": 1.16, "high": 1.25}}
    assert profile_ab.verdict(res, 1.15).startswith("met")
    res = {"interval": {"ratio": 1.2, "low": 1.05, "high": 1.3}}
    assert profile_ab.verdict(res, 1.15).startswith("point only")
    res = {"interval": {"ratio": 1.1, "low": 1.05, "high": 1.15}}
    assert profile_ab.verdict(res, 1.15).startswith("not met")
    assert profile_ab.verdict({"refused": "x"}, 1.1) == "refused"
    assert profile_ab.verdict({"interval": None}, 1.1) == "no measurement"


@pytest.mark.slow
def test_a_tiny_run_measures_both_sides_in_child_processes(tmp_path):
    path = tmp_path / "p.json"
    path.write_text(json.dumps(_doc()))
    assert profile_ab.main([str(path), "--rounds", "2", "--steps", "3", "--warmup", "1",
                            "--out", str(tmp_path), "--target", "1.0"]) == 0
    r = json.loads((tmp_path / "profile_ab.json").read_text())
    (res,) = r["results"]
    assert not res["errors"], res["errors"]
    assert len(res["runs"]["defaults"]) == len(res["runs"]["profile"]) == 2
    assert all(v > 0 for side in res["runs"].values() for v in side)
    iv = res["interval"]
    assert iv["pairs"] == 2 and iv["low"] is not None and iv["low"] <= iv["ratio"] <= iv["high"]
    # each measurement ran in its own process, with the settings of its side
    assert [c["threads"] for c in res["children"]["profile"]] == [1, 1]
    md = (tmp_path / "profile_ab.md").read_text()
    assert "p.json" in md and "loader 'pyg' -> 'pooled'" in md
    # the machine's state: three probes a round (before each child, after the round)
    st = res["state"]
    assert len(st["core_latency_ns"]) == 2 and all(len(p) == 3 for p in st["core_latency_ns"])
    assert "rounds in one state" in md


def test_state_matched_keeps_the_rounds_whose_probes_agree():
    probes = [[150.0, 160.0, 140.0], [150.0, 400.0, 390.0], [380.0, 420.0, 350.0], [150.0, None, 150.0], []]
    assert profile_ab.state_matched(probes) == [0, 2]
    assert profile_ab.state_matched(probes, tolerance=3.0) == [0, 1, 2]


def test_core_latency_probe_reads_a_round_trip_or_none():
    import os
    import shutil

    from benchmarks import _common

    if len(os.sched_getaffinity(0)) < 2 or not (shutil.which("c++") or shutil.which("g++")):
        pytest.skip("needs two CPUs and a C++ compiler")
    ns = _common.core_latency_ns(n=2000, runs=1)
    assert ns is not None and 1.0 < ns < 1e6
    # a CPU this process may not run on: no reading, no exception
    assert _common.core_latency_ns([0, 4096], n=10, runs=1) is None


def test_per_kind_options():
    import argparse

    ap = argparse.ArgumentParser()
    assert profile_ab._per_kind(ap, "--steps", "200", int) == {"*": 200}
    assert profile_ab._per_kind(ap, "--steps", "graphs=600,fullgraph=100", int) == {"graphs": 600, "fullgraph": 100}
    assert profile_ab._per_kind(ap, "--steps", None, int) == {}
    for bad in ("graphs=x", "molecules=3"):
        with pytest.raises(SystemExit):
            profile_ab._per_kind(ap, "--steps", bad, int)
