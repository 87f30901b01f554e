"""``gnncompile.compile(model)``: the model wrapped around ``torch.compile`` with the gnncompile
backend and the device profile's settings."""
from __future__ import annotations

from typing import Any, Optional

import torch

from .._log import get_logger
from . import backend as _backend

_log = get_logger(__name__)


class CompiledModule(torch.nn.Module):
    """Behaves like the wrapped model: same parameters (the very same tensors), same
    ``state_dict`` keys (no prefix), ``train()`` / ``eval()`` reach the model; ``forward`` runs
    the compiled version. Attributes not found here are looked up on the model."""

    def __init__(self, model: torch.nn.Module, compiled) -> None:
        super().__init__()
        self._orig_mod = model
        object.__setattr__(self, "_compiled", compiled)  # not a registered submodule

    def forward(self, *args, **kwargs):
        return self._compiled(*args, **kwargs)

    @property
    def model(self) -> torch.nn.Module:
        return self._orig_mod

    def __getattr__(self, name: str):
        try:
            return super().__getattr__(name)
        except AttributeError:
            return getattr(self._modules["_orig_mod"], name)

    # the model's own names, without the wrapper's prefix
    def state_dict(self, *args, **kwargs):
        return self._orig_mod.state_dict(*args, **kwargs)

    def load_state_dict(self, *args, **kwargs):
        return self._orig_mod.load_state_dict(*args, **kwargs)

    def named_parameters(self, *args, **kwargs):
        return self._orig_mod.named_parameters(*args, **kwargs)

    def named_buffers(self, *args, **kwargs):
        return self._orig_mod.named_buffers(*args, **kwargs)

    def extra_repr(self) -> str:
        return f"inner={getattr(self._compiled, '_gnncompile_inner', '?')}"


def compile(model, *, profile: Any = "auto", inner: str = "auto", dynamic: Optional[bool] = None,
            fullgraph: bool = False, workload: Optional[dict] = None):
    """Compiles a PyG model (or any callable) with the gnncompile backend.

    Args:
        model: an ``nn.Module`` (returned wrapped in :class:`CompiledModule`, sharing its
            parameters and state) or a function (returned as ``torch.compile`` returns it).
        profile: the device profile whose kernel knobs the fused ops use
            (:mod:`gnncompile.hardware.profiles`): 'auto' (default) loads the profile for the detected
            device from the cache folder, the one nearest to ``workload`` when there is no
            exact match, else the defaults; a path loads that file (or the nearest in that
            folder); None uses the defaults of :func:`gnncompile.hardware.default_settings`. A
            corrupt, foreign or stale profile warns and falls back to the defaults. The
            profile used is recorded as ``.gnncompile_profile`` on the returned module
            (its loader settings: ``.gnncompile_profile.loader_kwargs()``). Knobs are set per
            device type and read when a graph is compiled, so the last ``compile`` wins.
        inner: compiler for the rest of the graph: 'auto' (the profile's ``inner`` when the
            profile has one, else the measured default :data:`gnncompile.compiler.DEFAULT_INNER`:
            inductor, or ``$GNNCOMPILE_INNER``), 'eager', 'aot_eager' or 'inductor'.
        dynamic: passed to ``torch.compile``. ``None`` (automatic dynamic shapes): the first call
            compiles each graph piece for its exact sizes, and the first call with other sizes
            recompiles it once with symbolic sizes, after which changing N and E (mini-batches)
            recompiles nothing. ``True`` compiles symbolic from the start.
        fullgraph: passed to ``torch.compile`` (raise on graph breaks).
        workload: optional description used to pick the nearest profile, e.g.
            ``{"kind": "graphs", "model": "gin"}``; by default the model's class name.
    """
    from ..hardware import profiles as _profiles

    if workload is None and isinstance(model, torch.nn.Module):
        workload = {"model": type(model).__name__.lower()}
    prof = _profiles.resolve(profile, workload=workload)
    prof.apply()
    if inner == "auto" and prof.inner:
        inner = prof.inner  # what the tuning run measured fastest for this device and workload
    _log.info("compile %s: profile %s, inner %s", type(model).__name__, prof.summary(),
              _backend.DEFAULT_INNER if inner == "auto" else inner)
    be = _backend.make_backend(inner)
    compiled = torch.compile(model, backend=be, dynamic=dynamic, fullgraph=fullgraph)
    if isinstance(model, torch.nn.Module):
        try:
            object.__setattr__(compiled, "_gnncompile_inner", inner)
        except Exception:
            pass
        out = CompiledModule(model, compiled)
        object.__setattr__(out, "gnncompile_profile", prof)
        return out
    try:
        compiled.gnncompile_profile = prof
    except Exception:
        pass
    return compiled


__all__ = ["compile", "CompiledModule"]
