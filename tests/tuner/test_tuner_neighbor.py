"""The tuner's ``neighbor`` workload: node classification on one generated graph, trained on
gnncompile.data.NeighborLoader mini-batches. Tiny graphs (a few thousand nodes), few trials,
few steps; the eager model except where compilation is what is checked."""
from __future__ import annotations

import json
import os

import pytest
import torch

optuna = pytest.importorskip("optuna")

import gnncompile  # noqa: E402
from gnncompile.data import NeighborLoader  # noqa: E402
from gnncompile import profiles  # noqa: E402
from gnncompile.tuner import Workload, measure, tune  # noqa: E402
from gnncompile.tuner import study as study_mod  # noqa: E402
from gnncompile.tuner import workloads as wl_mod  # noqa: E402
from gnncompile.tuner.workloads import NEIGHBOR_BATCH_RANGE, neighbor_data  # noqa: E402

# process-level tests (subprocesses, servers, whole runs): `make test` runs them, `make test-fast`
# does not (tests/slow_list.py)
pytestmark = pytest.mark.slow

RANGE = (32, 256)


def _tiny(**kw):
    args = dict(kind="neighbor", model="sage", num_nodes=2000, num_edges=16000, fanout=[4, 3],
                train_fraction=0.5, hidden=8, layers=2, num_features=4, warmup=2, steps=4, chunks=2,
                compiled=False)
    args.update(kw)
    return Workload(**args)


@pytest.fixture(autouse=True)
def _isolated_cache(tmp_path, monkeypatch):
    monkeypatch.setenv("GNNCOMPILE_CACHE_DIR", str(tmp_path / "cache"))
    yield


def _tune(tmp_path, w, **kw):
    args = dict(trials=3, storage=f"sqlite:///{tmp_path / 's.db'}", out=tmp_path / "out", seed=0,
                batch_range=RANGE, max_workers=1, plots=False, confirm_rounds=1, confirm_top=2)
    args.update(kw)
    return tune(w, **args)


def _in_search_space(s, max_workers=1):
    cpus = profiles.machine_cpus(gnncompile.hardware.detect("cpu"))
    assert RANGE[0] <= s["batch_size"] <= RANGE[1]
    assert 0 <= s["num_workers"] <= max_workers and 1 <= s["threads"] <= cpus
    if s["num_workers"] == 0:
        assert s["pool_size"] is None and s["persistent_workers"] is False
    else:
        assert 1 <= s["pool_size"] <= 6
    assert s["pin_memory"] is False


def test_workload_fields_and_bad_input():
    w = _tiny()
    assert w.unit == "seeds/s" and Workload(kind="neighbor").fanout == [15, 10]
    sig = w.signature_dict()
    assert sig["kind"] == "neighbor" and sig["fanout"] == [4, 3] and sig["train_fraction"] == 0.5
    assert sig["num_nodes"] == 2000 and sig["num_edges"] == 16000
    assert _tiny(fanout=[4, 2]).signature_dict() != sig  # the fanout is part of the workload
    for bad in ([], [0], [2, -2], "15", [1.5], [True]):
        with pytest.raises(ValueError, match="fanout"):
            _tiny(fanout=bad)
    for bad in (0, 1.5, -0.1):
        with pytest.raises(ValueError, match="train_fraction"):
            _tiny(train_fraction=bad)
    with pytest.raises(ValueError, match="training node"):
        _tiny(num_nodes=3, train_fraction=0.1)
    data, train = neighbor_data(w)
    assert data.num_nodes == 2000 and train.numel() == 1000 and train.unique().numel() == 1000
    assert torch.equal(neighbor_data(_tiny())[1], train)  # deterministic


def test_measure_counts_seed_nodes():
    seen, threads = [], torch.get_num_threads()
    rate, peak = measure(_tiny(), {"batch_size": 64, "threads": 1}, report=lambda c, v: seen.append((c, v)))
    assert rate > 0 and peak >= 0 and [c for c, _ in seen] == [0, 1] and seen[-1][1] == rate
    assert torch.get_num_threads() == threads  # restored


def test_compiled_measure_does_not_recompile_per_batch():
    # 1000 training nodes in batches of 96: every epoch ends with a batch of 40 seeds, and every
    # batch's subgraph has its own number of nodes and edges. Torch's automatic dynamic shapes
    # compile twice (the first batch's sizes, then symbolic sizes), both in the warm-up; the
    # 12 timed steps (over an epoch boundary) compile nothing more.
    from torch._dynamo.utils import counters

    counters.clear()
    graphs = []
    w = _tiny(compiled=True, steps=12, chunks=3)
    rate, _ = measure(w, {"batch_size": 96, "threads": 1, "inner": "aot_eager", "knobs": [2]},
                      report=lambda c, v: graphs.append(counters["stats"]["unique_graphs"]))
    assert rate > 0 and len(graphs) == 3
    assert graphs[0] >= 1 and graphs == [graphs[0]] * 3, graphs


def test_suggest_neighbor_search_space():
    props = gnncompile.hardware.detect("cpu")
    w = _tiny()
    s = study_mod.suggest(optuna.trial.FixedTrial({"batch_size": 1000, "num_workers": 0, "threads": 1}),
                          w, props, 128, RANGE, 2)
    assert s["batch_size"] == 1000 and s["pool_size"] is None and s["persistent_workers"] is False
    s = study_mod.suggest(optuna.trial.FixedTrial({"batch_size": 100, "num_workers": 2, "pool_size": 5,
                                                   "persistent_workers": True, "threads": 2}),
                          w, props, 128, RANGE, 2)
    assert (s["batch_size"], s["num_workers"], s["pool_size"], s["persistent_workers"]) == (100, 2, 5, True)
    # the batch size is searched only when asked, on a log scale, over the given range or the
    # default one; otherwise it stays at the batch size given
    study = optuna.create_study(sampler=optuna.samplers.RandomSampler(seed=0))
    for ask, rng, want in ((True, None, NEIGHBOR_BATCH_RANGE), (None, RANGE, RANGE)):
        t = study.ask()
        study_mod.suggest(t, w, props, 128, study_mod.batch_search(w, ask, rng), 2)
        d = t.distributions["batch_size"]
        assert (d.low, d.high, d.log) == (*want, True)
    t = study.ask()
    assert study_mod.batch_search(w, None, None) is None
    assert study_mod.suggest(t, w, props, 1000, None, 2)["batch_size"] == 1000
    assert "batch_size" not in t.distributions
    wd = study_mod.workload_dict(w, 1000, None)
    assert wd["batch_size"] == 1000 and "batch_range" not in wd
    wd = study_mod.workload_dict(w, 128, NEIGHBOR_BATCH_RANGE)
    assert wd["batch_range"] == list(NEIGHBOR_BATCH_RANGE) and wd["default_batch_size"] == 128


def test_tune_writes_a_profile_that_the_loader_applies(tmp_path):
    res = _tune(tmp_path, _tiny())
    finished = [t for t in res["study"].get_trials()
                if t.state in (optuna.trial.TrialState.COMPLETE, optuna.trial.TrialState.PRUNED)]
    assert len(finished) == 3
    for t in res["study"].get_trials():
        if t.state == optuna.trial.TrialState.COMPLETE:
            _in_search_space(t.user_attrs["settings"])
            assert t.value > 0
    path = res["profile_path"]
    doc = json.loads(path.read_text())
    profiles.validate(doc)
    assert doc["workload"]["kind"] == "neighbor" and doc["workload"]["fanout"] == [4, 3]
    assert doc["workload"]["batch_range"] == list(RANGE)
    rule = doc["batch_size_rule"]
    assert rule["tuned"] and rule["range"] == list(RANGE) and rule["lr_scaling"] == "sqrt"
    assert rule["batch_size"] == doc["settings"]["batch_size"]
    assert doc["throughput"]["unit"] == "seeds/s" and doc["throughput"]["tuned"] > 0
    assert doc["throughput"]["default"] > 0
    s = doc["settings"]
    if doc["study"]["chosen"] == "best trial":
        _in_search_space(s)
    else:  # the defaults measured faster: NeighborLoader's own defaults at the default batch size
        assert (s["batch_size"], s["num_workers"]) == (128, 0)
    data, train = neighbor_data(_tiny())
    loader = NeighborLoader(data, [4, 3], input_nodes=train, shuffle=True, profile=str(path))
    assert loader.batch_size == s["batch_size"] and loader.num_workers == s["num_workers"]
    assert loader.settings["persistent_workers"] == s["persistent_workers"]
    b = next(iter(loader))
    assert b.batch_size == min(s["batch_size"], train.numel())
    assert torch.equal(b.n_id[:b.batch_size].sort().values, b.n_id[:b.batch_size].unique())


def test_loader_and_compile_take_every_tuned_setting(tmp_path, monkeypatch):
    # a stand-in measurement that prefers workers, deep prefetch and large batches, so that the
    # profile holds settings other than the loader's defaults; the real study runs above
    def fake(w, s, report=None, **kw):
        v = (1.0 + s["num_workers"]) * (s.get("pool_size") or 1) * s["batch_size"]
        if report is not None:
            report(0, v)
        return v, 0

    monkeypatch.setattr(study_mod, "measure", fake)
    res = _tune(tmp_path, _tiny(compiled=True), trials=6, max_workers=2)
    s = json.loads(res["profile_path"].read_text())["settings"]
    assert s["num_workers"] >= 1 and s["knobs"] and s["inner"] in gnncompile.compiler.INNERS
    data, train = neighbor_data(_tiny())
    loader = NeighborLoader(data, [4, 3], input_nodes=train, profile=res["profile_path"])
    assert loader.batch_size == s["batch_size"] and loader.num_workers == s["num_workers"]
    assert loader.persistent_workers == s["persistent_workers"]
    assert loader.prefetch_factor == -(-s["pool_size"] // s["num_workers"])
    # explicit arguments win over the profile
    assert NeighborLoader(data, [4, 3], batch_size=7, num_workers=0, profile=res["profile_path"]).batch_size == 7
    model = gnncompile.compile(wl_mod.build_model(_tiny()), profile=str(res["profile_path"]))
    assert model.gnncompile_settings.knobs_for(torch.device("cpu")) == s["knobs"]
    assert model.gnncompile_profile.inner == s["inner"]
    assert model.gnncompile_settings.threads == s["threads"]


def test_memory_budget_fails_trials_and_the_study_goes_on(tmp_path, monkeypatch):
    # the process's resident set "grows" 64 MiB per look: every trial passes a 1 MiB budget
    grow = {"n": 0}

    def rss():
        grow["n"] += 1
        return grow["n"] << 26

    monkeypatch.setattr(wl_mod, "_rss_bytes", rss)
    with pytest.warns(UserWarning, match="no trial completed"):
        res = _tune(tmp_path, _tiny(), trials=2, memory_budget=1 << 20)
    trials = res["study"].get_trials()
    assert res["profile_path"] is None and len(trials) == 2
    for t in trials:
        assert t.state == optuna.trial.TrialState.FAIL
        assert t.user_attrs["memory_excess"] == 1.0 and "budget" in t.user_attrs["error"]
        assert t.constraints == {"peak_memory_over_budget": 1.0}  # infeasible for the sampler too
    # the same study, without the budget: the failed trials stay, new ones complete, a profile
    monkeypatch.undo()
    monkeypatch.setenv("GNNCOMPILE_CACHE_DIR", str(tmp_path / "cache"))
    res = _tune(tmp_path, _tiny(), trials=2)
    states = [t.state for t in res["study"].get_trials()]
    assert states[:2] == [optuna.trial.TrialState.FAIL] * 2 and len(states) >= 4
    assert res["profile_path"] is not None and res["tuned"] > 0
    assert all(t.constraints == {"peak_memory_over_budget": 0.0} for t in res["study"].get_trials()[2:]
               if t.state == optuna.trial.TrialState.COMPLETE)


def test_cli_neighbor_options(tmp_path, capsys, monkeypatch):
    from gnncompile.cli import main

    base = ["tune", "--workload", "neighbor", "--no-progress", "--out", str(tmp_path)]
    for bad in (["--fanout", "0"], ["--fanout", "x"], ["--train-fraction", "0"], ["--num-nodes", "0"]):
        with pytest.raises(SystemExit) as e:
            main([*base, *bad])
        assert e.value.code == 2
    # a graph with no training node: one line, status 2, before anything runs (the entry point
    # in this process, run from tmp_path: an exception escaping it fails the test)
    monkeypatch.chdir(tmp_path)
    capsys.readouterr()
    assert main([*base, "--num-nodes", "5", "--train-fraction", "0.01"]) == 2
    err = capsys.readouterr().err
    assert "training node" in err and "Traceback" not in err and len(err.strip().splitlines()) == 1, err


def test_cli_tune_neighbor_writes_profile(tmp_path, capsys):
    from gnncompile.cli import main

    out = tmp_path / "out"
    args = ["tune", "--workload", "neighbor", "--num-nodes", "2000", "--num-edges", "16000", "--fanout",
            "4", "3", "--train-fraction", "0.5", "--hidden", "8", "--num-features", "4", "--batch-range",
            "32", "256", "--warmup", "2", "--steps", "4", "--trials", "2", "--max-workers", "1",
            "--no-compile", "--seed", "0", "--no-progress", "--confirm-rounds", "1", "--confirm-top", "1",
            "--storage", f"sqlite:///{tmp_path / 's.db'}", "--out", str(out)]
    assert main(args) == 0
    summary = json.loads(capsys.readouterr().out)
    assert summary["unit"] == "seeds/s" and summary["tuned"] > 0 and summary["default"] > 0
    doc = json.loads((out / os.path.basename(summary["profile"])).read_text())
    wl = doc["workload"]
    assert (wl["kind"], wl["model"], wl["layers"], wl["fanout"]) == ("neighbor", "sage", 2, [4, 3])
