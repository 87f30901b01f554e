"""The tuner's shared storage: several `gnncompile tune` processes work on one study in a
PostgreSQL database at once (what several machines do given an RDB URL), a study in PostgreSQL
resumes, and the study opens in optuna-dashboard.

Optional packages; each test skips, with the reason, when its package is absent:

* PostgreSQL tests: ``pgserver`` (ships the PostgreSQL server binaries; only its binaries are
  used here) and ``psycopg2-binary`` (the SQLAlchemy driver).
* dashboard tests: ``optuna-dashboard`` (its WSGI app is called in-process; no server, no
  network).

The throwaway PostgreSQL server is the ``postgres_started`` fixture of tests/tuner/conftest.py:
one server for the module, each test on studies of its own names.
"""
from __future__ import annotations

import json
import socket
from pathlib import Path
from wsgiref.util import setup_testing_defaults

import pytest

optuna = pytest.importorskip("optuna")

# the helpers and the TINY workload of the tuner's own tests (same folder)
from test_tuner import TINY, _cli, _isolated_cache  # noqa: E402,F401  (_isolated_cache: autouse)

# process-level tests (subprocesses, servers, whole runs): `make test` runs them, `make test-fast`
# does not (tests/slow_list.py)
pytestmark = pytest.mark.slow

FINISHED = (optuna.trial.TrialState.COMPLETE, optuna.trial.TrialState.PRUNED)


# ----------------------------------------------------------------------------- helpers
def _finished(study):
    return [t for t in study.get_trials() if t.state in FINISHED]


def _run_ok(args, timeout=240):
    p = _cli(args)
    try:
        out, err = p.communicate(timeout=timeout)
    finally:
        if p.poll() is None:
            p.kill()
            p.wait(timeout=30)
    assert p.returncode == 0, err
    return json.loads(out), p


def _tune_here(args, capsys):
    """``gnncompile tune`` in this process (its entry point, ``gnncompile.cli.main``): its summary."""
    from gnncompile.cli import main

    capsys.readouterr()
    assert main(args) == 0
    return json.loads(capsys.readouterr().out)


# ----------------------------------------------------------------------------- tests
def test_two_processes_share_one_postgresql_study(postgres_started, tmp_path):
    url = postgres_started.url_for(password="s3cret-pw")
    name, trials = "pg-shared", 8
    out = tmp_path / "out"
    args = ["tune", *TINY, "--storage", url, "--study-name", name, "--out", str(out),
            "--no-defaults", "--trials", str(trials)]
    procs = [_cli(args), _cli(args)]
    results = []
    try:
        for p in procs:
            stdout, stderr = p.communicate(timeout=300)
            results.append((p.returncode, stdout, stderr))
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait(timeout=30)
    for rc, stdout, stderr in results:
        assert rc == 0, stderr
        assert "Traceback" not in stderr, stderr
        assert "s3cret-pw" not in stdout + stderr  # the summary names the storage without its password

    study = optuna.load_study(study_name=name, storage=url)
    all_trials = study.get_trials()
    finished = [t for t in all_trials if t.state in FINISHED]
    # the shared budget: each process may finish the one trial it had in flight when the other
    # finished the last one
    assert trials <= len(finished) <= trials + 1, [t.state for t in all_trials]
    # no trial lost: every trial the study ever started ran to an end, none failed or hangs, and
    # the numbers have no gaps
    assert [t.state for t in all_trials if t.state not in FINISHED] == []
    assert sorted(t.number for t in all_trials) == list(range(len(all_trials)))
    assert all(t.value is not None and t.value > 0 for t in all_trials
               if t.state == optuna.trial.TrialState.COMPLETE)
    # both processes ran trials: the tuner records '<host>:<pid>' of the process running each
    by_worker = {}
    for t in all_trials:
        by_worker.setdefault(t.user_attrs.get("worker"), []).append(t)
    expected = {f"{socket.gethostname()}:{p.pid}" for p in procs}
    assert set(by_worker) == expected, set(by_worker)
    # ... at the same time: some trials of the two processes overlap in time
    a, b = (by_worker[w] for w in sorted(expected))
    assert any(x.datetime_start < y.datetime_complete and y.datetime_start < x.datetime_complete
               for x in a for y in b), "the two processes never ran trials at the same time"

    # each process wrote the profile (atomically, to the same file); it names the PostgreSQL
    # study and does not leak the password
    paths = {json.loads(stdout)["profile"] for _, stdout, _ in results}
    assert len(paths) == 1
    path = Path(paths.pop())
    assert path.parent == out and path.is_file()
    text = path.read_text()
    doc = json.loads(text)
    assert doc["study"]["name"] == name
    assert doc["study"]["storage"].startswith("postgresql+psycopg2://postgres:***@127.0.0.1:")
    assert "s3cret-pw" not in text
    assert sum(doc["study"]["trials"][s] for s in ("complete", "pruned")) >= trials


def test_resume_postgresql_study_keeps_completed_trials(postgres_started, tmp_path, capsys):
    url = postgres_started.url
    name = "pg-resume"
    args = ["tune", *TINY, "--storage", url, "--study-name", name, "--out", str(tmp_path),
            "--no-defaults"]
    _run_ok([*args, "--trials", "2"])
    before = optuna.load_study(study_name=name, storage=url)
    first = {t.number: (t.state, t.value, t.params) for t in _finished(before)}
    assert len(first) == 2

    _, p = _run_ok([*args, "--trials", "4"])
    after = optuna.load_study(study_name=name, storage=url)
    now = {t.number: (t.state, t.value, t.params) for t in _finished(after)}
    assert len(now) == 4 and len(after.get_trials()) == 4
    for k, v in first.items():  # the first run's trials are still there, unchanged
        assert now[k] == v
    workers = {t.number: t.user_attrs["worker"] for t in after.get_trials()}
    assert {workers[k] for k in now if k not in first} == {f"{socket.gethostname()}:{p.pid}"}
    # a third run asking for what the study already holds adds nothing (the command line's entry
    # point, in this process: the two runs above are the real processes)
    _tune_here([*args, "--trials", "4"], capsys)
    assert len(optuna.load_study(study_name=name, storage=url).get_trials()) == 4


# ----------------------------------------------------------------------------- optuna-dashboard
def _wsgi_get(app, path):
    environ = {"PATH_INFO": path, "REQUEST_METHOD": "GET"}
    setup_testing_defaults(environ)
    status = {}

    def start_response(s, headers, exc_info=None):
        status["status"], status["headers"] = s, dict(headers)

    body = b"".join(app(environ, start_response))
    return int(status["status"].split()[0]), status["headers"], body


@pytest.mark.parametrize("backend", ["sqlite", "postgresql"])
def test_optuna_dashboard_opens_the_study(backend, tmp_path, request, capsys):
    optuna_dashboard = pytest.importorskip("optuna_dashboard")
    if backend == "sqlite":
        url = f"sqlite:///{tmp_path / 'studies.db'}"
    else:
        url = request.getfixturevalue("postgres_started").url
    name = f"dash-{backend}"
    # the study, written by the command line's entry point in this process
    summary = _tune_here(["tune", *TINY, "--storage", url, "--study-name", name,
                          "--out", str(tmp_path), "--no-defaults", "--trials", "3"], capsys)
    study = optuna.load_study(study_name=name, storage=url)
    trials = study.get_trials()
    assert len(_finished(study)) == 3

    # what `optuna-dashboard <url>` serves, without the server
    app = optuna_dashboard.wsgi(url)
    code, headers, body = _wsgi_get(app, "/api/studies")
    assert code == 200 and headers["Content-Type"].startswith("application/json")
    listed = {s["study_name"]: s for s in json.loads(body)["study_summaries"]}
    assert name in listed, list(listed)
    assert listed[name]["directions"] == ["maximize"]

    code, _, body = _wsgi_get(app, f"/api/studies/{listed[name]['study_id']}")
    assert code == 200
    detail = json.loads(body)
    assert detail["name"] == name
    assert len(detail["trials"]) == len(trials) == sum(summary["trials"].values())
    assert [t["number"] for t in detail["trials"]] == [t.number for t in trials]
    assert [t["state"].upper() for t in detail["trials"]] == [t.state.name for t in trials]
    assert {p["name"] for p in detail["trials"][0]["params"]} == set(trials[0].params)
    assert {a["key"] for a in detail["user_attrs"]} >= {"workload", "device_key", "unit"}
    assert {a["key"] for a in detail["trials"][0]["user_attrs"]} >= {"settings", "worker"}
    best = max((t for t in trials if t.state == optuna.trial.TrialState.COMPLETE),
               key=lambda t: t.value)
    assert [t["number"] for t in detail["best_trials"]] == [best.number]

    code, headers, body = _wsgi_get(app, "/dashboard")  # the web page itself
    assert code == 200 and headers["Content-Type"].startswith("text/html") and body
