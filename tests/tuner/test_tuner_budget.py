"""How a tuning run with a timeout spends its time (``gnncompile tune --timeout S``), on a fake
clock: every clock the run reads (the guard's deadline, the tuner's estimates, the trial
durations Optuna records) follows a counter that only the stand-in measurement advances, so a
trial "takes" 7 s of a 20 s budget in milliseconds, the same way on a quiet or a loaded machine.

A run under load once stopped at 10.8 s of 20 with one trial and no measurement of the defaults:
the trials' phase kept 4 measurements x the first trial's duration for the re-measurements, and
the re-measurement round, needing 2 x that duration, did not fit and was skipped whole. The
defaults are the reference of every profile: they are measured whenever a trial completed, and
the run goes on while a trial or a re-measurement fits; without them no profile is written."""
from __future__ import annotations

import datetime
import json
import types

import pytest

optuna = pytest.importorskip("optuna")

from test_tuner import TINY, _tiny, _isolated_cache  # noqa: E402,F401

from gnncompile.cli import main  # noqa: E402
from gnncompile.tuner import guard as guard_mod  # noqa: E402
from gnncompile.tuner import study as study_mod  # noqa: E402
from gnncompile.tuner import tune  # noqa: E402

# process-level tests (subprocesses, servers, whole runs): `make test` runs them, `make test-fast`
# does not (tests/slow_list.py)
pytestmark = pytest.mark.slow

TIMEOUT = 20.0
SLICES = 10  # checkpoints per stand-in measurement (the real one checks before every step)


class _Clock:
    def __init__(self) -> None:
        self.t = 1000.0

    def monotonic(self) -> float:
        return self.t

    def sleep(self, s: float) -> None:
        self.t += s


@pytest.fixture
def clock(monkeypatch):
    c = _Clock()
    fake_time = types.SimpleNamespace(monotonic=c.monotonic, sleep=c.sleep, perf_counter=c.monotonic)
    monkeypatch.setattr(guard_mod, "time", fake_time)
    monkeypatch.setattr(study_mod, "time", fake_time)

    class FakeDatetime(datetime.datetime):  # the trials' start and end, as Optuna records them
        @classmethod
        def now(cls, tz=None):
            return datetime.datetime(2024, 1, 1) + datetime.timedelta(seconds=c.t)

    monkeypatch.setattr(optuna.storages._in_memory, "datetime", FakeDatetime)
    return c


def _slow_measure(clock, seconds, calls):
    """A stand-in for tuner.workloads.measure taking ``seconds[kind]`` on the fake clock (kind:
    'trial', 'confirm' for a re-measured trial, 'default'), checkpointed as the real one is;
    appends (kind, start) to ``calls`` for each measurement that finished, and counts the started
    ones in ``fake.started``."""
    def fake(w, s, report=None, **kw):
        kind = "default" if s.get("loader") == "pyg" else ("trial" if report is not None else "confirm")
        t0 = clock.t
        fake.started += 1
        for _ in range(SLICES):
            guard_mod.checkpoint()
            clock.t += seconds[kind] / SLICES
        if report is not None:
            report(0, 100.0)
        calls.append((kind, t0))
        return (50.0 if kind == "default" else 100.0), 0
    fake.started = 0
    return fake


def _run(tmp_path, monkeypatch, clock, seconds, **kw):
    calls: list = []
    fake = _slow_measure(clock, seconds, calls)
    monkeypatch.setattr(study_mod, "measure", fake)
    res = tune(_tiny(), trials=1000, timeout=TIMEOUT, storage=optuna.storages.InMemoryStorage(),
               out=tmp_path / "out", plots=False, seed=0, **kw)
    return res, calls, fake.started


def test_a_loaded_run_measures_the_defaults(tmp_path, monkeypatch, clock):
    # under load every measurement takes 7 s of the 20: a trial, then the defaults; nothing
    # else fits (before: the round of best trial + defaults, 14 s, did not fit in the 13 s left
    # and was skipped, and the run ended at 7 s with a profile without defaults)
    res, calls, _ = _run(tmp_path, monkeypatch, clock, {"trial": 7.0, "confirm": 7.0, "default": 7.0})
    kinds = [k for k, _ in calls]
    assert "default" in kinds, kinds
    assert res["default"] == 50.0 and res["tuned"] == 100.0
    doc = json.loads(res["profile_path"].read_text())
    assert doc["throughput"]["default"] == 50.0
    # the budget is used: it ends less than one measurement before the timeout, not after it
    assert TIMEOUT - 7.0 <= res["elapsed_s"] <= TIMEOUT + 7.0 / SLICES, (res["elapsed_s"], calls)


def test_a_run_goes_on_while_work_fits(tmp_path, monkeypatch, clock):
    # 3 s per measurement: trials while a trial and two rounds of re-measurements after it fit
    # (the fewest that give the ratio an interval), then rounds (defaults first) while a
    # measurement fits; before, the run ended at 15 s with the 5 s left unused (a round of 3
    # measurements did not fit, a part of one was not tried)
    res, calls, started = _run(tmp_path, monkeypatch, clock, {"trial": 3.0, "confirm": 3.0, "default": 3.0})
    kinds = [k for k, _ in calls]
    assert kinds.count("trial") >= 1 and kinds.count("default") >= 2 and kinds.count("confirm") >= 2, kinds
    assert res["default"] == 50.0
    assert TIMEOUT - 3.0 <= res["elapsed_s"] <= TIMEOUT + 3.0 / SLICES, (res["elapsed_s"], calls)
    # every measurement that was started finished (none was cut by the deadline: no time wasted)
    assert started == len(calls), (started, calls)
    assert [t.state for t in res["study"].get_trials()].count(optuna.trial.TrialState.FAIL) == 0


def test_a_late_first_trial_stays_and_the_defaults_are_tried(tmp_path, monkeypatch, clock):
    # a first trial that takes 15 s of 20 completes (it stays in the study, for a longer run to
    # resume); the defaults are tried after it, cut by the deadline, and no profile is written
    # (before: the round was skipped and a profile without defaults was written at 15 s)
    res, calls, started = _run(tmp_path, monkeypatch, clock, {"trial": 15.0, "confirm": 15.0, "default": 15.0})
    assert [k for k, _ in calls] == ["trial"] and started == 2
    assert res["profile_path"] is None and res["default"] is None
    assert "defaults" in res["no_profile"] and not list((tmp_path / "out").glob("*.json"))
    assert TIMEOUT <= res["elapsed_s"] <= TIMEOUT + 15.0 / SLICES


def test_no_profile_without_the_defaults(tmp_path, monkeypatch, clock, capsys):
    # the defaults take 15 s and only 11 are left after the first trial: they are tried (the
    # reference of every profile) and cut by the deadline; no profile is written without them,
    # the command line says so and exits with status 3
    calls: list = []
    monkeypatch.setattr(study_mod, "measure",
                        _slow_measure(clock, {"trial": 9.0, "confirm": 9.0, "default": 15.0}, calls))
    monkeypatch.setattr(study_mod, "default_storage", lambda: optuna.storages.InMemoryStorage())
    out = tmp_path / "out"
    rc = main(["tune", *TINY, "--trials", "1000", "--timeout", str(TIMEOUT), "--out", str(out)])
    captured = capsys.readouterr()
    assert rc == 3, captured.err
    assert "defaults" in captured.err and "no profile written" in captured.err
    summary = json.loads(captured.out)
    assert summary["profile"] is None and summary["default"] is None and summary["trials"]["complete"] == 1
    assert summary["elapsed_s"] <= TIMEOUT + 15.0 / SLICES
    assert not out.exists() or not list(out.glob("*.json"))
