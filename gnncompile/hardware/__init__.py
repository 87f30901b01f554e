"""The hardware gnncompile runs on: detection and the defaults derived from it.

* :mod:`.device`: device detection (:func:`detect`), a stable device key, and the default
  settings of a device that has no profile (:func:`default_settings`).
* :mod:`.classes`: device classes and the distance between two devices
  (:func:`class_distance`), which picks the profile a never-tuned device starts from.
* :mod:`.cuda_knobs`: the CUDA kernels' launch knobs and their default rule, read from the
  native extension (the rule lives in ``native/cuda/knobs.h``; every build binds it, so it
  needs no GPU).
* :mod:`.memory`: transparent huge pages for torch's large CPU allocations (the setting
  ``choices['huge_pages']``; the allocator wrapper lives in ``native/common/huge_pages.cpp``).

The settings a tuning run chose for a device (device profiles) are data, in
:mod:`gnncompile.profiles`; what a compiled model runs with is :mod:`gnncompile.settings`.
"""
from __future__ import annotations

from . import cuda_knobs, memory  # noqa: F401
from . import classes  # noqa: F401
from .classes import class_distance
from .device import cpu_isa, default_settings, describe, detect, device_key

__all__ = ["detect", "device_key", "describe", "cpu_isa", "default_settings", "class_distance", "classes",
           "cuda_knobs", "memory"]
