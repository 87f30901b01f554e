"""tests/gpu/run.sh, the one-call device check, in its CPU mode: the phase plan fits the
540 s budget of one device call, CUDA phases are skipped, the others run, and every result
lands in the output folder (at most 8 files come back from a device call)."""
from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

# process-level tests (subprocesses, servers, whole runs): `make test` runs them, `make test-fast`
# does not (tests/slow_list.py)
pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parents[2]


def test_run_script_cpu_mode(tmp_path):
    out = tmp_path / "out"
    env = dict(os.environ, PYTHON=sys.executable)
    env.pop("GNNCOMPILE_DISABLE_NATIVE", None)
    proc = subprocess.run(["bash", str(ROOT / "tests" / "gpu" / "run.sh"), str(out), "--cpu"],
                          cwd=tmp_path, env=env, capture_output=True, text=True, timeout=400)
    summary = (out / "summary.txt").read_text()
    assert proc.returncode == 0, f"{proc.stdout}\n{proc.stderr}\n{summary}"
    plan = dict(re.findall(r"^  plan  (\S+)\s+(\d+)s", summary, flags=re.M))
    phases = {k: int(v) for k, v in plan.items() if k != "total"}
    assert list(phases) == ["env", "build", "gpu-tests", "gpu-bench", "gpu-models", "gpu-graphs", "op-tests"]
    assert sum(phases.values()) == int(plan["total"]) <= 540 - 10
    assert re.search(r"^gpu-tests\s+skipped: --cpu", summary, flags=re.M)
    assert re.search(r"^gpu-bench\s+skipped: --cpu", summary, flags=re.M)
    assert re.search(r"^gpu-graphs\s+skipped: --cpu", summary, flags=re.M)
    assert re.search(r"^op-tests\s+rc=0 ", summary, flags=re.M)
    assert re.search(r"^total \d+s of 540s; status 0$", summary, flags=re.M)
    files = sorted(p.name for p in out.iterdir())
    assert len(files) <= 8 and {"summary.txt", "env.txt", "op_tests.log"} <= set(files), files
    assert "passed" in (out / "op_tests.log").read_text()
