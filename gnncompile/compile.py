"""``gnncompile.compile(model)`` and ``gnncompile.explain(model, *inputs)``."""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, List, Optional

import torch

from . import backend as _backend
from .passes import Fused, Unfused


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
            (:mod:`gnncompile.profiles`): 'auto' (default) loads the profile for the detected
            device from the cache folder, the one nearest to ``workload`` when there is no
            exact match, else the defaults; a path loads that file (or the nearest in that
            folder); None uses the defaults of :func:`gnncompile.device.default_settings`. A
            corrupt, foreign or stale profile warns and falls back to the defaults. The
            profile used is recorded as ``.gnncompile_profile`` on the returned module
            (its loader settings: ``.gnncompile_profile.loader_kwargs()``). Knobs are set per
            device type and read when a graph is compiled, so the last ``compile`` wins.
        inner: compiler for the rest of the graph: 'auto' (the profile's ``inner`` when the
            profile has one, else the measured default :data:`gnncompile.backend.DEFAULT_INNER`:
            inductor, or ``$GNNCOMPILE_INNER``), 'eager', 'aot_eager' or 'inductor'.
        dynamic: passed to ``torch.compile``. ``None`` (automatic dynamic shapes): the first call
            compiles each graph piece for its exact sizes, and the first call with other sizes
            recompiles it once with symbolic sizes, after which changing N and E (mini-batches)
            recompiles nothing. ``True`` compiles symbolic from the start.
        fullgraph: passed to ``torch.compile`` (raise on graph breaks).
        workload: optional description used to pick the nearest profile, e.g.
            ``{"kind": "graphs", "model": "gin"}``; by default the model's class name.
    """
    from . import profiles as _profiles

    if workload is None and isinstance(model, torch.nn.Module):
        workload = {"model": type(model).__name__.lower()}
    prof = _profiles.resolve(profile, workload=workload)
    prof.apply()
    if inner == "auto" and prof.inner:
        inner = prof.inner  # what the tuning run measured fastest for this device and workload
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


# ----------------------------------------------------------------------------- explain
@dataclass
class GraphBreak:
    reason: str
    count: int = 1

    def __str__(self) -> str:
        return f"{self.reason}" + (f"  (x{self.count})" if self.count > 1 else "")


@dataclass
class ExplainReport:
    num_graphs: int = 0
    fused: List[Fused] = field(default_factory=list)
    unfused: List[Unfused] = field(default_factory=list)
    graph_breaks: List[GraphBreak] = field(default_factory=list)
    structures: int = 0
    transposed: int = 0

    @property
    def num_fused(self) -> int:
        """Fused message-passing chains (spmm and edge softmax; degree rewrites not counted)."""
        return sum(1 for f in self.fused if f.kind != "degree")

    @property
    def num_graph_breaks(self) -> int:
        return sum(b.count for b in self.graph_breaks)

    def __str__(self) -> str:
        lines = [f"gnncompile.explain: {self.num_fused} fused chain(s) in {self.num_graphs} graph "
                 f"piece(s), {self.num_graph_breaks} graph break(s), {self.structures} CSR / "
                 f"{self.transposed} CSC structure op(s)"]
        lines.append("fused:")
        lines += [f"  {f}" for f in self.fused] or ["  (none)"]
        lines.append("left unfused:")
        lines += [f"  {u}" for u in self.unfused] or ["  (none)"]
        lines.append("graph breaks:")
        lines += [f"  {b}" for b in self.graph_breaks] or ["  (none)"]
        return "\n".join(lines)

    __repr__ = __str__


def explain(model, *example_inputs, **example_kwargs) -> ExplainReport:
    """Runs ``model`` once through Dynamo with the gnncompile passes and reports what fused.

    The model runs for real (eager inner compiler; outputs discarded) so that every graph
    piece, including those after graph breaks, is captured. Does not reset Dynamo: other
    compiled models keep their caches.
    """
    from torch._dynamo.utils import counters

    before = dict(counters.get("graph_break", {}))
    be = _backend.make_backend("eager")
    compiled = torch.compile(model, backend=be, dynamic=False)
    with _backend.collect() as reports:
        compiled(*example_inputs, **example_kwargs)
    rep = ExplainReport(num_graphs=len(reports))
    top = f"<model> ({type(model).__name__})"
    for r in reports:
        for item in r.fused + r.unfused:
            if item.layer == "<model>":
                item.layer = top
        rep.fused += r.fused
        rep.unfused += r.unfused
        rep.structures += r.structures
        rep.transposed += r.transposed
    after = counters.get("graph_break", {})
    for reason, c in after.items():
        d = c - before.get(reason, 0)
        if d > 0:
            rep.graph_breaks.append(GraphBreak(_short(reason), d))
    return rep


def _short(reason: str, limit: int = 300) -> str:
    reason = " ".join(str(reason).split())
    return reason if len(reason) <= limit else reason[:limit] + " ..."


__all__ = ["compile", "explain", "CompiledModule", "ExplainReport", "GraphBreak"]
