"""The package logger, ``logging.getLogger("gnncompile")``, with a NullHandler (a library
configures no output): diagnostics such as what the passes fused and left in each graph
piece, the profile and inner compiler ``compile`` chose, export steps, fallbacks. Turn it on
with ``logging.basicConfig()`` and ``logging.getLogger("gnncompile").setLevel(logging.INFO)``
(``DEBUG``: one record per fused chain and per scatter left unfused, with the reason). What the
user must act on stays a ``warnings.warn``."""
from __future__ import annotations

import logging
from typing import Optional

logger = logging.getLogger("gnncompile")
if not any(isinstance(h, logging.NullHandler) for h in logger.handlers):
    logger.addHandler(logging.NullHandler())


def error_line(e: BaseException, limit: Optional[int] = None) -> str:
    """'TypeName: first line of the message' (cut to ``limit`` characters when given), for
    one-line reports."""
    text = str(e).strip().splitlines()
    return f"{type(e).__name__}: {text[0][:limit]}" if text else type(e).__name__


def get_logger(name: str) -> logging.Logger:
    """The logger of module ``name`` (its ``__name__``, a child of ``gnncompile``)."""
    return logging.getLogger(name)


def log_fusions(log: logging.Logger, what: str, report) -> None:
    """One INFO record summing up a pass report (a :class:`gnncompile.passes.report.Fusions`),
    one DEBUG record per fused chain and per scatter left unfused."""
    if not log.isEnabledFor(logging.INFO):
        return
    log.info("%s: %d fused chain(s), %d scatter(s) left unfused", what, report.num_fused,
             len(report.unfused))
    for f in report.fused:
        log.debug("%s: fused %s", what, f)
    for u in report.unfused:
        log.debug("%s: left unfused %s", what, u)


__all__ = ["logger", "get_logger", "log_fusions"]
