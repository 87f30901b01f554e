"""gnncompile: fused, hardware-aware message passing for PyTorch Geometric."""
from __future__ import annotations

__version__ = "0.1.0"

from . import ops  # noqa: E402  (defines the op schemas and loads the native kernels)
from . import _native, device, graph  # noqa: E402


def info() -> dict:
    """What this installation has: versions, native kernels, and the detected device."""
    import torch

    return {
        "version": __version__,
        "torch": torch.__version__,
        "native": _native.native_loaded(),
        "native_error": _native.LOAD_ERROR,
        "cuda_kernels": _native.cuda_kernels(),
        "device": device.describe(),
        "build": _native.build_info(),
    }


__all__ = ["info", "ops", "graph", "device", "__version__", "compile", "explain", "export"]
from .compile import compile, explain  # noqa: E402
from . import backend  # noqa: E402,F401
from .export import export  # noqa: E402
