"""What hardware gnncompile runs on: properties, a stable key, and default settings.

:func:`detect` describes a device as a plain dict (JSON-ready):

* CPU: ``model``, ``logical_cpus`` (CPUs this process may run on), ``physical_cores`` (when
  ``/proc/cpuinfo`` tells), ``threads`` (``torch.get_num_threads()``, the threads in use),
  ``isa`` (vector extensions, widest first: amx_tile, avx512_bf16, avx512f, avx2, fma, f16c,
  asimd, sve), ``vector_bits`` (512, 256, 128 or 64), ``l2_bytes`` / ``l3_bytes`` when sysfs
  tells.
* CUDA: ``name``, ``capability`` ``[major, minor]``, ``sm_count``, ``memory_bytes``,
  ``l2_bytes``, ``max_threads_per_sm``.

:func:`device_key` turns that into a stable, file-name-safe key that names the hardware, not
the moment: the threads in use are a *setting* (tuned and stored in the profile), so they are
not part of the key; the logical CPU count is (a container limited to 2 CPUs is another machine
than the same host with 64).

:func:`default_settings` is the rule for a device that has no profile (see its docstring).
"""
from __future__ import annotations

import os
import platform
import re
from functools import lru_cache
from typing import Any, Dict, Optional

import torch

_ISA_FLAGS = ("amx_tile", "avx512_bf16", "avx512f", "avx2", "fma", "f16c", "asimd", "sve")
_VECTOR_BITS = {"amx_tile": 512, "avx512_bf16": 512, "avx512f": 512, "avx2": 256, "fma": 256,
                "f16c": 128, "asimd": 128, "sve": 128}


@lru_cache(maxsize=1)
def _cpu_model_and_flags():
    model, flags = platform.processor() or platform.machine(), set()
    physical = set()
    phys_id, core_id = None, None
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                key, _, val = line.partition(":")
                key = key.strip()
                if key == "model name" and model in ("", platform.machine(), platform.processor()):
                    model = val.strip()
                elif key in ("flags", "Features") and not flags:
                    flags = set(val.split())
                elif key == "physical id":
                    phys_id = val.strip()
                elif key == "core id":
                    core_id = val.strip()
                    physical.add((phys_id, core_id))
    except OSError:
        pass
    return model, flags, len(physical)


def cpu_isa() -> list:
    """The vector ISA extensions this CPU reports, widest first."""
    _, flags, _ = _cpu_model_and_flags()
    return [f for f in _ISA_FLAGS if f in flags]


def _logical_cpus() -> int:
    try:
        return len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        return os.cpu_count() or 1


def _cache_bytes(level: int) -> int:
    """Size of the level-``level`` cache seen by CPU 0 (sysfs), 0 when unknown."""
    base = "/sys/devices/system/cpu/cpu0/cache"
    try:
        for d in sorted(os.listdir(base)):
            p = os.path.join(base, d)
            with open(os.path.join(p, "level")) as f:
                if int(f.read()) != level:
                    continue
            with open(os.path.join(p, "type")) as f:
                if f.read().strip() == "Instruction":
                    continue
            with open(os.path.join(p, "size")) as f:
                s = f.read().strip().upper()
            m = re.fullmatch(r"(\d+)([KMG]?)", s)
            if m:
                return int(m.group(1)) * {"": 1, "K": 1 << 10, "M": 1 << 20, "G": 1 << 30}[m.group(2)]
    except (OSError, ValueError):
        pass
    return 0


def _resolve(device) -> torch.device:
    if device is None:
        return torch.device("cuda") if torch.cuda.is_available() else torch.device("cpu")
    dev = torch.device(device)
    if dev.type == "cuda" and dev.index is None:
        dev = torch.device("cuda", torch.cuda.current_device())
    return dev


def detect(device: torch.device | str | None = None) -> Dict[str, Any]:
    """The properties of ``device`` (default: the first CUDA device if any, else the CPU)."""
    dev = _resolve(device)
    if dev.type == "cuda":
        p = torch.cuda.get_device_properties(dev)
        return {
            "type": "cuda",
            "name": p.name,
            "capability": [int(p.major), int(p.minor)],
            "sm_count": int(p.multi_processor_count),
            "memory_bytes": int(p.total_memory),
            "l2_bytes": int(getattr(p, "L2_cache_size", 0) or 0),
            "max_threads_per_sm": int(getattr(p, "max_threads_per_multi_processor", 0) or 0),
            "host_logical_cpus": _logical_cpus(),
        }
    if dev.type != "cpu":
        raise ValueError(f"gnncompile.hardware.detect: unsupported device type {dev.type!r}")
    model, _, physical = _cpu_model_and_flags()
    isa = cpu_isa()
    logical = _logical_cpus()
    return {
        "type": "cpu",
        "model": model,
        "machine": platform.machine(),
        "logical_cpus": logical,
        "physical_cores": min(physical, logical) if physical else logical,
        "threads": torch.get_num_threads(),
        "isa": isa,
        "vector_bits": max((_VECTOR_BITS[f] for f in isa), default=64),
        "l2_bytes": _cache_bytes(2),
        "l3_bytes": _cache_bytes(3),
    }


def _slug(s: str, limit: int = 48) -> str:
    s = re.sub(r"\((r|tm|c)\)", "", s.lower())
    s = re.sub(r"\b(cpu|processor|with|radeon graphics|nvidia|corporation)\b", "", s)
    s = re.sub(r"[^a-z0-9]+", "-", s).strip("-")
    return s[:limit].strip("-") or "unknown"


def _size_tag(n: int) -> str:
    """A cache size for a key: '512k', '16m', '1p5m' (1.5 MiB)."""
    if n >= 1 << 20:
        mib = n / (1 << 20)
        return f"{mib:g}m".replace(".", "p")
    return f"{max(1, n >> 10)}k"


def device_key(props: Optional[Dict[str, Any]] = None) -> str:
    """A stable, file-name-safe key for a device, from :func:`detect`'s properties.

    ``cpu-<model>-<logical cpus>c-<widest isa>[-l2-<size>][-l3-<size>]`` (the caches where the
    properties know them, e.g. ``cpu-amd-epyc-2c-avx2-l2-512k-l3-16m``) or
    ``cuda-<name>-sm<cc>-<SMs>sm-<GiB>g``.

    The caches are part of a CPU's key because a virtual machine's model name often hides the
    generation: two AMD EPYC generations both read "AMD EPYC", with the same core count and ISA,
    and differ in their caches, which is what the gather-reduce kernels' best settings follow
    (a profile, or a portfolio measurement, tuned on one is not the other's own; it can still be
    lent through a checked transfer, :mod:`gnncompile.hardware.classes`).
    """
    p = detect() if props is None else props
    if p.get("type") == "cuda":
        cc = p.get("capability", [0, 0])
        gib = int(round(p.get("memory_bytes", 0) / (1 << 30)))
        return f"cuda-{_slug(p.get('name', ''))}-sm{cc[0]}{cc[1]}-{p.get('sm_count', 0)}sm-{gib}g"
    isa = p.get("isa") or ["scalar"]
    key = f"cpu-{_slug(p.get('model', ''))}-{p.get('logical_cpus', 0)}c-{isa[0].replace('_', '')}"
    for level in (2, 3):
        size = p.get(f"l{level}_bytes")
        if isinstance(size, int) and not isinstance(size, bool) and size > 0:
            key += f"-l{level}-{_size_tag(size)}"
    return key


def describe(device: torch.device | str | None = None) -> str:
    """A one-line description of the device, e.g. 'cpu: AMD EPYC, 2 threads, avx512f'."""
    p = detect(device)
    if p["type"] == "cuda":
        cc = p["capability"]
        return f"cuda: {p['name']}, sm_{cc[0]}{cc[1]}, {p['sm_count']} SMs"
    isa = p["isa"]
    return f"cpu: {p['model']}, {p['threads']} threads of {p['logical_cpus']}, {isa[0] if isa else 'scalar'}"


# --------------------------------------------------------------------------- default rule
def default_settings(props: Optional[Dict[str, Any]] = None) -> Dict[str, Any]:
    """Settings for a device that has no profile: a small cost model over its properties.

    CPU (``knobs = [chunks_per_thread]``; ``prefetch_distance``, the second CPU knob, keeps the
    kernels' default: 4 edges ahead, 32 for the spmm's rows under 512 bytes, e.g. F < 128 float32:
    benchmarks/results/HISTORY.md, sections 21 and 25; the third, the spmm's column-block budget,
    keeps the kernels' default, no blocking: blocks sized from the detected L3 were slower at
    every point measured on a 2-core Zen 2, HISTORY section 27, and again on a 2-core Zen 4
    (family 25 model 17, L3 32 MiB) at 100k nodes / F 128, 64- and 32-wide blocks 0.74-0.90x,
    also with each block first copied into a packed scratch; the tuner searches it):

    * ``threads`` = physical cores (hyper-threads share the vector units the gather-reduce
      kernels saturate, so a second thread per core mostly adds contention).
    * ``chunks_per_thread``: rows are cut into chunks of equal cost; more chunks balance
      power-law hubs better, each costs one binary search and one scheduling step. With T
      threads, the imbalance of the slowest thread is about 1 / chunks; the rule keeps
      ``threads * chunks`` near 32 scheduling units: ``clamp(32 // threads, 2, 8)`` (8 on 1-4
      threads, 4 on 8, 2 from 16 up).
    * loader: collation of a mini-batch is Python-bound and competes with the training step for
      the same cores, so ``num_workers`` = 0 below 4 cores, else ``min(4, cores // 4)`` (one
      worker per four cores keeps three for compute); ``pool_size`` = ``num_workers + 2``
      (one batch in use, one ready, one per worker being filled); no pinned memory.

    CUDA (``knobs = [lanes_per_row, rows_per_block, vec_width, items_per_group]``):

    * ``knobs`` all 0: the kernels apply their launch rule (native/cuda/knobs.h, readable through
      :mod:`gnncompile.hardware.cuda_knobs`) at launch (it needs the feature width and the graph
      size, which are known only then).
    * loader: ``num_workers`` = ``min(8, host cpus // 2)``, ``pool_size`` = ``num_workers + 2``,
      ``pin_memory`` on (the side-stream copy overlaps compute only from pinned memory),
      ``persistent_workers`` when there are workers.

    ``batch_size`` is a workload setting and is not chosen here (None); so is ``inner``, the
    compiler for the graph around the fused ops (None: 'auto', chosen per graph piece by
    :func:`gnncompile.compiler.backend.choose_inner`), which depends on the graph sizes more than on the device (a tuning run measures it).
    """
    p = detect() if props is None else props
    if p.get("type") == "cuda":
        workers = min(8, max(int(p.get("host_logical_cpus", 2)) // 2, 0))
        return {"threads": None, "knobs": [0, 0, 0, 0], "batch_size": None,
                "num_workers": workers, "pool_size": workers + 2, "pin_memory": True,
                "persistent_workers": workers > 0, "inner": None}
    cores = max(int(p.get("physical_cores") or p.get("logical_cpus") or 1), 1)
    chunks = max(2, min(8, 32 // cores))
    workers = 0 if cores < 4 else min(4, cores // 4)
    return {"threads": cores, "knobs": [chunks], "batch_size": None, "num_workers": workers,
            "pool_size": workers + 2, "pin_memory": False, "persistent_workers": workers > 0,
            "inner": None}


__all__ = ["detect", "device_key", "describe", "cpu_isa", "default_settings"]
