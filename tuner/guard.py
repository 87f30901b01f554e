"""What watches a tuning run while it measures: Ctrl-C, the ``timeout``, torch's compiler warnings.

:class:`RunGuard` is entered by :func:`tuner.study.tune` for the whole run. While it is active:

* SIGINT (in the main thread only; elsewhere nothing is installed) does not raise where it lands
  (a weakref callback or ``__del__`` during garbage collection would swallow it, "Exception
  ignored in ..."): the handler records it, and :func:`checkpoint` (called before every training
  step of :func:`tuner.workloads.measure`, at the start and end of each trial and before the
  profile is written) raises ``KeyboardInterrupt`` in the main thread. A second SIGINT exits the
  process at once (status 130). Processes forked meanwhile (loader workers) inherit the handler,
  which does nothing in them: the main process alone decides, so a Ctrl-C sent to the whole
  process group no longer kills the workers under a running trial.
* the deadline: :func:`checkpoint` raises :class:`DeadlineReached` once ``limit`` (the end of
  the current phase; by default the run's deadline) has passed.
* warnings of torch's compiler (``torch._dynamo``, ``torch._inductor``, ``torch.fx``: graph
  breaks, recompilations, below ERROR) go to the ``gnncompile.tuner`` logger at DEBUG instead of
  stderr, and are counted (``compiler_warnings``); errors and every other warning pass through.
"""
from __future__ import annotations

import logging
import os
import signal
import threading
import time
import warnings
from typing import Optional

log = logging.getLogger("gnncompile.tuner")

_COMPILER_LOGGERS = ("torch._dynamo", "torch._inductor", "torch.fx", "torch._functorch",
                     "torch._subclasses")
_COMPILER_FILES = tuple(os.path.join("torch", d) + os.sep for d in ("_dynamo", "_inductor", "fx",
                                                                     "_functorch"))
_local = threading.local()


class DeadlineReached(Exception):
    """The run's ``timeout`` passed during a measurement; the measurement is abandoned."""


def active() -> Optional["RunGuard"]:
    return getattr(_local, "guard", None)


def checkpoint(deadline: bool = True) -> None:
    """Raises KeyboardInterrupt after a Ctrl-C, DeadlineReached past the deadline (when
    ``deadline``); a no-op when no tuning run is active in this thread."""
    g = active()
    if g is not None:
        g.check() if deadline else g.check_interrupt()


class _CompilerRouter(logging.Filter):
    """A handler filter: compiler records below ERROR are counted and re-logged at DEBUG."""

    def __init__(self, guard: "RunGuard") -> None:
        super().__init__()
        self.guard = guard

    def filter(self, record: logging.LogRecord) -> bool:
        if record.levelno >= logging.ERROR or not record.name.startswith(_COMPILER_LOGGERS):
            return True
        if getattr(record, "_gnncompile_routed", False):  # seen by another handler already
            return False
        record._gnncompile_routed = True
        self.guard.compiler_warnings += 1
        log.debug("%s: %s", record.name, record.getMessage())
        return False


class _DropStoppedTrials(logging.Filter):
    """Optuna logs a trial stopped by Ctrl-C or by the deadline as failed, with a traceback and a
    second line ("Trial N failed with value None."): the interrupt is reported once, by the
    command line, and a trial cut by the deadline is recorded in the study (its 'error')."""

    def __init__(self) -> None:
        super().__init__()
        self.stopped: Optional[str] = None

    def filter(self, record: logging.LogRecord) -> bool:
        exc = record.exc_info[0] if record.exc_info else None
        msg = record.getMessage()
        if exc is not None and issubclass(exc, (KeyboardInterrupt, DeadlineReached)):
            self.stopped = msg.split(" failed", 1)[0] + " failed with value"  # "Trial N ..."
            return False
        if self.stopped is not None and msg.startswith(self.stopped):
            self.stopped = None
            return False
        return True


class RunGuard:
    """Context manager for one tuning run; ``timeout`` in seconds (None: no deadline)."""

    def __init__(self, timeout: Optional[float] = None) -> None:
        self.start = time.monotonic()
        self.deadline = None if timeout is None else self.start + float(timeout)
        self.limit = self.deadline
        self.interrupts = 0
        self.compiler_warnings = 0
        self._pid = os.getpid()
        self._old_handler = None
        self._installed = False
        self._router = _CompilerRouter(self)
        self._drop = _DropStoppedTrials()
        self._handlers: list = []
        self._warnings = None

    # ----------------------------------------------------------------- state
    def now(self) -> float:
        """The run's clock (monotonic seconds): the deadline, and the durations the tuner plans
        the rest of the run with (:class:`tuner.study._Budget`), are read on it."""
        return time.monotonic()

    def elapsed(self) -> float:
        return self.now() - self.start

    def remaining(self) -> Optional[float]:
        return None if self.deadline is None else self.deadline - self.now()

    def check_interrupt(self) -> None:
        if self.interrupts:
            raise KeyboardInterrupt

    def check(self) -> None:
        self.check_interrupt()
        if self.limit is not None and self.now() > self.limit:
            raise DeadlineReached("stopped: the run's timeout was reached")

    def _on_sigint(self, signum, frame) -> None:
        if os.getpid() != self._pid:  # a forked loader worker: the main process decides
            return
        self.interrupts += 1
        if self.interrupts > 1:
            os.write(2, b"gnncompile tune: interrupted twice; exiting at once\n")
            os._exit(130)

    # ----------------------------------------------------------------- install / restore
    def __enter__(self) -> "RunGuard":
        if threading.current_thread() is threading.main_thread():
            self._old_handler = signal.signal(signal.SIGINT, self._on_sigint)
            self._installed = True
        loggers = [logging.getLogger()] + [lg for n, lg in logging.Logger.manager.loggerDict.items()
                                           if isinstance(lg, logging.Logger)
                                           and (n == "torch" or n.startswith("torch."))]
        self._handlers = list({id(h): h for lg in loggers for h in lg.handlers}.values())
        for h in self._handlers:
            h.addFilter(self._router)
        logging.getLogger("optuna.study._optimize").addFilter(self._drop)
        self._warnings = warnings.catch_warnings()
        self._warnings.__enter__()
        shown = warnings.showwarning

        def showwarning(message, category, filename, lineno, file=None, line=None):
            if any(d in str(filename) for d in _COMPILER_FILES):
                self.compiler_warnings += 1
                log.debug("%s:%s: %s: %s", filename, lineno, category.__name__, message)
            else:
                shown(message, category, filename, lineno, file, line)

        warnings.showwarning = showwarning
        _local.guard = self
        return self

    def __exit__(self, *exc) -> None:
        _local.guard = None
        self._warnings.__exit__(*exc)
        logging.getLogger("optuna.study._optimize").removeFilter(self._drop)
        for h in self._handlers:
            h.removeFilter(self._router)
        if self._installed:
            signal.signal(signal.SIGINT, signal.SIG_DFL if self._old_handler is None else self._old_handler)
        if self.compiler_warnings:
            log.info("%d warnings of torch's compiler during the run (graph breaks, recompilations), "
                     "logged at DEBUG on 'gnncompile.tuner'", self.compiler_warnings)


__all__ = ["RunGuard", "DeadlineReached", "checkpoint", "active"]
