"""Shared helpers for the benchmarks: timing, memory, machine bandwidth, report writing."""
from __future__ import annotations

import json
import os
import statistics
import sys
import time
from pathlib import Path
from typing import Callable, Dict, List

import torch

RESULTS = Path(__file__).resolve().parent / "results"


def timeit(fn: Callable[[], object], repeats: int, warmup: int = 1) -> Dict[str, float]:
    """Median, min and max wall time in seconds over `repeats` calls after `warmup` calls."""
    for _ in range(warmup):
        fn()
    ts: List[float] = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        ts.append(time.perf_counter() - t0)
    return {"median": statistics.median(ts), "min": min(ts), "max": max(ts), "n": repeats}


def copy_bandwidth_gbs(nbytes: int = 256 << 20, repeats: int = 5) -> float:
    """The machine's measured copy bandwidth (bytes read + written per second), in GB/s."""
    src = torch.ones(nbytes // 4)
    dst = torch.empty_like(src)
    t = timeit(lambda: dst.copy_(src), repeats)
    return 2 * nbytes / t["median"] / 1e9


def read_peak_rss_delta(fn: Callable[[], object]) -> int:
    """Peak resident memory added while fn runs, in bytes (Linux).

    Resets the kernel's high-water mark (VmHWM) through /proc/self/clear_refs, runs fn, and
    returns VmHWM - VmRSS(before). Run under MALLOC_MMAP_THRESHOLD_=65536 so that every large
    tensor is its own mapping and freed memory leaves the process at once (see run_isolated).
    """
    def status(key: str) -> int:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith(key + ":"):
                    return int(line.split()[1]) * 1024
        raise RuntimeError(f"{key} not in /proc/self/status")

    with open("/proc/self/clear_refs", "w") as f:
        f.write("5")
    before = status("VmRSS")
    fn()
    return status("VmHWM") - before


def isolated_env() -> dict:
    env = dict(os.environ)
    env["MALLOC_MMAP_THRESHOLD_"] = "65536"
    return env


def run_child(cmd: list, env: dict, timeout: float, tail_chars: int = 500) -> dict:
    """Runs a benchmark child process; its last ``RESULT {json}`` line, or {"error": ...} with
    the command (a timeout, a non-zero exit or no result line)."""
    import subprocess

    try:
        p = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=timeout)
    except subprocess.TimeoutExpired:
        return {"error": f"timed out after {timeout} s", "command": " ".join(cmd)}
    lines = [ln for ln in p.stdout.splitlines() if ln.startswith("RESULT ")]
    if p.returncode == 0 and lines:
        return json.loads(lines[-1][len("RESULT "):])
    tail = (p.stderr or p.stdout).strip().splitlines()[-1:] or ["no output"]
    return {"error": f"rc {p.returncode}: {tail[0][:tail_chars]}", "command": " ".join(cmd)}


def write_json(path: Path, payload: dict) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(path.suffix + ".tmp")
    tmp.write_text(json.dumps(payload, indent=2))
    os.replace(tmp, path)


def machine() -> dict:
    import gnncompile

    info = gnncompile.info()
    return {
        "device": info["device"],
        "native": info["native"],
        "torch": info["torch"],
        "gnncompile": info["version"],
        "threads": torch.get_num_threads(),
        "python": sys.version.split()[0],
    }


def write_results(folder: Path, name: str, payload: dict, markdown: Callable[[dict], str],
                  plot: Callable[[dict, Path], None]) -> None:
    """Writes folder/name.{json,md,png} (the plot skipped, with a note, where it fails: the table
    is the result) and prints the markdown."""
    folder = Path(folder)
    write_json(folder / f"{name}.json", payload)
    md = markdown(payload)
    (folder / f"{name}.md").write_text(md)
    print(md)
    try:
        plot(payload, folder / f"{name}.png")
    except Exception as e:  # matplotlib missing
        print(f"(no plot: {e})")
