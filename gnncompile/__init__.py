"""gnncompile: fused, hardware-aware message passing for PyTorch Geometric.

    model = gnncompile.compile(model)          # compiler/: the torch.compile backend + passes/
    gnncompile.explain(model, x, edge_index)   # what fused, what did not, and why
    gnncompile.export(model, (x, ei), "m.onnx")  # export/: ONNX or torch.export

The fused kernels are in :mod:`gnncompile.ops`, the settings a compiled model carries in
:mod:`gnncompile.settings`, the environment variables in :mod:`gnncompile.config`, device
detection in :mod:`gnncompile.hardware`, device profiles in :mod:`gnncompile.profiles`,
loaders in :mod:`gnncompile.data` (and, adapting their batch size while training, in
:mod:`gnncompile.adapt`), the optional Optuna tuner in :mod:`gnncompile.tuner` (never
imported here), the command line in :mod:`gnncompile.cli`.
"""
from __future__ import annotations

from importlib import metadata as _metadata

try:
    __version__ = _metadata.version("gnncompile")  # pyproject.toml holds the one version
except _metadata.PackageNotFoundError:  # a source tree that was never installed
    __version__ = "0+unknown"

from . import config  # noqa: E402  (every environment variable, read in one place)
from . import ops  # noqa: E402  (defines the op schemas and loads the native kernels)
from . import codegen  # noqa: E402  (generated message kernels: the message ops' backward prepares them)
from . import hardware, profiles, settings  # noqa: E402
from .settings import Settings  # noqa: E402
from .compiler import compile, explain  # noqa: E402  (also registers the "gnncompile" backend)
from .compiler import load_state_dict, state_dict, unwrap  # noqa: E402
from .export import export  # noqa: E402


def info() -> dict:
    """What this installation has: versions, native kernels, and the detected device."""
    import torch

    from .ops import _native

    return {
        "version": __version__,
        "torch": torch.__version__,
        "native": _native.native_loaded(),
        "native_error": _native.LOAD_ERROR,
        "cuda_kernels": _native.cuda_kernels(),
        "device": hardware.describe(),
        "build": _native.build_info(),
    }


__all__ = ["info", "ops", "hardware", "profiles", "config", "settings", "Settings", "compile", "explain",
           "export", "state_dict", "load_state_dict", "unwrap", "__version__"]
