"""Shared helpers for the benchmarks: timing (CPU and CUDA), memory, machine bandwidth, the
machine and load records, child processes, the command line and report writing."""
from __future__ import annotations

import json
import os
import statistics
import sys
import time
from pathlib import Path
from typing import Callable, Dict, List, Optional, Sequence, Tuple

import torch

ROOT = Path(__file__).resolve().parents[1]  # the repository: `python -m benchmarks...` runs from here
RESULTS = Path(__file__).resolve().parent / "results"  # the current tables


def command(name: str, argv: Optional[Sequence[str]] = None) -> str:
    """The command line that ran benchmark ``name`` with ``argv`` (default: this process's
    arguments), as the result tables record it: ``python -m benchmarks NAME ARGS``."""
    args = list(sys.argv[1:] if argv is None else argv)
    return " ".join(["python", "-m", "benchmarks", name] + args)


def module_command(name: str) -> List[str]:
    """The start of a child process's command line that runs benchmark ``name`` (its arguments
    follow). Run it with ``cwd=ROOT`` (run_child does) so that the package is importable."""
    return [sys.executable, "-m", f"{__package__ or 'benchmarks'}.{name}"]


#: The speed guard (gnncompile.compiler.guard) times both forms of each piece, then the whole
#: compiled model against the model as written, over its first ~25 training calls: a benchmark
#: steps until the model-level decision is final (at most this many steps, plus those of the
#: re-check of a close win: :func:`guard_steps`) and times what it kept.
GUARD_STEPS = 60


def guard_steps() -> int:
    """The most steps :func:`step_past_guard` takes: GUARD_STEPS, plus the re-check of a close
    win of the compiled model (RECHECK_AFTER calls later, one untimed and 2 x RECHECK_SAMPLES
    timed calls, then the deciding one). A gnncompile without the re-check (an earlier commit
    that ``commit_ab`` times: its guard has no RECHECK_AFTER) gets GUARD_STEPS alone."""
    from gnncompile.compiler import guard

    if not hasattr(guard, "RECHECK_AFTER"):
        return GUARD_STEPS
    return GUARD_STEPS + guard.RECHECK_AFTER + 2 + 2 * guard.RECHECK_SAMPLES


def guard_decided(run) -> bool:
    """Whether the speed guard has decided for good for the whole model, training (gradients
    on): decided, and no re-check of a close win pending (``ModelGuard.settled``)."""
    model_guard = getattr(run, "_guard", None)
    if model_guard is not None and hasattr(model_guard, "settled"):
        return model_guard.settled(True)
    return any(d.piece.startswith("the whole model") and d.grad for d in run.guard_decisions())


def step_past_guard(run, step: Callable[[], object], limit: Optional[int] = None) -> int:
    """Calls ``step`` until the speed guard of ``run`` (a compiled model) has decided for the
    whole model, at most ``limit`` times; returns how many steps it took. 0 at once for an
    uncompiled model or one compiled with the guard off (there is nothing to wait for: until
    2026-12-03 such runs stepped ``limit`` times for nothing)."""
    settings = getattr(run, "gnncompile_settings", None)
    if not hasattr(run, "guard_decisions") or settings is None or getattr(settings, "guard", "off") == "off":
        return 0
    limit = guard_steps() if limit is None else limit
    n = 0
    while n < limit and not guard_decided(run):
        step()
        n += 1
    return n


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
    gnncompile's block cache of freed large allocations (on by default once a model is compiled)
    is emptied first: fn would otherwise reuse its idle blocks, already resident, and read low.
    """
    mem = sys.modules.get("gnncompile.hardware.memory")
    if mem is not None:
        mem.empty_cache()
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


def isolated_env(threads: Optional[int] = None) -> dict:
    """A child's environment for memory measurements: MALLOC_MMAP_THRESHOLD_=65536 (see
    read_peak_rss_delta); ``threads``: OMP_NUM_THREADS."""
    env = dict(os.environ)
    env["MALLOC_MMAP_THRESHOLD_"] = "65536"
    if threads is not None:
        env["OMP_NUM_THREADS"] = str(threads)
    return env


def timing_env(threads: Optional[int] = None) -> dict:
    """A child's environment for timing under the default allocator: this process's without
    MALLOC_MMAP_THRESHOLD_; ``threads``: OMP_NUM_THREADS."""
    env = dict(os.environ)
    env.pop("MALLOC_MMAP_THRESHOLD_", None)
    if threads is not None:
        env["OMP_NUM_THREADS"] = str(threads)
    return env


def run_child(cmd: list, env: dict, timeout: float, tail_chars: int = 500, cwd: Optional[Path] = None) -> dict:
    """Runs a benchmark child process (in ``cwd``, default ROOT: see module_command); its last
    ``RESULT {json}`` line, or {"error": ...} with the command (a timeout, a non-zero exit or no
    result line)."""
    import subprocess

    try:
        p = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=timeout, cwd=cwd or ROOT)
    except subprocess.TimeoutExpired:
        return {"error": f"timed out after {timeout} s", "command": " ".join(cmd)}
    lines = [ln for ln in p.stdout.splitlines() if ln.startswith("RESULT ")]
    if p.returncode == 0 and lines:
        return json.loads(lines[-1][len("RESULT "):])
    tail = (p.stderr or p.stdout).strip().splitlines()[-1:] or ["no output"]
    return {"error": f"rc {p.returncode}: {tail[0][:tail_chars]}", "command": " ".join(cmd)}


CORE_LATENCY_SRC = Path(__file__).resolve().parent / "native" / "core_latency.cpp"


def _core_latency_binary() -> Optional[Path]:
    """benchmarks/native/core_latency.cpp built once per source version (in the temp folder, with
    $CXX, c++ or g++); None where no compiler builds it."""
    import hashlib
    import shutil
    import subprocess
    import tempfile

    src = CORE_LATENCY_SRC.read_bytes()
    out = Path(tempfile.gettempdir()) / f"gnncompile-core-latency-{hashlib.sha1(src).hexdigest()[:12]}"
    if out.exists():
        return out
    for cxx in [os.environ.get("CXX"), "c++", "g++"]:
        if not cxx or not shutil.which(cxx):
            continue
        tmp = out.with_name(out.name + f".{os.getpid()}")
        try:
            r = subprocess.run([cxx, "-O2", "-pthread", str(CORE_LATENCY_SRC), "-o", str(tmp)],
                               capture_output=True, timeout=120)
        except (OSError, subprocess.TimeoutExpired):
            continue
        if r.returncode == 0:
            os.replace(tmp, out)
            return out
    return None


def core_latency_ns(cpus: Optional[Sequence[int]] = None, n: int = 20000, runs: int = 3) -> Optional[float]:
    """The cache-line round trip between two CPUs in ns (benchmarks/native/core_latency.cpp: the
    median of ``runs`` runs of ``n`` round trips), between the first two CPUs this process may
    run on unless ``cpus`` names them; a probe of where a virtual machine's host placed its
    vCPUs. None with fewer than two CPUs, no compiler or a failed run."""
    import subprocess

    cpus = list(cpus) if cpus is not None else sorted(os.sched_getaffinity(0))[:2]
    if len(cpus) < 2:
        return None
    exe = _core_latency_binary()
    if exe is None:
        return None
    try:
        r = subprocess.run([str(exe), str(cpus[0]), str(cpus[1]), str(n), str(runs)],
                           capture_output=True, text=True, timeout=60)
        return float(r.stdout) if r.returncode == 0 else None
    except (OSError, ValueError, subprocess.TimeoutExpired):
        return None


def process_tree(pid: int) -> List[int]:
    """``pid`` and its descendants (Linux /proc; children before they are lost to a parent's
    exit): torchrun starts each rank in a session of its own, so killing the launcher's process
    group leaves the ranks running."""
    out, todo = [], [pid]
    while todo:
        p = todo.pop()
        out.append(p)
        try:
            for task in os.listdir(f"/proc/{p}/task"):
                with open(f"/proc/{p}/task/{task}/children") as f:
                    todo += [int(c) for c in f.read().split()]
        except OSError:
            pass
    return out


def kill_tree(pid: int) -> None:
    """SIGKILL to ``pid`` and every descendant (see :func:`process_tree`)."""
    import signal

    for p in process_tree(pid):
        try:
            os.kill(p, signal.SIGKILL)
        except OSError:
            pass


def write_json(path: Path, payload: dict, default: Optional[Callable] = None) -> None:
    """Writes ``payload`` to ``path`` (through a temporary file, so a reader never sees half of
    it); ``default`` as json.dumps takes it (``str`` for payloads holding other objects)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(path.suffix + ".tmp")
    tmp.write_text(json.dumps(payload, indent=2, default=default))
    os.replace(tmp, path)


def append_json_line(path, payload: dict) -> None:
    """Appends ``payload`` to ``path`` as one JSON line (the ``--json`` record of benchmarks that
    collect one line per run)."""
    with open(path, "a") as f:
        f.write(json.dumps(payload) + "\n")


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


#: family 25's Zen 4 model ranges (Genoa 0x10-0x1f, Raphael / Phoenix 0x60-0x7f, Bergamo / Siena
#: 0xa0-0xaf); its other models are Zen 3 (Milan 0x00-0x0f, desktop and mobile 0x20-0x5f)
_ZEN4_MODELS = (range(0x10, 0x20), range(0x60, 0x80), range(0xA0, 0xB0))


#: AMD core generations by x86 family and model, for the tables' CPU line
def _amd_generation(family: int, model: int) -> str:
    if family == 25:
        return "Zen 4" if any(model in r for r in _ZEN4_MODELS) else "Zen 3"
    return {23: "Zen 2" if model >= 0x30 else "Zen / Zen+", 26: "Zen 5"}.get(family, "")


def cpu_model() -> str:
    """The CPU for the tables (ratios hold per CPU model): the model name (/proc/cpuinfo), then on
    x86 the family and model numbers, the core generation where it is known (AMD), the widest
    vector ISA and the L3 size. A virtual machine's name, e.g. 'AMD EPYC', often hides the
    generation; e.g. 'AMD EPYC (family 23 model 49, Zen 2, avx2, L3 16 MiB)'."""
    fields = {}
    try:
        for line in open("/proc/cpuinfo"):
            if not line.strip():
                break  # the first CPU's block
            k, _, v = line.partition(":")
            fields[k.strip()] = v.strip()
    except OSError:
        pass
    name = fields.get("model name")
    if not name:
        import platform

        return platform.processor() or "unknown"
    extra = []
    try:
        family, model = int(fields["cpu family"]), int(fields["model"])
        extra.append(f"family {family} model {model}")
        if fields.get("vendor_id") == "AuthenticAMD" and _amd_generation(family, model):
            extra.append(_amd_generation(family, model))
    except (KeyError, ValueError):
        pass
    flags = fields.get("flags", "").split()
    isa = next((f for f in ("avx512f", "avx2") if f in flags), None)
    if isa:
        extra.append(isa)
    try:
        from gnncompile.hardware import device

        l3 = device.detect("cpu").get("l3_bytes") or 0
        if l3:
            extra.append(f"L3 {l3 >> 20} MiB")
    except Exception:  # the tables do not need it
        pass
    return f"{name} ({', '.join(extra)})" if extra else name


def loadavg() -> Tuple[float, float, float]:
    """The machine's load averages (1, 5, 15 min): benchmarks record them before and after a run
    (the machine is shared) as ``"loadavg_before_after": [before, after]``."""
    return os.getloadavg()


def load_text(before_after) -> str:
    """The tables' note on a run's ``loadavg_before_after``: the 1-min load before / after."""
    before, after = before_after
    return f"Load average (1 min) before / after: {before[0]:.1f} / {after[0]:.1f}"


def write_results(folder: Path, name: str, payload: dict, markdown: Callable[[dict], str],
                  plot: Optional[Callable[[dict, Path], None]] = None,
                  json_default: Optional[Callable] = None) -> None:
    """Writes folder/name.{json,md,png} (no plot where ``plot`` is None; the plot skipped, with
    a note, where it fails: the table is the result) and prints the markdown."""
    folder = Path(folder)
    write_json(folder / f"{name}.json", payload, default=json_default)
    md = markdown(payload)
    (folder / f"{name}.md").write_text(md)
    print(md)
    if plot is None:
        return
    try:
        plot(payload, folder / f"{name}.png")
    except Exception as e:  # matplotlib missing
        print(f"(no plot: {e})")


# --------------------------------------------------------------------------- CUDA
def cuda_time(fn: Callable[[], object], repeats: int, warmup: int) -> Tuple[float, List[float]]:
    """Median and every time of ``repeats`` calls of fn after ``warmup`` calls, in milliseconds,
    measured with CUDA events."""
    for _ in range(warmup):
        fn()
    torch.cuda.synchronize()
    times = []
    for _ in range(repeats):
        start = torch.cuda.Event(enable_timing=True)
        end = torch.cuda.Event(enable_timing=True)
        start.record()
        fn()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end))  # milliseconds
    return statistics.median(times), times


def cuda_peak_bytes(fn: Callable[[], object]) -> int:
    """The CUDA allocator's high-water mark during one call of fn, above what was allocated
    before it."""
    torch.cuda.synchronize()
    base = torch.cuda.memory_allocated()
    torch.cuda.reset_peak_memory_stats()
    out = fn()
    torch.cuda.synchronize()
    peak = torch.cuda.max_memory_allocated() - base
    del out
    return int(peak)


def add_neighbor_workload(ap) -> None:
    """The neighbor-sampling SAGE workload's arguments, shared by the neighbor benchmarks (the tuner's
    neighbor study's defaults: 100k nodes, 1M edges, fanout 10 5, hidden 64, 16 features, batch 1024)."""
    ap.add_argument("--num-nodes", type=int, default=100000)
    ap.add_argument("--num-edges", type=int, default=1000000)
    ap.add_argument("--fanout", type=int, nargs="+", default=[10, 5])
    ap.add_argument("--hidden", type=int, default=64)
    ap.add_argument("--num-features", type=int, default=16)
    ap.add_argument("--batch-size", type=int, default=1024)


def record_and_write(folder, name: str, stem: str, argv, result: dict, markdown: Callable[[dict], str],
                     load_before) -> None:
    """Stamp ``result`` with the command, CPU, machine and load average before / now, then write it."""
    result.update(command=command(name, argv), cpu=cpu_model(), machine=machine(),
                  loadavg_before_after=[load_before, loadavg()])
    write_results(folder, stem, result, markdown)
