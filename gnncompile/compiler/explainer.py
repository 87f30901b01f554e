"""``gnncompile.explain(model, *inputs)``: what the passes fused in a model, what they left and
why, and where Dynamo broke the graph."""
from __future__ import annotations

import contextlib
import re
from dataclasses import asdict, dataclass, field
from typing import Dict, List, Optional

import torch

from ..passes.canonical import module_label
from ..passes.report import Fusions, one_line
from .._log import get_logger
from ..settings import Settings
from . import backend as _backend
from . import guard as _guard
from . import lean as _lean

_log = get_logger(__name__)


@dataclass
class GraphBreak:
    reason: str
    count: int = 1  # graph pieces that ended at this break (a break in a loop ends one per pass)
    at: str = ""  # 'file.py:12 (forward)': the user's line Dynamo broke at, where it said

    def __str__(self) -> str:
        return (f"{self.reason}" + (f"  (x{self.count})" if self.count > 1 else "")
                + (f"  at {self.at}" if self.at else ""))


@dataclass
class GraphPiece(Fusions):
    """One graph piece compiled while explain ran (in the order Dynamo handed them over): what
    fused in it and what it left, and the graph break that ended it ('' where its frame
    returned; every piece of a DDP split names DDP's split)."""
    graph_break: str = ""

    def as_dict(self) -> dict:
        return {"num_fused": self.num_fused, "fused": [asdict(f) for f in self.fused],
                "unfused": [asdict(u) for u in self.unfused], "graph_break": self.graph_break}


@dataclass
class ExplainReport(Fusions):
    num_graphs: int = 0
    graph_breaks: List[GraphBreak] = field(default_factory=list)
    structures: int = 0
    transposed: int = 0
    hoisted: int = 0  # graph-only regions computed once per graph (gnncompile::hoisted)
    hoisted_nodes: int = 0
    settings: Optional[Settings] = None  # what the passes ran with (a compiled model's own)
    # frames Dynamo gave up on and ran eagerly (nothing fused there): 'forward (file line 7): why'
    skipped_frames: List[str] = field(default_factory=list)
    # the model's functions torch.compile stopped recompiling in this process (eager since)
    recompile_limits: List[str] = field(default_factory=list)
    # a compiled model's speed-guard decisions so far (None: explain of an uncompiled model)
    guard: Optional[List[str]] = None
    # what compile() did about huge pages for a compiled model (gnncompile.hardware.memory.apply)
    huge_pages: Optional[str] = None
    # what compile() did about the block cache of freed large CPU allocations (memory.apply_cache)
    buffer_cache: Optional[str] = None
    # what the CPU message ops of the fused message programs run: generated kernels or the
    # interpreter (gnncompile.codegen.describe); None where no message program fused
    message_kernels: Optional[str] = None
    # the fused compute ops one call runs, per op (gnncompile.passes.fused_op_calls): what a
    # profiler sees of the fused chains above
    op_calls: Dict[str, int] = field(default_factory=dict)
    # each graph piece's own fused chains (the lists above are all pieces' together)
    pieces: List[GraphPiece] = field(default_factory=list)
    # the PyG layers Dynamo traced through gnncompile's lean forward, and those of its classes
    # that kept PyG's forward with the reason (gnncompile.compiler.lean.Record.lines)
    lean_layers: List[str] = field(default_factory=list)

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
            if title == "fused:" and self.op_calls:
                lines.append("  fused op calls per forward: "
                             + ", ".join(f"{k} x{v}" for k, v in sorted(self.op_calls.items())))
            if title == "fused:" and len(self.pieces) > 1:
                lines.append("  fused chains per graph piece: " + ", ".join(str(p.num_fused) for p in self.pieces))
        if self.lean_layers:
            lines.append("lean forwards (Dynamo traced gnncompile's lean forward of these PyG layers: the same ops "
                         "in the same order, less Python to trace):")
            lines += [f"  {x}" for x in self.lean_layers]
        if self.skipped_frames:
            lines.append("frames Dynamo skipped (they run eagerly; nothing in them is fused):")
            lines += [f"  {f}" for f in self.skipped_frames]
        if self.recompile_limits:
            lines.append("recompile limit hit in this process (those functions run eagerly in compiled "
                         "models; the report above is of a fresh compile):")
            lines += [f"  {f}" for f in self.recompile_limits]
        if self.notes:
            lines.append("notes:")
            lines += [f"  {n}" for n in self.notes]
        if self.guard is not None:
            lines.append("speed guard (rewritten vs unrewritten form, per size class):")
            lines += [f"  {g}" for g in self.guard] or [
                f"  (no decision yet: a rewritten piece is timed against its unrewritten form over its "
                f"first {2 + 2 * _guard.SAMPLES} calls per size class)"]
        if self.settings is not None:
            lines.append("settings:")
            lines += [f"  {line}" for line in self.settings.lines()]
        if self.huge_pages is not None:
            lines.append(f"huge pages: {self.huge_pages}")
        if self.buffer_cache is not None:
            lines.append(f"buffer cache: {self.buffer_cache}")
        if self.message_kernels is not None:
            lines.append(f"message programs (CPU): {self.message_kernels}")
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
                "skipped_frames": list(self.skipped_frames),
                "recompile_limits": list(self.recompile_limits),
                "settings": self.settings.as_dict() if self.settings is not None else None,
                "guard": self.guard, "huge_pages": self.huge_pages,
                "buffer_cache": self.buffer_cache, "message_kernels": self.message_kernels,
                "op_calls": dict(self.op_calls),
                "pieces": [p.as_dict() for p in self.pieces], "lean_layers": list(self.lean_layers)}


def _frame_root(report, model) -> str:
    """The path in ``model`` of the module a graph piece was traced from ('' for the model
    itself), found through a parameter of the piece."""
    if not isinstance(model, torch.nn.Module):
        return ""
    modules = dict(model.named_modules())
    for name, p in model.named_parameters():
        rel = report.frame_params.get(id(p))
        # a parameter the frame reached through a module path ('lin.weight'); one it got as a
        # plain local (Dynamo's path is then empty or a variable's name) places nothing
        if rel and (name == rel or name.endswith("." + rel)):
            root = name[: len(name) - len(rel)].rstrip(".")
            if root in modules:
                return root
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
    For a model returned by :func:`gnncompile.compile`, also what its speed guard kept so far.

    The model runs for real (eager inner compiler; outputs discarded) so that every graph
    piece, including those after graph breaks, is captured. Does not reset Dynamo: other
    compiled models keep their caches. For a model returned by :func:`gnncompile.compile` the
    passes run with the model's own settings (``.gnncompile_settings``), which the report
    prints; otherwise with the configuration's.
    """
    from torch._dynamo.utils import counters

    from .api import CompiledModule

    settings = getattr(model, "gnncompile_settings", None)
    decisions = getattr(model, "guard_decisions", None)
    guard = [str(d) for d in decisions()] if callable(decisions) else None
    huge_pages = getattr(model, "gnncompile_huge_pages", None)
    buffer_cache = getattr(model, "gnncompile_buffer_cache", None)
    if not isinstance(settings, Settings):
        settings = Settings.from_config()
    capture, switched = settings.capture_dynamic, ""
    if isinstance(model, CompiledModule):  # explain what its settings fuse, as it captures now
        capture, note = model._capture, model.capture_note
        model = model.model
        if note:
            switched = note
    cfg = torch._dynamo.config
    # room for explain's own compiles where a compiled model of the user's filled the function's
    # cache (its recompile limit): explain would otherwise see no piece at all
    room = {"recompile_limit": cfg.recompile_limit + 8,
            "accumulated_recompile_limit": cfg.accumulated_recompile_limit + 8}
    for attempt in range(2):
        before = dict(counters.get("graph_break", {}))
        before_unimplemented = dict(counters.get("unimplemented", {}))
        # the model's own settings, run by the eager inner compiler (no code generation)
        be = _backend.Backend(settings.replace(inner="eager", choices={**dict(settings.choices), "guard": "off"}))
        compiled = torch.compile(model, backend=be, dynamic=False)
        lean = _lean.Record()
        with _backend.collect() as reports, _backend.dynamic_output_shapes(capture), \
                _lean.scope(settings.lean_layers != "off", lean), cfg.patch(**room), _fresh_code(model):
            compiled(*example_inputs, **example_kwargs)
        if attempt or capture is not True or not be.data_dependent_breaks:
            break
        # what gnncompile.compile's module does after its first call (CompiledModule._capture_switch)
        capture, switched = _backend.CAPTURE_OUTPUTS, be.data_dependent_breaks[0]
    rep = ExplainReport(num_graphs=len(reports), settings=settings, guard=guard,
                        huge_pages=huge_pages if isinstance(huge_pages, str) else None,
                        buffer_cache=buffer_cache if isinstance(buffer_cache, str) else None,
                        lean_layers=lean.lines(model))
    for r in reports:
        _place_in_model(r, model)
        rep.pieces.append(GraphPiece(fused=list(r.fused), unfused=list(r.unfused),
                                     graph_break=one_line(r.graph_break, 400)))
        rep.fused += r.fused
        rep.unfused += r.unfused
        rep.notes += [n for n in r.notes if n not in rep.notes]
        rep.structures += r.structures
        rep.transposed += r.transposed
        rep.hoisted += r.hoisted
        rep.hoisted_nodes += r.hoisted_nodes
        for k, v in r.op_calls.items():
            rep.op_calls[k] = rep.op_calls.get(k, 0) + v
    # each break once: where a piece ended at it (reason and line from Dynamo's record of the
    # piece), then any break Dynamo counted that ended no piece (nothing traced before it)
    seen = {}
    ddp_frames: dict = {}  # a DDP split labels each of its k pieces, the last too: k - 1 breaks
    for r in reports:
        if r.graph_break.startswith(_backend.DDP_SPLIT):
            ddp_frames[r.compile_id] = ddp_frames.get(r.compile_id, 0) + 1
    for r in reports:
        if r.graph_break:
            key = (r.graph_break, r.break_at)
            if key in seen:
                seen[key].count += 1
            else:
                seen[key] = GraphBreak(one_line(r.graph_break, 400), 1, r.break_at)
    splits = sum(k - 1 for k in ddp_frames.values())
    for key in [k for k in seen if k[0].startswith(_backend.DDP_SPLIT)]:
        if splits:
            seen[key].count = splits
            seen[key].reason = (f"DDP's optimizer split the graph at gradient-bucket boundaries "
                                f"({sum(ddp_frames.values())} pieces; torch: {seen[key].reason})")
        else:
            del seen[key]
    rep.graph_breaks = list(seen.values())
    if any(f.kind in ("message", "segment", "edges", "message_softmax") for f in rep.fused):
        from .. import codegen
        rep.message_kernels = codegen.describe()
    known = {one_line(r.graph_break, 60) for r in reports if r.graph_break}
    for reason, c in counters.get("graph_break", {}).items():
        if c > before.get(reason, 0) and one_line(_backend.plain_reason(reason), 60) not in known:
            rep.graph_breaks.append(GraphBreak(one_line(_backend.plain_reason(reason), 400)))
    if switched.startswith("compiled again"):
        rep.notes.append(switched)
    elif switched:
        rep.notes.append(
            "scalar reads left to eager: with them captured, a graph piece ended at a data-dependent guard "
            f"({one_line(switched, 160)}), and what followed ran as written. gnncompile.compile's module "
            "compiles the model again this way after its first call (settings capture_dynamic='outputs' "
            "compiles it so from the start)")
    elif capture is True and any(_backend.DATA_DEPENDENT in b.reason for b in rep.graph_breaks):
        rep.notes.append("a graph break above is a data-dependent size torch cannot trace through (a Python "
                         "branch on a size read from a tensor, for one): settings capture_dynamic='outputs' "
                         "reads such sizes eagerly instead (a graph break at each read; the compiled module "
                         "switches to it by itself only for torch's attention, where the rewrite pays for the "
                         "breaks), capture_dynamic=False also leaves ops with data-dependent output sizes to eager")
    for msg, c in counters.get("unimplemented", {}).items():
        if c > before_unimplemented.get(msg, 0):
            frame = skipped_frame(msg)
            if frame and frame not in rep.skipped_frames:
                rep.skipped_frames.append(frame)
    mine = {_code_key(getattr(type(m), "forward", None)) for m in
            (model.modules() if isinstance(model, torch.nn.Module) else ())} - {None}
    rep.recompile_limits = [r for r in _backend.RECOMPILE_LIMITS if any(r.startswith(k) for k in mine)]
    for b in rep.graph_breaks:
        _log.debug("explain %s: graph break: %s", type(model).__name__, b)
    return rep


def _code_key(fn):
    """How Dynamo names a function in its recompile-limit message: "'forward' (file:line)"."""
    code = getattr(fn, "__code__", None)
    return f"'{code.co_name}' ({code.co_filename}:{code.co_firstlineno})" if code is not None else None


@contextlib.contextmanager
def _fresh_code(model):
    """While explain runs: where torch.compile hit its recompile limit for the model's
    ``forward`` in this process (it runs that code eagerly from then on, and would give explain
    no piece), the method runs a copy of its code object, which Dynamo has not seen. The user's
    compiled model keeps its own state; the original code is restored afterwards."""
    fn = getattr(type(model), "forward", None)
    code = getattr(fn, "__code__", None)
    key = _code_key(fn)
    if key is None or not any(r.startswith(key) for r in _backend.RECOMPILE_LIMITS):
        yield
        return
    fn.__code__ = code.replace()
    try:
        yield
    finally:
        fn.__code__ = code


def skipped_frame(msg: str) -> str:
    """'forward (file line 7): graph break in loop: why' from a Dynamo message that skipped a
    frame ('' for any other message): its last break's title and explanation."""
    where = re.search(r"frame skipped: ([^\n]+)", str(msg))
    if where is None:
        return ""
    lines = str(msg).splitlines()
    why = ""
    for i, ln in enumerate(lines[:-1]):
        nxt = lines[i + 1].strip()
        if ln.strip() and nxt.startswith("Explanation:"):
            why = f"{ln.strip()}: {nxt[len('Explanation:'):].strip()}"
    return f"{where.group(1).strip()}: {why}" if why else where.group(1).strip()


__all__ = ["explain", "ExplainReport", "GraphBreak", "GraphPiece"]
