"""Work Dynamo does on a first compile that changes neither the graph, the guards nor any result:
skipped while a gnncompile-compiled call compiles.

Taken apart on molecule batches (benchmarks/first_epoch.py, results/first_epoch_s57*.md),
three parts of Dynamo's first compile in a process compute nothing the compiled model, its
guards or its graph depend on:

* ``local_map``'s check (``LocalMapWrappedHigherOrderVariable.should_wrap_in_hop``): Dynamo
  asks it of every callable it wraps, and it imports
  ``torch.distributed.tensor.experimental._func_map`` to compare the callable with that
  module's ``_local_map_wrapped`` by identity. The import pulls in DTensor's experimental
  package and its context-parallel custom ops (50-100 ms on this project's CPU, once a
  process, much of it an ``inspect.getmodule`` scan of every loaded module made by a
  ``register_fake``), and its objects count towards the next full garbage collection. A
  function defined in a module that was never imported cannot be that module's function: while
  the module is not in ``sys.modules`` the answer is False without the import. Once anything
  has imported it, Dynamo's own check runs.
* the log header of every traced call (``get_funcname`` in
  ``InstructionTranslator.get_line_of_code_header``): Dynamo tokenizes each traced source file
  to name the function around a line (35-50 ms a process, HISTORY section 38) for a string that only its
  ``trace_call`` / ``trace_source`` debug logs print. While none of those loggers is enabled
  for DEBUG the name is not looked up (the header, unprinted, lacks it).
* the guard latency metric (``profile_guard_manager`` after building guards): runs the new
  guards once after flushing the CPU caches (about 20 ms) for a number in Dynamo's
  compilation metrics and its ``guards`` debug log. While that log is not enabled for DEBUG
  the metric reads 0. The check that the guards pass on the frame they were built for (a
  consistency check of Dynamo's) still runs.

Each trim is active only while a gnncompile scope is (:class:`gnncompile.compiler.lean.scope`,
entered by every gnncompile-compiled call and ``explain``): ``torch.compile`` with another
backend, or gnncompile's backend named in ``torch.compile`` by hand, gets Dynamo as is. Each is
a wrapper around the private function it replaces, installed once; where this torch lacks one
of them, that trim is not installed (:data:`INSTALLED` lists the ones that are). ``ENABLED[0] =
False`` turns them all off (the ``gnncompile-notrim`` variant of ``python -m benchmarks
first_epoch``).
"""
from __future__ import annotations

import logging
import sys
from typing import List

from .._log import get_logger
from .lean import _local

_log = get_logger(__name__)

#: set False to trace exactly as Dynamo does (for measurement)
ENABLED = [True]
#: the trims this torch allowed (names: 'local_map_import', 'funcname', 'guard_latency')
INSTALLED: List[str] = []

_FUNC_MAP = "torch.distributed.tensor.experimental._func_map"
_ORIG: dict = {}  # trim -> the function it wraps, where the wrapper looks it up at each call


def active() -> bool:
    """True while a gnncompile scope is active in this thread and trims are enabled."""
    return ENABLED[0] and getattr(_local, "active", False)


def _debug(*loggers) -> bool:
    return any(lg.isEnabledFor(logging.DEBUG) for lg in loggers)


def _install_local_map() -> None:
    from torch._dynamo.variables import higher_order_ops as H

    cls = H.LocalMapWrappedHigherOrderVariable
    orig = cls.__dict__["should_wrap_in_hop"]
    if not isinstance(orig, classmethod):
        raise TypeError("should_wrap_in_hop is not a classmethod")
    fn = orig.__func__

    def should_wrap_in_hop(klass, value):
        # (the comparison is by identity with a function of _FUNC_MAP: no such function
        # exists while that module was never imported)
        if _FUNC_MAP not in sys.modules and active():
            return False
        return fn(klass, value)

    should_wrap_in_hop.__wrapped__ = fn
    cls.should_wrap_in_hop = classmethod(should_wrap_in_hop)
    INSTALLED.append("local_map_import")


def _install_funcname() -> None:
    from torch._dynamo import output_graph as OG, symbolic_convert as SC

    orig = SC.get_funcname
    loggers = tuple(lg for lg in (getattr(SC, "trace_call_log", None), getattr(SC, "trace_source_log", None),
                                  getattr(OG, "trace_call_log", None)) if lg is not None)
    if len(loggers) != 3:
        raise AttributeError("Dynamo's trace_call / trace_source loggers not found")

    def get_funcname(filename, lineno):
        if active() and not _debug(*loggers):
            return None
        return orig(filename, lineno)

    get_funcname.__wrapped__ = orig
    SC.get_funcname = get_funcname
    INSTALLED.append("funcname")


def _install_guard_latency() -> None:
    from torch._dynamo import guards as G

    orig = _ORIG["guard_latency"] = G.profile_guard_manager
    log = getattr(G, "guards_log", None)
    if log is None:
        raise AttributeError("Dynamo's guards log not found")

    def profile_guard_manager(*args, **kwargs):
        if active() and not log.isEnabledFor(logging.DEBUG):
            return 0.0
        return _ORIG["guard_latency"](*args, **kwargs)

    profile_guard_manager.__wrapped__ = orig
    G.profile_guard_manager = profile_guard_manager
    INSTALLED.append("guard_latency")


def install() -> None:
    """Installs the trims this torch allows (once per process)."""
    if getattr(install, "done", False):
        return
    install.done = True
    for name, fn in (("local_map_import", _install_local_map), ("funcname", _install_funcname),
                     ("guard_latency", _install_guard_latency)):
        try:
            fn()
        except Exception as e:  # pragma: no cover - another torch's internals
            _log.info("compile trim %s unavailable in this torch (%s: %s)", name, type(e).__name__, e)


__all__ = ["ENABLED", "INSTALLED", "active", "install"]
