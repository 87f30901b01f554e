"""benchmarks/bf16.py on a tiny size into a temporary folder: the op rows, the training step and
the accuracy rows are measured and consistent with each other and with the table, the bf16 side
really gathers bf16 (explain), and a missing Cora is skipped with the message."""
from __future__ import annotations

import json

import pytest

import gnncompile
from benchmarks import bf16

NATIVE = pytest.mark.skipif(not gnncompile.info()["native"], reason="needs the native kernels")


@NATIVE
def test_a_tiny_run_writes_consistent_results(tmp_path):
    missing = tmp_path / "no_cora"
    out = tmp_path / "out"
    rc = bf16.main(["--nodes", "3000", "--features", "8", "--repeats", "2", "--gcn-nodes", "2000",
                    "--gcn-features", "8", "--gcn-inner", "eager", "--epochs", "3", "--seeds", "2",
                    "--synthetic-nodes", "600", "--cora-raw", str(missing), "--out", str(out)])
    assert rc == 0
    p = json.loads((out / "bf16.json").read_text())
    md = (out / "bf16.md").read_text()
    assert p["command"].startswith("python -m benchmarks bf16 --nodes 3000")
    assert p["cpu"]["model_name"] and isinstance(p["cpu"]["bf16_flags"], list)
    assert p["machine"]["threads"] >= 1 and len(p["loadavg_before_after"]) == 2
    (r,) = p["ops"]
    assert (r["N"], r["E"], r["F"]) == (3000, 30000, 8)
    for k in ("fwd_fp32_s", "fwd_bf16_s", "fwd_cast_s", "fb_fp32_s", "fb_bf16_s", "fb_cast_s", "op_bf16_s",
              "cast_in_s", "cast_out_s"):
        assert r[k] > 0
    assert r["fwd_speedup"] == pytest.approx(r["fwd_fp32_s"] / r["fwd_bf16_s"])
    assert r["fb_speedup"] == pytest.approx(r["fb_fp32_s"] / r["fb_bf16_s"])
    assert r["fb_speedup_cast_after"] == pytest.approx(r["fb_fp32_s"] / r["fb_cast_s"])
    assert 0 < r["max_rel_err_vs_abs_sum"] <= bf16.BOUND  # bf16 differs, within its rounding bound
    assert f"| 3,000 | 30,000 | 8 | {r['fwd_fp32_s'] * 1e3:.1f} |" in md
    gs = p["gcn_step"]
    assert gs["gathers_bf16"] == 2 and gs["speedup"] == pytest.approx(gs["fp32_s"] / gs["bf16_s"])
    # Cora absent: skipped, said in the table; the teacher task measured for both precisions
    assert p["skipped"] and str(missing) in p["skipped"][0] and p["skipped"][0] in md
    (a,) = p["accuracy"]
    assert a["task"] == "power-law teacher" and a["nodes"] == 600 and a["gathers_bf16"] == 2
    for side in ("fp32", "bf16"):
        accs = a[side]["acc"]
        assert len(accs) == 2 and all(0 <= x <= 1 for x in accs)
        assert a[side]["mean"] == pytest.approx(sum(accs) / 2)
    f = a["forward"]
    assert not f["bitwise_equal"] and 0 < f["max_abs_diff_over_max_abs"] < 0.05
    assert "| power-law teacher | 600 |" in md


def _profile(tmp_path, settings, **extra):
    from gnncompile import profiles

    doc = profiles.make(gnncompile.hardware.detect("cpu"), {"kind": "fullgraph", "model": "sage"},
                        settings, tuned=2.0, default=1.0, unit="epochs/s", extra=extra)
    path = tmp_path / "p.json"
    path.write_text(json.dumps(doc))
    return path


def test_profile_settings_go_to_both_sides(tmp_path):
    rule = {"precision": "bf16", "opt_in": True}
    path = _profile(tmp_path, {"knobs": [2, 8, 0], "inner": "eager", "spmm_impl": "native", "precision": "bf16"},
                    precision_rule=rule)
    tuned = bf16.profile_settings(path)
    assert tuned["knobs"] == [2, 8, 0] and tuned["inner"] == "eager" and tuned["precision"] == "bf16"
    assert tuned["precision_rule"] == rule and tuned["path"] == str(path)
    for p in ("fp32", "bf16"):
        s = bf16.settings_for(p, tuned=tuned)
        assert s["knobs"] == {"cpu": [2, 8, 0]} and s["inner"] == "eager"
        assert s["choices"]["spmm_impl"] == "native" and s["choices"]["guard"] == "off"
        assert s["choices"].get("precision", "fp32") == p  # each side its own precision, not the profile's
    assert "precision" not in bf16.SETTINGS["fp32"]["choices"]  # the shared table is not modified
    # without a profile: the defaults, the inner compiler as asked
    assert bf16.settings_for("bf16", inner="eager") == {"choices": dict(bf16.SETTINGS["bf16"]["choices"]),
                                                        "inner": "eager"}
    assert "knobs" not in bf16.settings_for("fp32")
    bad = tmp_path / "bad.json"
    bad.write_text("{not json")
    with pytest.raises(SystemExit):
        bf16.main(["--profile", str(bad), "--nodes", "--gcn-nodes", "0"])


@NATIVE
def test_accuracy_runs_with_a_profile_and_sage(tmp_path):
    path = _profile(tmp_path, {"knobs": [2, 8, 0], "inner": "eager", "spmm_impl": "native", "precision": "bf16"})
    out = tmp_path / "out"
    rc = bf16.main(["--nodes", "--gcn-nodes", "0", "--epochs", "2", "--seeds", "1", "--synthetic-nodes", "400",
                    "--cora-raw", str(tmp_path / "none"), "--profile", str(path), "--model", "sage",
                    "--name", "bf16_tuned", "--out", str(out)])
    assert rc == 0
    p = json.loads((out / "bf16_tuned.json").read_text())
    md = (out / "bf16_tuned.md").read_text()
    assert p["model"] == "sage" and p["tuned"]["knobs"] == [2, 8, 0] and p["ops"] == [] and p["gcn_step"] is None
    (a,) = p["accuracy"]
    assert a["model"] == "sage" and a["gathers_bf16"] >= 2  # SAGE's mean aggregations gather bf16
    assert not a["forward"]["bitwise_equal"]
    assert "2-layer GraphSAGE" in md and str(path) in md and "knobs [2, 8, 0]" in md
