"""Device classes: how far apart two devices are, for lending one device's profile to another.

A device that was never tuned may start from the profile of the nearest tuned device
(:func:`gnncompile.profiles.find`, section "Transfer" of docs/guides/tuning.md). "Nearest" is
:func:`class_distance` over :func:`gnncompile.hardware.detect`'s properties. The rule:

* Only a CPU to a CPU and a CUDA device to a CUDA device: any other pair is ``None`` (never
  transferred; the knob layouts differ, and what a GPU profile tunes is not what a CPU one does).
* CPU, a weighted sum, the heaviest term first:

  - ISA class (the widest vector ISA, :func:`isa_class`): ``avx512`` (avx512f, avx512_bf16,
    amx_tile), ``avx2`` (avx2, fma), ``sse`` (an x86 CPU with neither), ``neon-sve`` (asimd,
    sve), ``scalar`` (nothing known). :data:`ISA_STEP` (100) per step along
    avx512 - avx2 - sse, and 4 steps between an x86 class and an ARM / unknown one: the kernels'
    inner loops are compiled for the vector width, so their best chunking follows it first.
  - cache class: :data:`L2_WEIGHT` (10) per doubling of the L2 per core, :data:`L3_WEIGHT` (5)
    per doubling of the L3 (``l2_bytes`` / ``l3_bytes``; a size one side does not know counts
    :data:`UNKNOWN_CACHE`, 10): the gather-reduce kernels are bound by where the rows live.
  - vendor (amd, intel, arm, ... from the model name): :data:`VENDOR_WEIGHT` (20) when they
    differ (prefetchers and SMT policy differ by vendor).
  - core count: :data:`CORE_WEIGHT` (10) per doubling of the physical cores (the thread and
    worker counts are rescaled on the way, see :func:`gnncompile.profiles.adapt_settings`).

* CUDA: :data:`CC_MAJOR_WEIGHT` (1000) per step of compute-capability major (another
  architecture: another memory system, other launch limits), then :data:`CC_MINOR_WEIGHT`
  (100) per step of minor, then :data:`SM_WEIGHT` (10) per doubling of the SM count and
  :data:`MEMORY_WEIGHT` (5) per doubling of the memory.

So another ISA class outweighs any vendor, and caches and cores differing by less than
ISA_STEP together (e.g. 4x the cores and 4x the L3: 30); another compute-capability major
outweighs everything else of a GPU but a 1024x gap in SMs. Two devices with the same
properties are 0 apart.
"""
from __future__ import annotations

import math
from typing import Any, Dict, Mapping, Optional

ISA_CLASSES = ("avx512", "avx2", "sse", "neon-sve", "scalar")
#: position of each x86 ISA class on one line (distance = steps * ISA_STEP)
_X86_ORDER = {"avx512": 0, "avx2": 1, "sse": 2}
ISA_STEP = 100.0
#: steps between an x86 class and an ARM (or unknown) one
OTHER_ARCH_STEPS = 4
L2_WEIGHT = 10.0
L3_WEIGHT = 5.0
UNKNOWN_CACHE = 10.0
VENDOR_WEIGHT = 20.0
CORE_WEIGHT = 10.0
CC_MAJOR_WEIGHT = 1000.0
CC_MINOR_WEIGHT = 100.0
SM_WEIGHT = 10.0
MEMORY_WEIGHT = 5.0

_X86_MACHINES = ("x86_64", "amd64", "i386", "i686", "x86")


def isa_class(props: Mapping[str, Any]) -> str:
    """The ISA class of a CPU's properties (see the module docstring)."""
    isa = [str(f) for f in (props.get("isa") or [])]
    if any(f.startswith("avx512") or f.startswith("amx") for f in isa):
        return "avx512"
    if "avx2" in isa or "fma" in isa:
        return "avx2"
    if "asimd" in isa or "sve" in isa:
        return "neon-sve"
    machine = str(props.get("machine") or "").lower()
    if machine in _X86_MACHINES or "f16c" in isa:
        return "sse"
    if machine in ("aarch64", "arm64"):
        return "neon-sve"
    return "scalar"


def vendor(props: Mapping[str, Any]) -> str:
    """The CPU vendor from the model name: 'amd', 'intel', 'arm' (ARM designs and their
    licensees' names that say so), else the model's first word, lower case ('' when unknown)."""
    model = str(props.get("model") or "").lower()
    for v, words in (("amd", ("amd", "epyc", "ryzen", "threadripper")), ("intel", ("intel", "xeon")),
                     ("arm", ("neoverse", "cortex", "graviton", "ampere", "arm"))):
        if any(w in model for w in words):
            return v
    return model.split()[0] if model.split() else ""


def _cores(props: Mapping[str, Any]) -> int:
    for k in ("physical_cores", "logical_cpus"):
        v = props.get(k)
        if isinstance(v, int) and not isinstance(v, bool) and v >= 1:
            return v
    return 1


def _log2_gap(a: Any, b: Any, weight: float, unknown: float = 0.0) -> float:
    ok_a = isinstance(a, (int, float)) and not isinstance(a, bool) and a > 0
    ok_b = isinstance(b, (int, float)) and not isinstance(b, bool) and b > 0
    if ok_a and ok_b:
        return weight * abs(math.log2(a) - math.log2(b))
    return 0.0 if (not ok_a and not ok_b) else unknown


def device_class(props: Mapping[str, Any]) -> Dict[str, Any]:
    """The properties the distance reads, as one dict (for explanations and records)."""
    if props.get("type") == "cuda":
        cc = list(props.get("capability") or [0, 0])
        return {"type": "cuda", "capability": cc, "sm_count": props.get("sm_count"),
                "memory_bytes": props.get("memory_bytes")}
    return {"type": "cpu", "isa_class": isa_class(props), "vendor": vendor(props), "cores": _cores(props),
            "l2_bytes": props.get("l2_bytes") or 0, "l3_bytes": props.get("l3_bytes") or 0}


def _isa_gap(a: str, b: str) -> float:
    if a == b:
        return 0.0
    if a in _X86_ORDER and b in _X86_ORDER:
        return ISA_STEP * abs(_X86_ORDER[a] - _X86_ORDER[b])
    return ISA_STEP * OTHER_ARCH_STEPS


def class_distance(a: Mapping[str, Any], b: Mapping[str, Any]) -> Optional[float]:
    """How far device ``b`` is from device ``a`` (properties as :func:`detect` gives them;
    symmetric, >= 0), or None when a profile of one must never be used on the other (another
    device type). The rule is the module docstring's."""
    ta, tb = a.get("type", "cpu"), b.get("type", "cpu")
    if ta != tb or ta not in ("cpu", "cuda"):
        return None
    if ta == "cuda":
        ca, cb = list(a.get("capability") or [0, 0]), list(b.get("capability") or [0, 0])
        try:
            major, minor = abs(int(ca[0]) - int(cb[0])), abs(int(ca[1]) - int(cb[1]))
        except (TypeError, ValueError, IndexError):
            return None
        return (CC_MAJOR_WEIGHT * major + CC_MINOR_WEIGHT * minor
                + _log2_gap(a.get("sm_count"), b.get("sm_count"), SM_WEIGHT, SM_WEIGHT)
                + _log2_gap(a.get("memory_bytes"), b.get("memory_bytes"), MEMORY_WEIGHT, MEMORY_WEIGHT))
    d = _isa_gap(isa_class(a), isa_class(b))
    d += _log2_gap(a.get("l2_bytes"), b.get("l2_bytes"), L2_WEIGHT, UNKNOWN_CACHE)
    d += _log2_gap(a.get("l3_bytes"), b.get("l3_bytes"), L3_WEIGHT, UNKNOWN_CACHE)
    if vendor(a) != vendor(b):
        d += VENDOR_WEIGHT
    d += CORE_WEIGHT * abs(math.log2(_cores(a)) - math.log2(_cores(b)))
    return d


__all__ = ["class_distance", "device_class", "isa_class", "vendor", "ISA_CLASSES"]
