"""What hardware gnncompile runs on: a short description and a stable key."""
from __future__ import annotations

import os
import platform
from functools import lru_cache

import torch

_ISA_FLAGS = ("amx_tile", "avx512_bf16", "avx512f", "avx2", "fma", "f16c", "asimd", "sve")


@lru_cache(maxsize=1)
def _cpu_model_and_flags():
    model, flags = platform.processor() or platform.machine(), set()
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                key, _, val = line.partition(":")
                key = key.strip()
                if key == "model name" and model in ("", platform.machine(), platform.processor()):
                    model = val.strip()
                elif key in ("flags", "Features") and not flags:
                    flags = set(val.split())
    except OSError:
        pass
    return model, flags


def cpu_isa() -> list:
    """The vector ISA extensions this CPU reports, widest first."""
    _, flags = _cpu_model_and_flags()
    return [f for f in _ISA_FLAGS if f in flags]


def describe(device: torch.device | str | None = None) -> str:
    """A one-line description of the device, e.g. 'cpu: AMD EPYC, 2 threads, avx512f'."""
    dev = torch.device(device) if device is not None else (
        torch.device("cuda") if torch.cuda.is_available() else torch.device("cpu"))
    if dev.type == "cuda":
        p = torch.cuda.get_device_properties(dev)
        return f"cuda: {p.name}, sm_{p.major}{p.minor}, {p.multi_processor_count} SMs"
    model, _ = _cpu_model_and_flags()
    isa = cpu_isa()
    return f"cpu: {model}, {torch.get_num_threads()} threads of {os.cpu_count()}, {isa[0] if isa else 'scalar'}"
