"""Smoke tests of benchmarks.cora_examples (with benchmarks/examples/{gcn,gat}_cora.py),
benchmarks.gin_batches and benchmarks.messages: their main functions on tiny settings,
results written to a temporary folder. gin_batches and messages check each variant's first-step
loss (messages: and output) against eager themselves (and report a failure as an error entry,
which fails the test here)."""
from __future__ import annotations

import json

import pytest

from benchmarks import cora_examples, gin_batches, messages

# process-level tests (subprocesses, servers, whole runs): `make test` runs them, `make test-fast`
# does not (tests/slow_list.py)
pytestmark = pytest.mark.slow

CORA_RAW = cora_examples.DEFAULT_ROOT / "Cora" / "raw"


@pytest.mark.skipif(not (CORA_RAW.is_dir() and any(CORA_RAW.iterdir())), reason=f"no Cora raw files in {CORA_RAW}")
def test_cora_examples_tiny(tmp_path):
    """GCN only, 3 epochs, one run per variant (the suite's inner compiler, see conftest)."""
    p = cora_examples.main(["--examples", "gcn", "--epochs", "3", "--repeats", "1",
                            "--results-dir", str(tmp_path), "--out", "c"])
    assert json.loads((tmp_path / "c.json").read_text())["epochs"] == 3
    assert (tmp_path / "c.png").stat().st_size > 0
    md = (tmp_path / "c.md").read_text()
    res = p["results"]["gcn"]
    assert set(res) == {"eager", "compiled", "compiled-warm"}
    for v, r in res.items():
        assert r["ok"] == r["runs"] == 1, r.get("errors")
        assert len(r["epoch_times_s"]) == 3 and all(t > 0 for t in r["epoch_times_s"])
        assert r["median_epoch_s"] > 0 and r["first_epoch_s"] > 0
        assert 0 < r["wall_s"] <= r["process_wall_s"]
        assert 0.0 <= r["final_test_acc"] <= 1.0
        assert f"| gcn | {v} |" in md
    for v in ("compiled", "compiled-warm"):
        assert res[v]["wall_ratio"] > 0 and res[v]["epoch_ratio"] > 0
    assert res["compiled"]["cache_bytes"] >= 0
    # compiled runs draw their own dropout masks (gnncompile::dropout, or inductor's), the
    # same in both processes (torch.manual_seed(0)); eager's differ, so its loss is close only
    assert res["compiled-warm"]["final_loss"] == pytest.approx(res["compiled"]["final_loss"], rel=1e-4)
    assert abs(res["compiled"]["final_loss"] - res["eager"]["final_loss"]) < 0.3


def test_cora_examples_skips_without_data(tmp_path, capsys):
    p = cora_examples.main(["--root", str(tmp_path / "nothing"), "--results-dir", str(tmp_path)])
    assert "skipped" in p and "skipped" in capsys.readouterr().out
    assert not list(tmp_path.glob("*.json"))


def test_gin_batches_tiny(tmp_path):
    """96 graphs in batches of 32, in-process (--quick), without the inductor variant."""
    variants = ("eager", "gnncompile", "gnncompile-static-first")
    p = gin_batches.main(["--quick", "--graphs", "96", "--batch-size", "32", "--variants", ",".join(variants),
                          "--results-dir", str(tmp_path), "--out", "g"])
    assert json.loads((tmp_path / "g.json").read_text())["dataset"]["graphs"] == 96
    assert (tmp_path / "g.png").stat().st_size > 0
    assert set(p["results"]) == set(variants)
    d = p["dataset"]
    assert 10 <= d["nodes_min"] <= d["nodes_max"] <= 40 and 2.5 <= d["edges_mean"] / d["nodes_mean"] <= 5.5
    for v, r in p["results"].items():
        assert "error" not in r, r
        assert r["batches_per_epoch"] == 3
        assert r["step_s"] > 0 and r["epoch_s"] > 0 and r["warmup_s"] > 0
        assert r["first_loss"] == pytest.approx(r["first_loss_eager"], rel=1e-4)
        assert r["first_loss_eager"] == p["results"]["eager"]["first_loss_eager"]  # the same initial weights
        assert r["recompiles_in_epochs"] == 0
        assert r["eager_over_this"] > 0
    assert p["results"]["gnncompile"]["graphs_compiled"] >= 1


def test_messages_tiny(tmp_path):
    """Every workload with eager and gnncompile (inductor's compiles would dominate the time; the
    benchmark's own runs cover it), in-process (--quick), 300-node graphs, 2 batches of 8
    molecules; gnncompile fuses the messages of every workload."""
    p = messages.main(["--quick", "--graphs", "300", "--molecule-batches", "2", "--batch-size", "8",
                       "--variants", "eager,gnncompile",
                       "--repeats", "1", "--warmup", "0", "--results-dir", str(tmp_path), "--out", "m"])
    saved = json.loads((tmp_path / "m.json").read_text())
    assert (tmp_path / "m.png").stat().st_size > 0
    md = (tmp_path / "m.md").read_text()
    assert [(r["workload"], r["graph"]) for r in saved["rows"]] == [
        ("GINE", "300"), ("PNA", "300"), ("EdgeCNN", "300"), ("molecules", "2x8")]
    assert saved["variants"] == ["eager", "gnncompile"] and saved["in_process"]
    for row in saved["rows"]:
        assert set(row["results"]) == {"eager", "gnncompile"}
        assert f"| {row['workload']} |" in md
        for v, r in row["results"].items():
            assert "error" not in r, (row["workload"], v, r)
            assert r["agreed"] and r["rel_err"] <= 1e-3 and r["loss"] == pytest.approx(r["loss_eager"], rel=1e-4)
            assert r["median_s"] > 0 and r["first_step_s"] > 0 and "peak_bytes" in r
        assert row["eager_over_gnncompile"] > 0
        assert row["results"]["gnncompile"]["fused_ops"] >= 2, row["workload"]
    r = p["rows"][0]["results"]["eager"]
    assert (r["N"], r["E"], r["edge_dim"]) == (300, 3000, 16)
    assert p["rows"][2]["results"]["eager"]["edge_dim"] == 0  # EdgeCNN: no edge features
    mol = p["rows"][3]["results"]
    assert mol["eager"]["batches"] == 2 and mol["eager"]["graphs_per_batch"] == 8
    assert mol["eager"]["loss_eager"] == mol["gnncompile"]["loss_eager"]  # the same initial weights
    assert mol["gnncompile"]["recompiles_in_epochs"] == 0


def test_messages_tiny_attention_workloads(tmp_path):
    """The workloads run on request (GEN, GATE, TCONV: TransformerConv with edge_dim), eager and
    gnncompile in-process on a 300-node graph: they agree with eager and gnncompile fuses their
    messages."""
    p = messages.main(["--quick", "--graphs", "300", "--models", "GEN,GATE,TCONV", "--variants", "eager,gnncompile",
                       "--repeats", "1", "--warmup", "0", "--results-dir", str(tmp_path), "--out", "a"])
    assert [r["workload"] for r in p["rows"]] == ["GEN", "GATE", "TCONV"]
    for row in p["rows"]:
        for v, r in row["results"].items():
            assert "error" not in r, (row["workload"], v, r)
            assert r["agreed"] and r["rel_err"] <= 1e-3
        assert row["results"]["gnncompile"]["fused_ops"] >= 2, row["workload"]
