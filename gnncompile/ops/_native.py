"""Loads the compiled extension ``gnncompile._C``, or explains why it is not used.

The op schemas are defined in :mod:`.schemas` before this module is imported, so loading ``_C``
only adds kernels. When the extension is missing or fails to load, every op still works
through its pure-torch reference, and one warning says so.
"""
from __future__ import annotations

import logging
import warnings

from .. import config as _config  # gnncompile.config imports nothing of the package

_C = None
LOAD_ERROR: str | None = None

if _config.current().disable_native:
    LOAD_ERROR = "disabled by GNNCOMPILE_DISABLE_NATIVE"
else:
    try:
        from gnncompile import _C  # type: ignore[attr-defined,no-redef]  # noqa: F811
    except Exception as exc:  # ImportError, or an OSError from a broken link
        LOAD_ERROR = f"{type(exc).__name__}: {exc}"

# a child of the package logger "gnncompile" (gnncompile/_log.py), reached through logging
# directly: of the package, ops imports only gnncompile.config
_log = logging.getLogger(__name__)
if _C is not None:
    _log.debug("native kernels loaded from %s", getattr(_C, "__file__", "?"))
else:
    _log.info("native kernels not loaded (%s): pure-torch references", LOAD_ERROR)
    warnings.warn(
        "gnncompile: native kernels are not available "
        f"({LOAD_ERROR}); every op falls back to its pure-torch reference implementation. "
        "Build them with `pip install --no-build-isolation -e .` (see README).",
        RuntimeWarning,
        stacklevel=2,
    )


def native_loaded() -> bool:
    return _C is not None


def cuda_kernels() -> bool:
    return _C is not None and bool(_C.cuda_kernels())


def build_info() -> dict:
    return dict(_C.build_info()) if _C is not None else {}
