"""The compiler: the torch.compile backend ``"gnncompile"`` (:mod:`.backend`),
:func:`compile` (:mod:`.api`) and :func:`explain` (:mod:`.explainer`)."""
from __future__ import annotations

from .api import CompileFallbackWarning, CompiledModule, compile, load_state_dict, state_dict, unwrap
from .backend import INNERS, STATS, collect, gnncompile_backend, make_backend
from .explainer import ExplainReport, GraphBreak, explain

__all__ = ["compile", "explain", "CompiledModule", "CompileFallbackWarning", "ExplainReport", "GraphBreak",
           "make_backend", "gnncompile_backend", "collect", "STATS", "INNERS", "state_dict", "load_state_dict",
           "unwrap"]
