"""The tuner's noise handling (tuner/noise.py and its use in tuner/study.py): the ratio of a
candidate to the defaults with a confidence interval over paired rounds, a probe that sees
other processes' CPU use, and the choice a profile makes from them: never settings that were not
shown faster than the defaults, never a thread count chosen while another process held a core."""
from __future__ import annotations

import json
import math
import subprocess
import sys
import time

import pytest

optuna = pytest.importorskip("optuna")

from gnncompile.tuner import noise, tune  # noqa: E402
from gnncompile.tuner import study as study_mod  # noqa: E402
from test_tuner import TINY, _isolated_cache, _tiny  # noqa: E402,F401


def _busy(seconds: float) -> subprocess.Popen:
    """A process that keeps one core busy for ``seconds``."""
    return subprocess.Popen([sys.executable, "-c",
                             f"import time\nend = time.time() + {seconds}\nwhile time.time() < end: pass"])


# ----------------------------------------------------------------------------- the statistics
def test_ratio_interval_of_paired_rounds():
    # ratios 1.2, 1.25, 1.15 over three rounds: geometric mean and Student's t interval of the logs
    iv = noise.ratio_interval([120.0, 125.0, 115.0], [100.0, 100.0, 100.0])
    logs = [math.log(1.2), math.log(1.25), math.log(1.15)]
    m = sum(logs) / 3
    sd = math.sqrt(sum((x - m) ** 2 for x in logs) / 2)
    half = 4.303 * sd / math.sqrt(3)
    assert iv["pairs"] == 3 and iv["ratio"] == pytest.approx(math.exp(m))
    assert iv["low"] == pytest.approx(math.exp(m - half)) and iv["high"] == pytest.approx(math.exp(m + half))
    assert noise.faster_with_confidence(iv)
    # the pairing is by round: the defaults' slow round 2 pairs with the candidate's round 2
    paired = noise.ratio_interval([110.0, 55.0, 110.0], [100.0, 50.0, 100.0])
    assert paired["ratio"] == pytest.approx(1.1) and paired["low"] == pytest.approx(1.1)


def test_ratio_interval_that_straddles_one_is_not_confident():
    iv = noise.ratio_interval([110.0, 90.0, 112.0, 91.0], [100.0] * 4)
    assert iv["low"] < 1.0 < iv["high"]
    assert not noise.faster_with_confidence(iv)
    one = noise.ratio_interval([150.0], [100.0])  # one pair: a ratio, no interval
    assert one["ratio"] == pytest.approx(1.5) and one["low"] is None
    assert not noise.faster_with_confidence(one)
    assert noise.ratio_interval([], [100.0]) is None and noise.ratio_interval([0.0], [1.0]) is None


def test_t_quantiles():
    assert noise.t975(1) == pytest.approx(12.706) and noise.t975(30) == pytest.approx(2.042)
    assert noise.t975(60) == pytest.approx(2.0, abs=0.01)  # exact: 2.000
    with pytest.raises(ValueError):
        noise.t975(0)


def test_spread_and_loaded_thresholds():
    assert noise.spread([1.0]) is None and noise.spread([1.0, 1.0]) == 0.0
    assert not noise.loaded(None) and not noise.loaded({"others_cores": None, "steal_fraction": None})
    assert noise.loaded({"others_cores": noise.LOADED_CORES + 0.01, "steal_fraction": 0.0})
    assert noise.loaded({"others_cores": 0.0, "steal_fraction": noise.LOADED_STEAL + 0.01})
    assert not noise.loaded({"others_cores": 0.1, "steal_fraction": 0.01})


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc/stat")
def test_probe_sees_a_process_busy_on_one_core():
    # the busy process must not be a descendant of this one (those count as the run's own work):
    # a shell starts it in the background and exits, so it is re-parented
    import os
    import signal

    sh = subprocess.run(["sh", "-c", f"'{sys.executable}' -c 'import time\nend = time.time() + 3\n"
                                     "while time.time() < end: pass' >/dev/null 2>&1 & echo $!"],
                        capture_output=True, text=True, check=True)
    pid = int(sh.stdout.strip())
    try:
        assert pid not in noise._descendants(os.getpid())
        time.sleep(0.2)
        with noise.LoadProbe() as probe:
            time.sleep(1.5)
    finally:
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    rep = probe.report
    # the busy process held about one core; this one slept
    assert rep["others_cores"] > 0.6, rep
    assert noise.loaded(rep)


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc")
def test_probe_counts_its_own_descendants_as_its_own_work():
    # a child of this process (as a loader worker or a compiler worker would be) is the run's own
    # CPU time, not another process's
    p = _busy(3.0)
    try:
        time.sleep(0.3)
        assert p.pid in noise._descendants(__import__("os").getpid())
        before = noise._own_cpu()
        time.sleep(1.5)
        after = noise._own_cpu()
    finally:
        p.kill()
        p.wait()
    assert after - before > 0.3  # the child ran (even on a busy machine it gets part of a core)


# ----------------------------------------------------------------------------- the choice
def _measure_by(value_of):
    """A stand-in for tuner.workloads.measure: ``value_of(settings, remeasured)`` is the
    throughput; trials report it as their one chunk (re-measurements are not reported)."""
    def fake(w, s, report=None, **kw):
        v = 100.0 if s.get("loader") == "pyg" else value_of(s, report is None)
        if report is not None:
            report(0, v)
        return v, 0
    return fake


def _fixed_trials(monkeypatch, values_by_pool, threads_by_pool=None):
    """Trials with pool sizes in a fixed order; each trial's threads from threads_by_pool."""
    pools = iter(values_by_pool)

    class Sampler(optuna.samplers.RandomSampler):
        def sample_independent(self, study, trial, name, dist):
            if name == "pool_size":
                return next(pools)
            if name == "threads" and threads_by_pool is not None:
                return threads_by_pool[trial.params.get("pool_size")]
            return super().sample_independent(study, trial, name, dist)

    monkeypatch.setattr(optuna.samplers, "TPESampler", lambda **kw: Sampler(seed=0))
    monkeypatch.setattr(optuna.pruners, "MedianPruner", lambda **kw: optuna.pruners.NopPruner())


def test_noisy_candidate_is_remeasured_and_the_defaults_kept(tmp_path, monkeypatch):
    # The trials rank pool size 2 first; re-measured, it is as fast as the defaults up to noise
    # (+-10% alternating). The profile must hold the defaults, the extra rounds must have run.
    calls = {"cand": 0}

    def value_of(s, remeasured):
        if not remeasured:
            return 150.0 if s["pool_size"] == 2 else 120.0
        calls["cand"] += 1
        return 110.0 if calls["cand"] % 2 else 90.0

    monkeypatch.setattr(study_mod, "measure", _measure_by(value_of))
    # no ablations: this stand-in measures every PyG-loader setting as the defaults, so the best
    # trial's ablation (its thread count alone) would tie them exactly and lead, with no spread
    monkeypatch.setattr(study_mod, "_ablations", lambda best, defaults, cands: [])
    _fixed_trials(monkeypatch, [2, 3])
    res = tune(_tiny(), trials=2, storage=f"sqlite:///{tmp_path / 's.db'}", out=tmp_path, plots=False,
               confirm_top=1, confirm_rounds=2)
    iv = res["ratio"]
    assert iv["low"] < 1.0 < iv["high"], iv
    assert res["noise"]["rounds"] == study_mod.MAX_CONFIRM_ROUNDS  # the interval stayed wide
    doc = json.loads(res["profile_path"].read_text())
    assert doc["study"]["chosen"].startswith("defaults (no candidate was faster than them")
    assert doc["settings"]["pool_size"] is None  # the defaults' (PyG's DataLoader: no pool)
    assert doc["study"]["ratio"]["pairs"] == study_mod.MAX_CONFIRM_ROUNDS
    assert "noise" in doc["study"] and "confirm" in doc["study"]["noise"]


def test_clear_winner_stops_remeasuring_early(tmp_path, monkeypatch):
    monkeypatch.setattr(study_mod, "measure",
                        _measure_by(lambda s, again: 200.0 if s["pool_size"] == 2 else 120.0))
    _fixed_trials(monkeypatch, [2, 3])
    res = tune(_tiny(), trials=2, storage=f"sqlite:///{tmp_path / 's.db'}", out=tmp_path, plots=False,
               confirm_top=2, confirm_rounds=2)
    assert res["noise"]["rounds"] == 2  # ratios without spread: no extra round
    assert res["best"]["pool_size"] == 2 and res["ratio"]["ratio"] == pytest.approx(2.0)
    doc = json.loads(res["profile_path"].read_text())
    assert doc["study"]["chosen"] == "best trial" and doc["settings"]["pool_size"] == 2


def test_under_load_a_fewer_threads_candidate_cannot_win(tmp_path, monkeypatch, request):
    # Under load, the 1-thread candidate measures fastest (as a busy core makes it); the profile
    # must not take it: the candidate with the defaults' thread count leads.
    import os

    import torch

    if (os.cpu_count() or 1) < 2:
        pytest.skip("the trials' thread counts go up to the CPUs: needs 2")
    old_threads = torch.get_num_threads()
    torch.set_num_threads(2)  # the defaults' thread count (a test worker may run with 1)
    request.addfinalizer(lambda: torch.set_num_threads(old_threads))
    default_threads = 2

    monkeypatch.setattr(study_mod, "measure",
                        _measure_by(lambda s, again: 180.0 if s.get("threads") == 1 else 130.0))
    monkeypatch.setattr(study_mod, "_machine_loaded", lambda rep: True)
    _fixed_trials(monkeypatch, [2, 3], threads_by_pool={2: 1, 3: default_threads})
    # confirm_top=1: the best trial (1 thread) is passed over for the best one that keeps the
    # defaults' thread count, which is re-measured and can still win on its other settings
    res = tune(_tiny(), trials=2, storage=f"sqlite:///{tmp_path / 's.db'}", out=tmp_path, plots=False,
               confirm_top=1, confirm_rounds=2)
    assert res["noise"]["loaded"]
    assert res["best"]["threads"] == default_threads and res["best"]["pool_size"] == 3
    assert [c["trial"] for c in res["confirm"]["candidates"]] == [1]  # trial 1: pool 3, 2 threads
    assert res["noise"]["skipped_trials"] == [0]  # trial 0: pool 2, 1 thread, measured fastest
    doc = json.loads(res["profile_path"].read_text())
    assert doc["settings"]["threads"] == default_threads


def test_load_in_the_remeasurement_only_excludes_a_fewer_threads_candidate(tmp_path, monkeypatch, request):
    # Trials on a quiet machine, the re-measurement under load: the 1-thread candidate is
    # re-measured but cannot lead, and when it is the only candidate the profile keeps the
    # defaults and says why.
    import os

    import torch

    if (os.cpu_count() or 1) < 2:
        pytest.skip("the trials' thread counts go up to the CPUs: needs 2")
    old_threads = torch.get_num_threads()
    torch.set_num_threads(2)
    request.addfinalizer(lambda: torch.set_num_threads(old_threads))
    probes = {"n": 0}

    def loaded(rep):  # the trials' probe is read first, then the re-measurement's
        probes["n"] += 1
        return probes["n"] > 1

    monkeypatch.setattr(study_mod, "measure",
                        _measure_by(lambda s, again: 180.0 if s.get("threads") == 1 else 130.0))
    monkeypatch.setattr(study_mod, "_machine_loaded", loaded)
    _fixed_trials(monkeypatch, [2, 3], threads_by_pool={2: 1, 3: 2})
    res = tune(_tiny(), trials=2, storage=f"sqlite:///{tmp_path / 's.db'}", out=tmp_path, plots=False,
               confirm_top=1, confirm_rounds=2)
    # trial 0 (1 thread) and its ablation that changes only the thread count
    assert res["noise"]["loaded"] and res["noise"]["excluded"] == [0, "ablation 'threads' of trial 0"]
    doc = json.loads(res["profile_path"].read_text())
    assert doc["study"]["chosen"].startswith("defaults (the machine was loaded and every candidate")
    assert doc["settings"]["threads"] == 2


@pytest.mark.slow
def test_cli_tune_under_synthetic_load_reports_it(tmp_path):
    # A real (tiny) run while another process keeps one core busy: the summary reports the load,
    # stderr says so, and the profile's thread count is the defaults'.
    import os

    busy = _busy(240.0)
    try:
        args = [*TINY, "--trials", "2", "--confirm-rounds", "2", "--out", str(tmp_path / "out"),
                "--storage", f"sqlite:///{tmp_path / 's.db'}"]
        p = subprocess.run([sys.executable, "-m", "gnncompile.cli", "tune", *args], capture_output=True,
                           text=True, timeout=240, env=os.environ.copy(), cwd=str(tmp_path))
    finally:
        busy.kill()
        busy.wait()
    assert p.returncode == 0, p.stderr
    summary = json.loads(p.stdout[p.stdout.index("{"):])
    assert summary["noise"]["loaded"], summary["noise"]
    assert summary["noise"]["confirm"]["others_cores"] > noise.LOADED_CORES
    assert "other processes kept the machine busy" in p.stderr
    doc = json.loads(open(summary["profile"]).read())
    # the defaults' thread count is torch's in a fresh process with this environment (a test
    # worker's own may differ)
    fresh = subprocess.run([sys.executable, "-c", "import torch; print(torch.get_num_threads())"],
                           capture_output=True, text=True, check=True, env=os.environ.copy())
    assert doc["settings"]["threads"] in (None, int(fresh.stdout))
