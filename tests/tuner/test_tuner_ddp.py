"""A trial that is itself a data-parallel job (``Workload(kind="neighbor", ranks=2)``, ``gnncompile
tune --ranks 2``: each trial runs as 2 gloo rank processes), and several tuner processes sharing
one study while doing so: a journal file (one host) and PostgreSQL (what several hosts share; the
``postgres`` fixture of tests/tuner/conftest.py). A rank that fails or hangs fails the trial with
its error, and leaves no process behind.

Tiny graphs (2000 nodes), eager models except where compiling is what is checked, 1-2 trials per
process, ``--max-workers 0`` (no loader workers: 2 tuners x 2 ranks already share the 2 cores
of CI). Every wait has a hard timeout, so a hang fails the test instead of stalling the suite.
"""
from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import tempfile
import time

import pytest
import torch

optuna = pytest.importorskip("optuna")

from gnncompile.tuner import Workload, measure  # noqa: E402
from gnncompile.tuner import workloads as wl_mod  # noqa: E402
from gnncompile.tuner.workloads import RankFailed  # noqa: E402

# process-level tests (subprocesses, servers, whole runs): `make test` runs them, `make test-fast`
# does not (tests/slow_list.py)
pytestmark = pytest.mark.slow

TINY_DDP = ["--workload", "neighbor", "--model", "sage", "--num-nodes", "2000", "--num-edges", "16000",
            "--fanout", "4", "3", "--train-fraction", "0.5", "--hidden", "8", "--layers", "2",
            "--num-features", "4", "--warmup", "2", "--steps", "4", "--batch-range", "32", "128",
            "--max-workers", "0", "--no-compile", "--no-defaults", "--no-progress", "--ranks", "2"]
RUN_TIMEOUT = 150  # seconds a tuner process may take (its own timeout is shorter)


def _tiny(**kw):
    args = dict(kind="neighbor", model="sage", num_nodes=2000, num_edges=16000, fanout=[4, 3],
                train_fraction=0.5, hidden=8, layers=2, num_features=4, warmup=2, steps=4, chunks=2,
                compiled=False, ranks=2)
    args.update(kw)
    return Workload(**args)


@pytest.fixture(autouse=True)
def _isolated(tmp_path, monkeypatch):
    """A cache folder of the test's own; the temporary files of the tuner processes it starts
    (the ranks' spec files, named on the ranks' command lines) under tmp_path/tmp, where
    :func:`_leftovers` looks for them. (This process's own: the ``ranks_tmp`` fixture; the
    PostgreSQL fixture's server folder stays where it was, open to its user.)"""
    monkeypatch.setenv("GNNCOMPILE_CACHE_DIR", str(tmp_path / "cache"))
    (tmp_path / "tmp").mkdir()
    tempfile.gettempdir()  # this process's stays as it was
    monkeypatch.setenv("TMPDIR", str(tmp_path / "tmp"))
    yield


@pytest.fixture
def ranks_tmp(tmp_path, monkeypatch):
    """The ranks a measurement in this process starts: their spec files under tmp_path/tmp."""
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path / "tmp"))
    return str(tmp_path / "tmp")


def _leftovers(marker: str, wait: float = 5.0) -> list:
    """Live processes (not zombies) whose command line names ``marker``: a rank, or a loader
    worker forked from one, left behind. Waits up to ``wait`` seconds for them to go. (Linux:
    read from /proc; elsewhere nothing is found.)"""
    if not os.path.isdir("/proc"):
        return []
    end = time.monotonic() + wait
    while True:
        found = []
        for pid in filter(str.isdigit, os.listdir("/proc")):
            try:
                with open(f"/proc/{pid}/cmdline", "rb") as f:
                    cmd = f.read().replace(b"\0", b" ").decode(errors="replace")
                with open(f"/proc/{pid}/stat") as f:
                    state = f.read().rsplit(")", 1)[1].split()[0]
            except (OSError, IndexError):
                continue
            if marker in cmd and state != "Z" and int(pid) != os.getpid():
                found.append((int(pid), cmd[:200]))
        if not found or time.monotonic() > end:
            return found
        time.sleep(0.2)


#: one tuner process: `tuner.study.tune` on a shared study, 1 trial (a 2-rank DDP job), once the
#: other tuner is ready too (both open the study before either has a trial: each runs its own)
TUNER = r"""
import json, os, sys, time
from gnncompile.tuner import Workload, tune
storage, name, out, me, other, seed = sys.argv[1:7]
open(me, "w").close()
end = time.monotonic() + 60
while not os.path.exists(other):
    if time.monotonic() > end:
        sys.exit("the other tuner never started")
    time.sleep(0.05)
w = Workload(**json.loads(sys.argv[7]))
res = tune(w, trials=1, storage=storage, name=name, out=out, batch_range=(32, 128), max_workers=0,
           seed=int(seed), measure_defaults=False, plots=False, timeout=120)
print(json.dumps({"profile": str(res["profile_path"]) if res["profile_path"] else None}))
"""


def _two_tuners_share(storage: str, load, tmp_path, name: str):
    """Two tuner processes, sharing nothing but ``storage``, each adding one trial that is a
    2-rank DDP job to the study at the same time; checks what they left in it (``load()``: the
    study as the storage holds it afterwards)."""
    workload = json.dumps(dict(kind="neighbor", model="sage", num_nodes=2000, num_edges=16000, fanout=[4, 3],
                               train_fraction=0.5, hidden=8, layers=2, num_features=4, warmup=2, steps=4,
                               chunks=2, compiled=False, ranks=2))
    ready = [str(tmp_path / f"ready{i}") for i in range(2)]
    procs = [subprocess.Popen([sys.executable, "-c", TUNER, storage, name, str(tmp_path / "out"), ready[i],
                               ready[1 - i], str(i), workload], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                              text=True, env=os.environ.copy(), cwd=tmp_path) for i in range(2)]
    results = []
    try:
        for p in procs:
            out, err = p.communicate(timeout=RUN_TIMEOUT)
            results.append((p.returncode, out, err))
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait(timeout=30)
    for rc, out, err in results:
        assert rc == 0, err[-3000:]
        assert "Traceback" not in err, err[-3000:]
    study = load()
    trials = study.get_trials()
    # both finished, and the study holds the trials of the two: one each
    workers = [t.user_attrs.get("worker") for t in trials]
    assert sorted(workers) == sorted(f"{socket.gethostname()}:{p.pid}" for p in procs), workers
    assert sorted(t.number for t in trials) == [0, 1]
    # ... run at the same time
    a, b = trials
    assert a.datetime_start < b.datetime_complete and b.datetime_start < a.datetime_complete
    for t in trials:  # every trial ended, cleanly
        if t.state == optuna.trial.TrialState.COMPLETE:
            assert t.value > 0 and t.user_attrs["peak_memory"] >= 0
        elif t.state == optuna.trial.TrialState.FAIL:
            assert t.user_attrs.get("error"), t.user_attrs
        else:
            assert t.state == optuna.trial.TrialState.PRUNED and t.intermediate_values, t.state
    # the study and the profile record the workload's ranks
    assert study.user_attrs["workload"]["ranks"] == 2
    paths = {json.loads(out)["profile"] for _, out, _ in results} - {None}
    assert paths, "no trial completed"
    doc = json.loads(open(paths.pop()).read())
    assert doc["workload"]["ranks"] == 2 and doc["study"]["name"] == name
    assert _leftovers(str(tmp_path / "tmp")) == []
    return study


# ----------------------------------------------------------------------------- the workload
def test_ranks_field_signature_and_shards(tmp_path, monkeypatch):
    assert Workload(kind="neighbor").ranks == 1
    assert "ranks" not in _tiny(ranks=1).signature_dict()  # one process: the signature as before
    assert _tiny().signature_dict()["ranks"] == 2 and _tiny().signature_dict() != _tiny(ranks=1).signature_dict()
    for bad in (0, -1, True, 1.5, "2"):
        with pytest.raises(ValueError, match="ranks"):
            _tiny(ranks=bad)
    with pytest.raises(ValueError, match="neighbor"):
        Workload(kind="graphs", ranks=2)
    with pytest.raises(ValueError, match="per rank"):
        _tiny(num_nodes=3, train_fraction=0.5, ranks=3)
    assert wl_mod.default_settings(_tiny(), {"type": "cpu"})["threads"] == 1  # as torchrun starts ranks
    # each rank's loader (its own split: num_replicas=, rank=): as many seeds on every rank,
    # none on two ranks, the remainder dropped
    w = _tiny(num_nodes=2002)  # 1001 training nodes
    seeds = []
    for r in range(2):
        loader = wl_mod._neighbor_loader(w, {"batch_size": 64}, torch.device("cpu"), r)
        seeds.append(torch.cat([b.n_id[:b.batch_size] for b in loader]))
    assert seeds[0].numel() == seeds[1].numel() == 500
    assert not set(seeds[0].tolist()) & set(seeds[1].tolist())
    monkeypatch.undo()
    # the command line: --ranks, refused where it cannot work
    from gnncompile.cli import main

    with pytest.raises(SystemExit) as e:
        main(["tune", "--workload", "neighbor", "--ranks", "0", "--no-progress"])
    assert e.value.code == 2
    assert main(["tune", "--workload", "graphs", "--ranks", "2", "--no-progress", "--out", str(tmp_path)]) == 2


def test_compiled_ddp_trial_reports_combined_progress(ranks_tmp):
    # DDP(gnncompile.compile(model)) on 2 ranks, the compile settings of a trial
    seen = []
    w = _tiny(compiled=True)
    rate, peak = measure(w, {"batch_size": 64, "threads": 1, "inner": "aot_eager", "knobs": [2]},
                         report=lambda c, v: seen.append((c, v)), timeout=120)
    assert rate > 0 and peak > 0
    assert [c for c, _ in seen] == [0, 1] and seen[-1][1] == rate  # as for one process
    assert _leftovers(ranks_tmp) == []


# ----------------------------------------------------------------------------- shared studies
def test_two_tuners_share_a_journal_study_of_ddp_trials(tmp_path):
    path = tmp_path / "study.log"

    def load():
        st = optuna.storages.JournalStorage(optuna.storages.journal.JournalFileBackend(str(path)))
        return optuna.load_study(study_name="ddp-journal", storage=st)

    study = _two_tuners_share(f"journal:{path}", load, tmp_path, "ddp-journal")
    assert len(load().get_trials()) == len(study.get_trials())  # the file loads again, whole


def test_two_tuners_share_a_postgresql_study_of_ddp_trials(postgres, tmp_path):
    url = postgres.start()
    _two_tuners_share(url, lambda: optuna.load_study(study_name="ddp-pg", storage=url), tmp_path, "ddp-pg")


# ----------------------------------------------------------------------------- failing ranks
def test_a_failing_rank_fails_the_trial_with_its_error(tmp_path, ranks_tmp, capsys):
    # `gnncompile tune --ranks 2` with a model that cannot be built (--hidden -1): each rank
    # raises in it; the trial fails with the rank's error, the run ends (no trial completed).
    # The command line's entry point in this process; the ranks are processes of their own.
    from gnncompile.cli import main

    log = tmp_path / "s.log"
    rc = main(["tune", *TINY_DDP, "--hidden", "-1", "--trials", "1", "--timeout", "120", "--storage",
               f"journal:{log}", "--study-name", "bad", "--out", str(tmp_path / "out")])
    out, err = capsys.readouterr()
    assert rc == 1, err[-3000:]  # no trial completed, no profile
    assert json.loads(out)["trials"] == {"fail": 1}
    st = optuna.storages.JournalStorage(optuna.storages.journal.JournalFileBackend(str(log)))
    (t,) = optuna.load_study(study_name="bad", storage=st).get_trials()
    assert t.state == optuna.trial.TrialState.FAIL
    err = t.user_attrs["error"]
    assert err.startswith("RankFailed: rank ") and " of 2 failed" in err, err
    assert "negative dimension" in err and "stderr tail" in err, err
    assert _leftovers(ranks_tmp) == []


def test_one_rank_failing_mid_training_stops_the_other(ranks_tmp, monkeypatch):
    # rank 1 raises once its warm-up is over; rank 0, waiting for it in the first timed step's
    # all-reduce, is stopped at once (not at the timeout)
    real = wl_mod._rank_command

    def command(spec):
        if not spec.endswith("rank1.json"):
            return real(spec)
        code = (f"import sys; import {wl_mod.__name__} as m\n"
                "def fail(*a, **k): raise ValueError('rank 1 gives up after its warm-up')\n"
                "m._timed = fail\nsys.exit(m._rank_main(sys.argv[1]))")
        return [sys.executable, "-c", code, spec]

    monkeypatch.setattr(wl_mod, "_rank_command", command)
    t0 = time.monotonic()
    with pytest.raises(RankFailed, match=r"rank 1 of 2 failed .*rank 1 gives up") as e:
        measure(_tiny(), {"batch_size": 64, "threads": 1}, timeout=90)
    assert time.monotonic() - t0 < 60
    assert "ValueError: rank 1 gives up" in str(e.value).split("stderr tail:", 1)[1]
    assert _leftovers(ranks_tmp) == []


def test_hung_ranks_are_killed_with_their_process_groups(ranks_tmp, monkeypatch):
    # ranks that never finish (each with a child, as a loader worker would be): stopped after
    # the timeout, with what they wrote to stderr; nothing of them is left
    marker = os.path.join(ranks_tmp, "hung-child")
    code = ("import subprocess, sys, time\n"
            f"subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(300)', {marker!r}])\n"
            "print('rank waiting for a peer that never comes', file=sys.stderr, flush=True)\n"
            "time.sleep(300)")
    monkeypatch.setattr(wl_mod, "_rank_command", lambda spec: [sys.executable, "-c", code, spec])
    t0 = time.monotonic()
    with pytest.raises(RankFailed, match=r"ran past 3 s \(a hang\?\): rank\(s\) 0, 1 of 2") as e:
        measure(_tiny(), {"batch_size": 64}, timeout=3)
    assert time.monotonic() - t0 < 30
    assert "rank waiting for a peer that never comes" in str(e.value)
    assert _leftovers(marker) == [] and _leftovers(ranks_tmp) == []
