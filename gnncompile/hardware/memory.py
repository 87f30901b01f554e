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

The same wrapper holds a **block cache** (``choices['buffer_cache']``, :func:`enable_cache`): a
freed CPU allocation of at least :data:`DEFAULT_CACHE_MIN` bytes (256 KiB) is kept, up to a cap of idle
bytes (oldest evicted first), and handed out again for a later request of its size (or up to 1/8
smaller), already faulted in; a block unused for :data:`DEFAULT_MAX_IDLE_S` is given back. With huge pages alone a compiled training step at 100k nodes /
1M edges still faulted 3,000-4,000 times and spent 18-48 ms of system time a step zeroing and
mapping its fresh large tensors; a step's large tensors have the same sizes every step, so from
the second step on they come from the cache. The threshold is below a huge page because glibc
trims its heap's top after a step, so node-sized tensors of a few hundred KiB (small-graph
batches) were faulted in again every step as well. Memory enters the cache only when torch frees it
(its last storage is gone), so nothing a user or autograd holds is ever handed out twice; what a
cache hit returns holds old values, as ``torch.empty`` memory may (every kernel writes its
outputs first: results are bit for bit those without the cache). The cost is resident memory:
up to the cap stays mapped between steps (:func:`empty_cache` gives it back). On by default
('auto': the cap is :func:`default_cache_cap`), process-wide like the allocator, turned on by
:func:`gnncompile.compile` for a model on the CPU; ``'off'`` (or ``$GNNCOMPILE_BUFFER_CACHE=off``)
leaves it off, an int sets the cap in MiB. torch.profiler's memory report does not see a block the
cache hands out again (it counts the block as allocated until the cache gives it back): profile
memory inside :func:`cache_suspended`.
"""
from __future__ import annotations

import contextlib
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
#: the smallest allocation the block cache keeps. Below glibc's largest mmap threshold its free
#: lists serve allocations from the heap, but glibc gives the heap's top back to the kernel after a
#: step (its trim threshold follows the mmap threshold: twice the largest block freed), so the
#: node-sized tensors of a small-graph training step (a 3,300 x 64 float32 activation is 0.8 MiB)
#: were faulted in again step after step: 400-650 minor faults a step for GIN on molecule batches
#: of ~3.3k nodes (about 0.5 ms of a 6 ms step; benchmarks/results/small_steps_cache_s56a.md). From
#: 256 KiB up they come from the cache, already faulted in; smaller ones stay glibc's
DEFAULT_CACHE_MIN = 256 << 10
#: the 'auto' cap of the block cache: this share of the machine's memory, at most CACHE_CAP_MAX
CACHE_CAP_SHARE = 8
CACHE_CAP_MAX = 4 << 30
#: an idle block unused this long (seconds) is freed at the cache's next miss or free: longer than
#: a training step, so a step's blocks stay; a block no step asks for again (a size of the form the
#: speed guard dropped, a graph no longer trained on) does not stay up to the cap
DEFAULT_MAX_IDLE_S = 30.0


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
    """Put torch's CPU allocator back as it was (huge-page advice and the block cache off, the
    cache emptied); returns whether the wrapper was installed. Memory allocated meanwhile stays
    valid (it keeps its deleter)."""
    return bool(_binding().uninstall())


def status() -> Dict[str, Any]:
    """``{mode, installed, advise, threshold, advised_calls, advised_bytes, failures, last_error,
    cache_cap, cache_min_bytes, cache_held, cache_held_peak, cache_idle_blocks, cache_live_blocks,
    cache_hits, cache_misses, cache_evictions, cache_expired, cache_max_idle_s, cache_released}``: the kernel's THP mode, whether
    the wrapper is installed, whether it advises huge pages, and its counters (``cache_cap`` 0:
    the block cache is off; ``cache_held``: idle bytes kept now; ``cache_evictions`` /
    ``cache_expired``: idle blocks freed to stay under the cap / for being unused too long;
    ``cache_released``: blocks
    freed at once because the cache was off or they were larger than the cap). ``installed``
    and ``advise`` False and no counters when the extension is not loaded."""
    out: Dict[str, Any] = {"mode": thp_mode()}
    try:
        out.update(dict(_binding().state()))
    except HugePagesUnavailable as e:
        out.update(installed=False, advise=False, unavailable=str(e))
    return out


def apply(choice: str, devices) -> str:
    """What :func:`gnncompile.compile` does for ``choices['huge_pages']`` (``choice``) on a model
    whose parameters and buffers are on ``devices`` (device types): turns the wrapper on where
    it pays and can work. Returns one line for explain()."""
    if choice not in MODES:
        raise ValueError(f"gnncompile settings: choices['huge_pages'] must be one of {MODES}, got {choice!r}")
    if choice == "off":
        if _advising():
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


def _advising() -> bool:
    try:
        return bool(_binding().state()["advise"])
    except HugePagesUnavailable:
        return False


# ----------------------------------------------------------------------------- the block cache
def physical_memory() -> Optional[int]:
    """The machine's physical memory in bytes (sysconf), or None where it is not reported."""
    import os

    try:
        return int(os.sysconf("SC_PAGE_SIZE")) * int(os.sysconf("SC_PHYS_PAGES"))
    except (ValueError, OSError, AttributeError):
        return None


def default_cache_cap() -> int:
    """The 'auto' cap of the block cache in bytes: 1/CACHE_CAP_SHARE of the physical memory, at
    most CACHE_CAP_MAX (CACHE_CAP_MAX / CACHE_CAP_SHARE where the size is not reported)."""
    total = physical_memory()
    return min(CACHE_CAP_MAX, (total or CACHE_CAP_MAX) // CACHE_CAP_SHARE)


def cache_cap(choice: Any) -> int:
    """The cap in bytes that ``choices['buffer_cache']`` asks for: 0 for 'off', the default for
    'auto', an int n > 0 as n MiB; ValueError otherwise."""
    _config.buffer_cache_value("choices['buffer_cache']", choice, error=ValueError)
    if choice == "off":
        return 0
    if choice == "auto":
        return default_cache_cap()
    return int(choice) << 20


def enable_cache(cap: Optional[int] = None, min_bytes: int = DEFAULT_CACHE_MIN,
                 max_idle_s: float = DEFAULT_MAX_IDLE_S) -> bool:
    """Turn the block cache on (installing the wrapper; huge pages stay as they are): at most
    ``cap`` idle bytes (default :func:`default_cache_cap`; a smaller cap than before frees the
    oldest blocks now) of freed allocations of at least ``min_bytes`` (>= 4096) are kept for
    reuse, each for at most ``max_idle_s`` seconds unused (freed at the cache's next miss or
    free after that). Returns whether the wrapper is torch's CPU allocator now. Main thread, as
    :func:`enable`."""
    cap = default_cache_cap() if cap is None else cap
    for name, v in (("cap", cap), ("min_bytes", min_bytes)):
        if isinstance(v, bool) or not isinstance(v, int):
            raise TypeError(f"gnncompile.hardware.memory.enable_cache: {name} must be an int (bytes), got {v!r}")
    if cap <= 0:
        raise ValueError(f"gnncompile.hardware.memory.enable_cache: cap must be > 0 bytes, got {cap} "
                         "(disable_cache() turns the cache off)")
    if isinstance(max_idle_s, bool) or not isinstance(max_idle_s, (int, float)) or not 0 < max_idle_s <= 1e9:
        raise ValueError(f"gnncompile.hardware.memory.enable_cache: max_idle_s must be a number of seconds "
                         f"in (0, 1e9], got {max_idle_s!r}")
    return bool(_binding().set_cache(cap, min_bytes, float(max_idle_s)))


def disable_cache() -> None:
    """Turn the block cache off and give its idle blocks back (blocks in use are freed when torch
    frees them). Huge-page advice stays as it is."""
    b = _binding()
    b.set_cache(0, max(int(b.state()["cache_min_bytes"]), 4096))


@contextlib.contextmanager
def cache_suspended():
    """Context manager: the block cache off inside (its idle blocks given back), then on again
    with the cap, minimum block size and idle limit it had. torch.profiler's memory report
    (``profile_memory=True``) sees only what torch's own CPU allocator allocates and frees, and a
    block the cache hands out again passes neither; profile memory inside this block to see every
    allocation. A no-op where the cache is off or the extension is not loaded."""
    try:
        b = _binding()
        st = b.state()
    except HugePagesUnavailable:
        st = None
    if not st or not st["cache_cap"]:
        yield
        return
    disable_cache()
    try:
        yield
    finally:
        b.set_cache(int(st["cache_cap"]), int(st["cache_min_bytes"]), float(st["cache_max_idle_s"]))


def empty_cache() -> int:
    """Give the block cache's idle blocks back to the allocator (the cache stays on); returns
    the bytes given back. 0 without the extension."""
    try:
        return int(_binding().trim(0))
    except HugePagesUnavailable:
        return 0


def _size(n: int) -> str:
    """``n`` bytes in words: whole MiB as MiB, else KiB (the explain() line of the cache)."""
    return f"{n >> 20} MiB" if n >= (1 << 20) and not n % (1 << 20) else f"{n >> 10} KiB"


def apply_cache(choice: Any, devices) -> str:
    """What :func:`gnncompile.compile` does for ``choices['buffer_cache']`` on a model whose
    parameters and buffers are on ``devices``: turns the block cache on (or sets its cap) for a
    CPU model unless 'off'. Returns one line for explain()."""
    cap = cache_cap(choice)
    if cap == 0:
        try:
            st = _binding().state()
        except HugePagesUnavailable:
            return "off"
        if st["cache_cap"]:
            return (f"off for this model, yet on in this process (another model turned it on, cap "
                    f"{st['cache_cap'] >> 20} MiB; gnncompile.hardware.memory.disable_cache() turns it off)")
        return "off"
    if devices and "cpu" not in devices:
        return f"{choice}: not used (the model is not on the CPU)"
    try:
        on = enable_cache(cap)
    except HugePagesUnavailable as e:
        return f"{choice}: not available ({e})"
    if not on:
        return f"{choice}: not used (another CPU allocator of a higher priority is registered)"
    st = _binding().state()
    return (f"on (freed CPU allocations of >= {_size(st['cache_min_bytes'])} kept for reuse, at most "
            f"{st['cache_cap'] >> 20} MiB idle{'' if choice == 'auto' else ', set by the settings'})")


__all__ = ["enable", "disable", "status", "thp_mode", "apply", "HugePagesUnavailable", "DEFAULT_THRESHOLD",
           "MODES", "enable_cache", "disable_cache", "cache_suspended", "empty_cache", "apply_cache", "cache_cap", "default_cache_cap",
           "physical_memory", "DEFAULT_CACHE_MIN"]
