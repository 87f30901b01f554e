"""``gnncompile.explain(model, *inputs)``: what the passes fused in a model, what they left and
why, and where Dynamo broke the graph."""
from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import List, Optional

import torch

from ..passes.canonical import module_label
from ..passes.report import Fusions, one_line
from .._log import get_logger
from ..settings import Settings
from . import backend as _backend

_log = get_logger(__name__)


@dataclass
class GraphBreak:
    reason: str
    count: int = 1

    def __str__(self) -> str:
        return f"{self.reason}" + (f"  (x{self.count})" if self.count > 1 else "")


@dataclass
class ExplainReport(Fusions):
    num_graphs: int = 0
    graph_breaks: List[GraphBreak] = field(default_factory=list)
    structures: int = 0
    transposed: int = 0
    hoisted: int = 0  # graph-only regions computed once per graph (gnncompile::hoisted)
    hoisted_nodes: int = 0
    settings: Optional[Settings] = None  # what the passes ran with (a compiled model's own)

    @property
    def num_graph_breaks(self) -> int:
        return sum(b.count for b in self.graph_breaks)

    def __str__(self) -> str:
        lines = [f"gnncompile.explain: {self.num_fused} fused chain(s) in {self.num_graphs} graph "
                 f"piece(s), {self.num_graph_breaks} graph break(s), {self.structures} CSR / "
                 f"{self.transposed} CSC structure op(s), {self.hoisted_nodes} graph-only node(s) "
                 f"hoisted into {self.hoisted} cached region(s)"]
        for title, items in (("fused:", self.fused), ("left unfused:", self.unfused),
                             ("graph breaks:", self.graph_breaks)):
            lines.append(title)
            lines += [f"  {i}" for i in items] or ["  (none)"]
        if self.notes:
            lines.append("notes:")
            lines += [f"  {n}" for n in self.notes]
        if self.settings is not None:
            lines.append("settings:")
            lines += [f"  {line}" for line in self.settings.lines()]
        return "\n".join(lines)

    __repr__ = __str__

    def as_dict(self) -> dict:
        """The report as plain data (what ``gnncompile explain --json`` prints)."""
        return {"num_fused": self.num_fused, "num_graphs": self.num_graphs,
                "num_graph_breaks": self.num_graph_breaks, "structures": self.structures,
                "transposed": self.transposed, "hoisted": self.hoisted,
                "hoisted_nodes": self.hoisted_nodes, "fused": [asdict(f) for f in self.fused],
                "unfused": [asdict(u) for u in self.unfused], "notes": list(self.notes),
                "graph_breaks": [asdict(b) for b in self.graph_breaks],
                "settings": self.settings.as_dict() if self.settings is not None else None}


def _frame_root(report, model) -> str:
    """The path in ``model`` of the module a graph piece was traced from ('' for the model
    itself), found through a parameter of the piece."""
    if not isinstance(model, torch.nn.Module):
        return ""
    for name, p in model.named_parameters():
        rel = report.frame_params.get(id(p))
        if rel is not None:
            return name[: len(name) - len(rel)].rstrip(".") if name.endswith(rel) else ""
    return ""


def _place_in_model(report, model) -> None:
    """Layer labels relative to the user's model, also for a piece whose frame is a layer."""
    root = _frame_root(report, model)
    owner = model.get_submodule(root) if root else model
    top = module_label(root, type(owner).__name__)
    for item in report.fused + report.unfused:
        if item.layer == "<model>":
            item.layer = top
        elif root:  # labels below the piece's root, '<model> (Cls)' for the root itself
            item.layer = (root + item.layer[len("<model>"):] if item.layer.startswith("<model> ")
                          else f"{root}.{item.layer}")


def explain(model, *example_inputs, **example_kwargs) -> ExplainReport:
    """Runs ``model`` once through Dynamo with the gnncompile passes and reports what fused.

    The model runs for real (eager inner compiler; outputs discarded) so that every graph
    piece, including those after graph breaks, is captured. Does not reset Dynamo: other
    compiled models keep their caches. For a model returned by :func:`gnncompile.compile` the
    passes run with the model's own settings (``.gnncompile_settings``), which the report
    prints; otherwise with the configuration's.
    """
    from torch._dynamo.utils import counters

    from .api import CompiledModule

    settings = getattr(model, "gnncompile_settings", None)
    if isinstance(model, CompiledModule):  # explain what its settings fuse
        model = model.model
    if not isinstance(settings, Settings):
        settings = Settings.from_config()
    before = dict(counters.get("graph_break", {}))
    # the model's own settings, run by the eager inner compiler (no code generation)
    be = _backend.Backend(settings.replace(inner="eager"))
    compiled = torch.compile(model, backend=be, dynamic=False)
    with _backend.collect() as reports, _backend.dynamic_output_shapes(settings.capture_dynamic):
        compiled(*example_inputs, **example_kwargs)
    rep = ExplainReport(num_graphs=len(reports), settings=settings)
    for r in reports:
        _place_in_model(r, model)
        rep.fused += r.fused
        rep.unfused += r.unfused
        rep.notes += [n for n in r.notes if n not in rep.notes]
        rep.structures += r.structures
        rep.transposed += r.transposed
        rep.hoisted += r.hoisted
        rep.hoisted_nodes += r.hoisted_nodes
    after = counters.get("graph_break", {})
    for reason, c in after.items():
        d = c - before.get(reason, 0)
        if d > 0:
            rep.graph_breaks.append(GraphBreak(one_line(reason, 300), d))
            _log.debug("explain %s: graph break (x%d): %s", type(model).__name__, d, one_line(reason, 300))
    return rep


__all__ = ["explain", "ExplainReport", "GraphBreak"]
