"""The hardware gnncompile runs on and the settings chosen for it.

* :mod:`.device`: device detection (:func:`detect`), a stable device key, and the default
  settings of a device that has no profile (:func:`default_settings`).
* :mod:`.profiles`: device profiles (the settings a tuning run chose), read, validated,
  written atomically, and resolved by :func:`gnncompile.compile`.
* :mod:`.cuda_knobs`: the CUDA kernels' launch knobs and their default rule, read from the
  native extension (the rule lives in ``native/cuda/knobs.h``; every build binds it, so it
  needs no GPU).
"""
from __future__ import annotations

from . import cuda_knobs, profiles  # noqa: F401
from .device import cpu_isa, default_settings, describe, detect, device_key

__all__ = ["detect", "device_key", "describe", "cpu_isa", "default_settings", "profiles", "cuda_knobs"]
