"""Transparent huge pages for torch's large CPU allocations (``choices['huge_pages']``).

A training step on a large graph allocates tensors above glibc's mmap threshold (at most 32 MB
on 64-bit Linux) on every step: each is a fresh mapping, faulted in 4 KB at a time and unmapped
when freed, so the same memory is faulted in again on the next step. With the kernel's
transparent huge pages in ``madvise`` mode (``/sys/kernel/mm/transparent_hugepage/enabled``), memory marked
``MADV_HUGEPAGE`` is faulted in 2 MB at a time instead. :func:`enable` wraps torch's CPU
allocator (``native/common/huge_pages.cpp``) so that the whole 2 MB pages inside every
allocation of at least ``threshold`` bytes are so marked; the allocations themselves stay
torch's (same pointers, deleters and profiler records), and nothing outside them is marked, so
the resident size does not grow.

This is process-wide, as the allocator is: :func:`gnncompile.compile` turns it on for a model
compiled with ``choices['huge_pages'] = 'auto'`` (the default; ``$GNNCOMPILE_HUGE_PAGES=off``
or ``settings={'choices': {'huge_pages': 'off'}}`` leave the allocator alone) when the CPU is
one of the model's devices and the kernel's mode is ``madvise``. In ``always`` mode the kernel
already does it and in ``never`` mode it cannot: nothing is installed, and :func:`status` says
so. A model compiled with 'off' does not turn off what another model turned on: :func:`disable`
does. torch's own ``THP_MEM_ALLOC_ENABLE=1``, set before torch is imported, has the same effect
for every allocation of at least 2 MB.
"""
from __future__ import annotations

from pathlib import Path
from typing import Any, Dict, Optional

from .. import config as _config
from .._log import get_logger
from ..ops import _native

_log = get_logger(__name__)

#: where Linux reports its transparent huge page mode
THP_ENABLED = Path("/sys/kernel/mm/transparent_hugepage/enabled")
#: the default threshold: c10's own for THP_MEM_ALLOC_ENABLE (one huge page)
DEFAULT_THRESHOLD = 2 << 20
MODES = _config.HUGE_PAGE_MODES  # the setting's values, defined with its variable


class HugePagesUnavailable(RuntimeError):
    """The native extension that holds the allocator wrapper is not loaded."""


def thp_mode(path: Path = THP_ENABLED) -> Optional[str]:
    """The kernel's transparent huge page mode ('always', 'madvise' or 'never'), or None where
    it is not reported (not Linux, or a kernel without THP)."""
    try:
        text = path.read_text()
    except OSError:
        return None
    for word in text.split():
        if word.startswith("[") and word.endswith("]"):
            return word[1:-1]
    return None


def _binding():
    if _native._C is None:
        raise HugePagesUnavailable("huge pages for torch's CPU allocations come with the native extension "
                                   f"gnncompile._C, which is not loaded ({_native.LOAD_ERROR})")
    h = getattr(_native._C, "huge_pages", None)
    if h is None:
        raise HugePagesUnavailable(f"the loaded extension {getattr(_native._C, '__file__', 'gnncompile._C')} "
                                   "predates huge pages; rebuild it (`make install`)")
    return h


def enable(threshold: int = DEFAULT_THRESHOLD) -> bool:
    """Wrap torch's CPU allocator so that allocations of at least ``threshold`` bytes (an int
    >= 2 MiB) are marked for huge pages; on an installed wrapper, set its threshold. Returns
    whether the wrapper is torch's CPU allocator now (False: another allocator of a higher
    priority holds the place and is left alone). Call it from the main thread before other
    threads allocate (torch's allocator registry is not synchronised)."""
    if isinstance(threshold, bool) or not isinstance(threshold, int):
        raise TypeError(f"gnncompile.hardware.memory.enable: threshold must be an int, got {threshold!r}")
    return bool(_binding().install(threshold))


def disable() -> bool:
    """Put torch's CPU allocator back as it was; returns whether the wrapper was installed.
    Memory allocated meanwhile stays valid (it is the wrapped allocator's)."""
    return bool(_binding().uninstall())


def status() -> Dict[str, Any]:
    """``{mode, installed, threshold, advised_calls, advised_bytes, failures, last_error}``:
    the kernel's THP mode and the wrapper's counters (``installed`` False and no counters when
    the extension is not loaded)."""
    out: Dict[str, Any] = {"mode": thp_mode()}
    try:
        out.update(dict(_binding().state()))
    except HugePagesUnavailable as e:
        out.update(installed=False, unavailable=str(e))
    return out


def apply(choice: str, devices) -> str:
    """What :func:`gnncompile.compile` does for ``choices['huge_pages']`` (``choice``) on a model
    whose parameters and buffers are on ``devices`` (device types): turns the wrapper on where
    it pays and can work. Returns one line for explain()."""
    if choice not in MODES:
        raise ValueError(f"gnncompile settings: choices['huge_pages'] must be one of {MODES}, got {choice!r}")
    if choice == "off":
        if _installed():
            return ("off for this model, yet on in this process (another model turned it on; "
                    "gnncompile.hardware.memory.disable() turns it off)")
        return "off (torch's CPU allocator as it is)"
    if devices and "cpu" not in devices:
        return "auto: not used (the model is not on the CPU)"
    mode = thp_mode()
    if mode == "always":
        return "auto: the kernel's transparent huge pages are 'always' on; nothing to do"
    if mode != "madvise":
        return f"auto: not available (transparent huge pages {mode or 'not reported by this system'})"
    try:
        on = enable()
    except HugePagesUnavailable as e:
        return f"auto: not available ({e})"
    if not on:
        return "auto: not used (another CPU allocator of a higher priority is registered)"
    _log.debug("huge pages: torch's CPU allocations of >= %d bytes are marked MADV_HUGEPAGE", DEFAULT_THRESHOLD)
    return f"on (CPU allocations of >= {_binding().state()['threshold'] >> 20} MiB marked MADV_HUGEPAGE)"


def _installed() -> bool:
    try:
        return bool(_binding().state()["installed"])
    except HugePagesUnavailable:
        return False


__all__ = ["enable", "disable", "status", "thp_mode", "apply", "HugePagesUnavailable", "DEFAULT_THRESHOLD",
           "MODES"]
