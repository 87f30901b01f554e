"""benchmarks.ddp --quick end to end: two gloo ranks per variant (eager DDP, DDP(compile(model)),
compile(DDP(model)); the full run adds compile(DDP(model)) with the speed guard off) train GraphSAGE on sampled batches;
results written to a temporary folder. Asserted: every run completes, the DDP optimizer split
the compiled graph, nothing recompiles after warm-up, the first losses agree with eager DDP's,
and the two ranks end with the same parameters. Speed is not asserted."""
from __future__ import annotations

import json

import pytest

from benchmarks import ddp

# process-level (pairs of rank processes): `make test` runs it, `make test-fast` does not
pytestmark = pytest.mark.slow


def test_ddp_quick(tmp_path, monkeypatch):
    # the rank processes inherit this environment: gnncompile's defaults there (guard on, inner
    # 'auto', programs 'auto'), not the suite's (tests/conftest.py)
    for name in ("GNNCOMPILE_INNER", "GNNCOMPILE_PROGRAMS", "GNNCOMPILE_GUARD"):
        monkeypatch.delenv(name, raising=False)
    variants = ("eager", "ddp-compile", "compile-ddp")  # (the guard-off variant: the full run's)
    p = ddp.main(["--quick", "--timeout", "300", "--results-dir", str(tmp_path), "--out", "d",
                  "--variants", ",".join(variants)])
    assert p["problems"] == [], p["problems"]
    assert set(p["results"]) == set(variants)
    for v, r in p["results"].items():
        assert "error" not in r, (v, r)
        assert r["rounds_ok"] == 1 and r["steps_timed_per_rank"] == r["batches_per_epoch"] == 3
        assert r["backend_calls_after_warmup"] == 0, (v, r["recompile_reasons"])
        assert r["unique_graphs_after_warmup"] == 0 and r["recompiles_after_warmup"] == 0, (v, r["recompile_reasons"])
        assert r["rank_param_max_diff"] == 0.0  # DDP keeps the ranks' parameters equal
        assert r["compile_failed"] is None
        if v == "eager":
            assert r["pieces_compiled"] == 0
            continue
        assert r["pieces_compiled"] >= 2 and r["fused_chains"] > 0  # split at the 1 MiB bucket, then rewritten
        assert r["loss_max_rel_diff"] is not None and r["loss_max_rel_diff"] <= ddp.LOSS_RTOL
        assert r["first_losses_rank0"] == pytest.approx(p["results"]["eager"]["first_losses_rank0"], rel=1e-4)
    assert r["param_bytes"] > 2**20
    saved = json.loads((tmp_path / "d.json").read_text())
    assert saved["world_size"] == 2 and set(saved["results"]) == set(variants)
    md = (tmp_path / "d.md").read_text()
    assert all(f"| {v} |" in md for v in variants) and "shared 2-core VM" in md
