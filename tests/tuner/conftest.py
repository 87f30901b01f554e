"""Fixtures of the tuner's tests: ``postgres``, a throwaway PostgreSQL server (the shared storage
of tests/tuner/test_tuner_ddp.py), and ``postgres_started``, one such server already started
and shared by the tests of a module (tests/tuner/test_tuner_storage.py).

It needs ``pgserver`` (ships the PostgreSQL server binaries; only its binaries are used here)
and ``psycopg2-binary`` (the SQLAlchemy driver); a test using it skips, with the reason, when
either is absent.

PostgreSQL refuses to run as root. Run as root (CI, containers), the throwaway server runs as
the unprivileged ``nobody`` user: its folder is a fresh ``mkdtemp`` folder chowned to
``nobody`` (pytest's ``tmp_path`` sits under a 0700 root folder that ``nobody`` cannot enter),
and when ``nobody`` cannot execute the binaries where they are installed, they are copied there
too. Nothing else on the system is touched (pgserver's own ``get_server`` would ``useradd`` a
user and open up the permissions of every parent folder). The server listens on 127.0.0.1 only,
on a free port, and is stopped and deleted by the fixture even when the test fails.
"""
from __future__ import annotations

import importlib.util
import os
import shutil
import signal
import socket
import subprocess
import tempfile
from pathlib import Path

import pytest


def _pg_bin() -> Path:
    pytest.importorskip("psycopg2", reason="PostgreSQL tests need psycopg2-binary")
    # find pgserver's binaries without importing it (its import sets up runtime folders and
    # lock files that are not needed here)
    spec = importlib.util.find_spec("pgserver")
    if spec is None or spec.origin is None:
        pytest.skip("PostgreSQL tests need pgserver (it ships the PostgreSQL binaries)")
    b = Path(spec.origin).parent / "pginstall" / "bin"
    if not (b / "initdb").is_file() or not (b / "pg_ctl").is_file():
        pytest.skip(f"pgserver has no PostgreSQL binaries in {b}")
    return b


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class _Postgres:
    """A throwaway PostgreSQL server: ``url`` is its SQLAlchemy URL (psycopg2 driver)."""

    def __init__(self, bindir: Path):
        self.base = Path(tempfile.mkdtemp(prefix="gncpg-"))
        self.data = self.base / "data"
        self.log = self.base / "server.log"
        self.kw = {}
        self.url = None
        self.port = None
        if os.geteuid() == 0:
            import pwd

            try:
                nobody = pwd.getpwnam("nobody")
            except KeyError:
                shutil.rmtree(self.base, ignore_errors=True)
                pytest.skip("running as root (PostgreSQL refuses root) and there is no "
                            "'nobody' user to run the server as")
            self.kw = {"user": nobody.pw_uid, "group": nobody.pw_gid, "extra_groups": []}
            os.chown(self.base, nobody.pw_uid, nobody.pw_gid)
            if not self._runs(bindir):
                # the install folder is not open to 'nobody' (e.g. a venv under /root): use a
                # copy, laid out as installed (the binaries find libpq in ../../../pgserver.libs)
                pkg = bindir.parent.parent
                copy = self.base / "pgserver" / "pginstall"
                shutil.copytree(bindir.parent, copy, symlinks=True)
                if (pkg.parent / "pgserver.libs").is_dir():
                    shutil.copytree(pkg.parent / "pgserver.libs", self.base / "pgserver.libs",
                                    symlinks=True)
                for root, dirs, files in os.walk(self.base):
                    for n in [root, *(os.path.join(root, f) for f in files)]:
                        os.lchown(n, nobody.pw_uid, nobody.pw_gid)
                bindir = copy / "bin"
                if not self._runs(bindir):
                    shutil.rmtree(self.base, ignore_errors=True)
                    pytest.fail(f"the PostgreSQL binaries in {bindir} do not run as 'nobody'")
        self.bin = bindir

    def _runs(self, bindir: Path) -> bool:
        try:
            return all(subprocess.run([str(bindir / exe), "--version"], capture_output=True,
                                      timeout=30, **self.kw).returncode == 0
                       for exe in ("postgres", "initdb", "pg_ctl"))
        except (OSError, subprocess.SubprocessError):
            return False

    def _run(self, exe, *args, timeout=120):
        return subprocess.run([str(self.bin / exe), *args], capture_output=True, text=True,
                              timeout=timeout, cwd=self.base, **self.kw)

    def start(self, password: str = "") -> str:
        r = self._run("initdb", "-D", str(self.data), "-U", "postgres", "--auth=trust",
                      "--encoding=UTF8", "--no-locale", "--no-sync")
        if r.returncode != 0:
            pytest.fail(f"initdb failed:\n{r.stdout}\n{r.stderr}")
        for _ in range(3):  # a free port can be taken between choosing it and the server binding it
            port = _free_port()
            r = self._run("pg_ctl", "-D", str(self.data), "-l", str(self.log), "-w", "-t", "60",
                          "-o", f"-h 127.0.0.1 -p {port} -k '' -c fsync=off -c max_connections=60",
                          "start")  # TCP on 127.0.0.1 only (-k '': no Unix socket)
            if r.returncode == 0:
                self.port = port
                self.url = self.url_for(password)
                return self.url
        log = self.log.read_text() if self.log.exists() else ""
        pytest.fail(f"PostgreSQL did not start:\n{r.stdout}\n{r.stderr}\n{log[-3000:]}")

    def url_for(self, password: str = "") -> str:
        """The started server's URL, with ``password`` in it: trust authentication ignores the
        password; it is there to check that the tuner never writes it out."""
        creds = f"postgres:{password}" if password else "postgres"
        return f"postgresql+psycopg2://{creds}@127.0.0.1:{self.port}/postgres"

    def stop(self) -> None:
        try:
            if (self.data / "postmaster.pid").exists():
                # immediate: the data folder is deleted next, nothing in it needs a clean shutdown
                r = self._run("pg_ctl", "-D", str(self.data), "-m", "immediate", "-w", "-t", "30",
                              "stop", timeout=60)
                pidfile = self.data / "postmaster.pid"
                if r.returncode != 0 and pidfile.exists():  # did not stop: kill the postmaster
                    try:
                        os.kill(int(pidfile.read_text().split()[0]), signal.SIGKILL)
                    except (OSError, ValueError, IndexError):
                        pass
        finally:
            shutil.rmtree(self.base, ignore_errors=True)


@pytest.fixture
def postgres():
    """Starts a throwaway PostgreSQL server and yields it; stops and deletes it afterwards."""
    server = _Postgres(_pg_bin())
    try:
        yield server
    finally:
        server.stop()


@pytest.fixture(scope="module")
def postgres_started():
    """One throwaway PostgreSQL server, started, for all the tests of a module that ask for it
    (each test works on studies of its own names); stopped and deleted after the module."""
    server = _Postgres(_pg_bin())
    try:
        server.start()
        yield server
    finally:
        server.stop()


@pytest.fixture(autouse=True)
def _quiet_machine(monkeypatch):
    """The tuner's load check answers "not loaded" in this process: the tests' stand-in
    measurements do not depend on the machine, and the other test workers running beside them
    must not steer which candidate the tuner keeps. A test of the load handling replaces
    ``tuner.study._machine_loaded`` itself; runs in a subprocess (the command line) are checked
    for real."""
    try:
        from gnncompile.tuner import study as study_mod
    except ImportError:  # no optuna: the tuner's tests skip
        yield
        return
    monkeypatch.setattr(study_mod, "_machine_loaded", lambda report: False)
    yield
