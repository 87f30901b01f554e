"""Smoke tests of benchmarks.sampler and benchmarks.neighbor_epoch: their main functions
on tiny inputs, results written to a temporary folder (the benchmarks' own agreement checks
run inside and raise on a disagreement)."""
from __future__ import annotations

import json
from pathlib import Path

import pytest

from benchmarks import neighbor_epoch, sampler

# process-level tests (subprocesses, servers, whole runs): `make test` runs them, `make test-fast`
# does not (tests/slow_list.py)
pytestmark = pytest.mark.slow


def _check_sampler(p: dict, out: Path, name: str) -> None:
    assert json.loads((out / f"{name}.json").read_text())["fanout"] == [15, 10]
    assert (out / f"{name}.md").read_text().count("| native |") == len(p["timings"])
    for t in p["timings"].values():
        assert set(t) == set(sampler.IMPLS) and all(r["median_s"] > 0 for r in t.values())
    assert p["checks"]["full_fanout_batches"] == 5 and p["mean_sampled_edges"] > 0


def test_sampler_tiny(tmp_path):
    p = sampler.main(["--quick", "--batches", "2", "--warmup", "1", "--batch-size", "256",
                      "--threads", "1", "--results-dir", str(tmp_path), "--out", "s"])
    _check_sampler(p, tmp_path, "s")


def _check_epoch(p: dict, out: Path, name: str, seeds: int, settings=("default",)) -> None:
    assert json.loads((out / f"{name}.json").read_text())["train_seeds"] == seeds
    assert set(p["results"]) == {f"{m}/{s}" for m in ("eager", "gnncompile") for s in settings}
    for r in p["results"].values():
        assert r["batches"] >= 1 and r["epoch_s"] > 0 and r["structure_s_per_batch"] > 0
        assert abs(r["first_loss"] - r["first_loss_eager"]) < 1e-4
        assert r["recompiles_in_epoch"] == 0
    e, c = p["results"]["eager/default"], p["results"]["gnncompile/default"]
    assert e["first_loss"] == pytest.approx(c["first_loss"], rel=1e-4)  # same batches, same weights
    assert "gnncompile/default" in (out / f"{name}.md").read_text()


def test_neighbor_epoch_tiny(tmp_path):
    """Default loader settings and a profile's (batch size 50, one thread)."""
    from gnncompile import profiles
    from gnncompile.hardware import device

    doc = profiles.make(device.detect(), {"kind": "neighbor", "model": "graphsage"},
                        {"batch_size": 50, "num_workers": 0, "threads": 1, "knobs": []})
    prof = tmp_path / "prof.json"
    prof.write_text(json.dumps(doc))
    p = neighbor_epoch.main(["--quick", "--nodes", "2000", "--train-fraction", "0.1", "--batch-size", "64",
                             "--warmup", "2", "--structure-batches", "2", "--results-dir", str(tmp_path),
                             "--out", "e", "--profile", str(prof)])
    _check_epoch(p, tmp_path, "e", 200, ("default", "profile"))
    r = p["results"]["gnncompile/profile"]
    assert r["loader_settings"]["batch_size"] == 50 and r["threads"] == 1 and r["batches"] == 4
    assert p["results"]["eager/default"]["batches"] == 4  # 200 seeds in batches of 64


@pytest.mark.slow
def test_quick_modes(tmp_path):
    _check_sampler(sampler.main(["--quick", "--results-dir", str(tmp_path)]), tmp_path, "sampler_quick")
    p = neighbor_epoch.main(["--quick", "--results-dir", str(tmp_path)])
    _check_epoch(p, tmp_path, "neighbor_epoch_quick", 1000)
