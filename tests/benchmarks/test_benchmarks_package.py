"""The benchmarks package: one runner (``python -m benchmarks``) that lists every benchmark with a
line of description and runs one by name; every module imports as part of the package (shared
helpers through package imports, no sys.path edits); a benchmark's child process runs as
``python -m benchmarks.NAME``."""
from __future__ import annotations

import importlib
import subprocess
import sys
from pathlib import Path

import pytest

from benchmarks import __main__ as runner
from benchmarks import _common

ROOT = Path(__file__).resolve().parents[2]
NAMES = sorted(p.stem for p in (ROOT / "benchmarks").glob("*.py") if not p.name.startswith("_"))


def test_runner_lists_every_benchmark(capsys):
    assert runner.main([]) == 0
    out = capsys.readouterr().out
    listed = runner.benchmarks()
    assert sorted(listed) == NAMES and {"ops", "models", "messages", "gpu_ops"} <= set(listed)
    for name, line in listed.items():
        assert line and not line.startswith(("python", "-")), (name, line)
        assert f"  {name} " in out and line in out


def test_runner_refuses_an_unknown_name(capsys):
    assert runner.main(["no_such_benchmark"]) == 2
    err = capsys.readouterr().err
    assert "no benchmark named 'no_such_benchmark'" in err and "  ops " in err


def test_python_m_benchmarks_lists():
    p = subprocess.run([sys.executable, "-m", "benchmarks"], cwd=ROOT, capture_output=True, text=True,
                       timeout=120)
    assert p.returncode == 0, p.stderr
    assert "usage: python -m benchmarks NAME" in p.stdout and "  ops " in p.stdout


@pytest.mark.parametrize("name", NAMES)
def test_every_benchmark_imports(name):
    if name.startswith("tuning"):
        pytest.importorskip("optuna")
    assert callable(importlib.import_module(f"benchmarks.{name}").main)


def test_no_sys_path_edits():
    for path in (ROOT / "benchmarks").rglob("*.py"):
        assert "sys.path" not in path.read_text(), path


def test_command_form():
    assert _common.command("ops", ["--quick"]) == "python -m benchmarks ops --quick"
    assert _common.command("models", []) == "python -m benchmarks models"
    assert _common.module_command("ops")[1:] == ["-m", "benchmarks.ops"]


def test_child_process_runs_as_a_module():
    """ops.py's memory case, the child its --memory sweep starts: a number of bytes."""
    p = subprocess.run(_common.module_command("ops") + ["--memory-case", "gnncompile", "500", "2000", "8"],
                       cwd=_common.ROOT, env=_common.isolated_env(), capture_output=True, text=True, timeout=300)
    assert p.returncode == 0, p.stderr
    int(p.stdout.strip().splitlines()[-1])
