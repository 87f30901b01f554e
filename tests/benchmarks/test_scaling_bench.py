"""benchmarks.scaling: the ring all-reduce model and the fit (in this process), and ``--quick`` end
to end (torchrun jobs of 1 and 2 ranks, eager and compiled; results in a temporary folder).
Asserted: every job completes and learns, the model's table is consistent with its inputs.
Speed is not asserted."""
from __future__ import annotations

import pytest

from benchmarks import scaling


def test_fit_recovers_latency_and_bandwidth():
    a, b = 50e-6, 2e9
    pts = {n: a + n / b for n in (4096, 65536, 1 << 20, 8 << 20)}
    fa, fb = scaling._fit(pts)
    assert fa == pytest.approx(a, rel=1e-6) and fb == pytest.approx(b, rel=1e-6)


def test_model_rows():
    rows = scaling.scaling_model(compute_s=0.05, wait_s=0.01, batch=1000, nbytes=8 << 20,
                                 host_ab=(20e-6, 4e9), net_ab=(30e-6, 25e9 / 8), ranks_per_host=8)
    assert [r["ranks"] for r in rows] == list(scaling.MODEL_RANKS)
    one = rows[0]
    assert one["allreduce_ms"] == 0 and one["seeds_per_s_no_overlap"] == pytest.approx(1000 / 0.06)
    for r in rows[1:]:
        n = r["ranks"]
        a, b = (20e-6, 4e9) if n <= 8 else (30e-6, 25e9 / 8)  # beyond a host: the slower link's
        ar = 2 * (n - 1) * a + 2 * (n - 1) / n * (8 << 20) / b
        assert r["allreduce_ms"] == pytest.approx(1e3 * ar)
        assert r["step_ms_no_overlap"] == pytest.approx(1e3 * (0.06 + ar))
        assert r["step_ms_overlap"] == pytest.approx(1e3 * (0.01 + max(0.05, ar)))
        assert r["seeds_per_s_overlap"] >= r["seeds_per_s_no_overlap"]
        assert 0 < r["efficiency_no_overlap"] < 1
        assert r["hosts"] == -(-n // 8)


@pytest.mark.slow
def test_scaling_quick(tmp_path, monkeypatch):
    for name in ("GNNCOMPILE_INNER", "GNNCOMPILE_PROGRAMS", "GNNCOMPILE_GUARD"):
        monkeypatch.delenv(name, raising=False)  # the jobs run with gnncompile's defaults
    p = scaling.main(["--quick", "--timeout", "300", "--results-dir", str(tmp_path), "--out", "s"])
    for key, s in p["summary"].items():
        assert "error" not in s, (key, s)
        assert s["seeds_per_s"] > 0 and s["steps_per_epoch"] > 0
    # the 2-rank job runs half the steps per rank of the 1-rank job (each rank half the seeds)
    one, two = p["summary"]["compiled_1"], p["summary"]["compiled_2"]
    assert two["steps_per_epoch"] == -(-one["steps_per_epoch"] // 2)
    assert p["allreduce_s"] and p["fit"]["bytes_per_s"] > 0
    assert [r["ranks"] for r in p["model"]] == list(scaling.MODEL_RANKS)
    assert (tmp_path / "s.md").read_text().count("| compiled |") == 2
