"""Graph rewrites on the torch-level FX graph that Dynamo captures (before AOTAutograd), one
module per phase, typed records between them. :func:`run` runs six phases, in this order:

1. :mod:`.canonical`: identity dropout removed; with ``fast_dropout``, each dropout becomes one
   ``gnncompile::dropout`` call. (:mod:`.canonical` also gives every other phase one name per
   operation whatever its spelling, and sizes as printable keys.)
2. :mod:`.algebra` (``programs=True``): linear maps of gathered rows moved to the nodes.
3. :mod:`.match`: every scatter explained as a fusable chain (:class:`~.match.Aggregate`,
   :class:`~.match.Softmax`, :class:`~.match.Degree`, a message program of :mod:`.messages`)
   or as unfused with a reason.
4. :mod:`.plan`: the graph structures the chains share (:class:`~.plan.SharedStructure`).
5. :mod:`.rewrite`: structure ops and fused ops inserted, replaced nodes removed, then the
   per-edge gathers left in the graph turned into ``gnncompile::gather``, and each attention
   chain turned into one ``gnncompile::attention`` (:mod:`.attention`); with ``reassociate``, a
   sum spmm over a linear map of a graph input that needs no gradient aggregates the input first
   (:mod:`.order`); last, each remaining spmm given the implementation the portfolio chooses (:mod:`.portfolio`) and, with the opt-in
   ``choices['precision'] = 'bf16'``, bfloat16 features to gather (:mod:`.precision`). In
   compiled graphs (``hoist=True``), a native sum spmm plus ``s * x`` of its own input (GINConv's
   ``(1 + eps) * x``) becomes one ``gnncompile::spmm_self`` (:mod:`.self_term`).
6. :mod:`.hoist` (``hoist=True``): the work that depends only on the graph moved into one
   cached region (``gnncompile::hoisted``), computed once per graph instead of once per call.

It returns a :class:`~.report.PassReport`. Passes never launch kernels: they insert calls to
the ops of :mod:`gnncompile.ops`, which run with the graph.
"""
from __future__ import annotations

from typing import Callable, Optional

from torch.fx import GraphModule

from .algebra import push_linear_to_nodes
from .canonical import drop_identity_dropout
from .dense_attention import fuse_dense_attention
from .canonical import fast_dropout as fast_dropout_pass
from .hoist import hoist as hoist_pass
from .match import match
from .plan import plan
from .report import Fused, Fusions, PassReport, Unfused
from .rewrite import node_order, rewrite
from .self_term import fuse_self_terms
from .semantics import writes_cache
from ..settings import DEFAULT, Settings


def run(gm: GraphModule, settings: Optional[Settings] = None, copy_structures: bool = False,
        hoist: bool = False, fast_dropout: bool = False, programs: bool = True,
        portfolio: Optional[Callable] = None, softmax_programs: bool = True) -> PassReport:
    """Rewrites ``gm`` in place (and recompiles it); returns the report of what was fused.

    ``settings`` (:class:`gnncompile.settings.Settings`; default: the defaults, no knobs): the
    kernel knobs baked into the fused calls as op arguments (``settings.knobs_for(device, op)``),
    ``settings.slot_order`` and ``settings.reassociate`` (linear maps are also distributed over
    sums and differences of gathered rows (:mod:`.algebra`: faster, but ``W a - W b`` cancels
    where ``a - b`` does not), and inputs that need no gradient are aggregated before their
    linear map (:mod:`.order`)). Nothing else is read: the rewritten graph reads no process-wide
    setting. ``copy_structures``: the cached graph structure is handed out as copies (for inner
    compilers that recycle buffers). ``hoist``: run :func:`.hoist.hoist`
    (compiled graphs do; export does not, its graphs must hold standard ops). ``fast_dropout``:
    :func:`.canonical.fast_dropout` (compiled graphs whose inner compiler is not inductor).
    ``programs``: :func:`.algebra.push_linear_to_nodes`, message programs (:mod:`.messages`) and
    the fused attention (:mod:`.attention`); export turns them off (its graphs keep the messages
    as standard ops). ``portfolio``: the implementation decision of each fused spmm
    (:func:`gnncompile.compiler.portfolio.decide`, which compiled graphs get from the backend;
    None: every spmm runs the native op, as in export). ``softmax_programs``: a softmax
    aggregation of a message program becomes one ``message_softmax`` (export: False, the chain
    edge_softmax + program stays, and a note says why)."""
    with writes_cache():  # each pass's in-place-write analysis, reused while the graph is unchanged
        return _run(gm, DEFAULT if settings is None else settings, copy_structures, hoist, fast_dropout, programs,
                    portfolio, softmax_programs)


def _run(gm: GraphModule, settings: Settings, copy_structures: bool, hoist: bool, fast_dropout: bool,
         programs: bool, portfolio: Optional[Callable], softmax_programs: bool) -> PassReport:
    graph = gm.graph
    drop_identity_dropout(graph)
    dropouts = fast_dropout_pass(graph) if fast_dropout else 0
    notes: list = []
    moved = push_linear_to_nodes(graph, settings.reassociate, notes) if programs else 0
    order = node_order(graph)
    matches = match(graph, order, programs, settings.programs, attention=programs and settings.attention == "fused",
                    encoders=settings.edge_encoder, attention_cuda="attention_dot" in settings.cuda_unverified,
                    softmax_programs=softmax_programs)
    notes += matches.notes
    report = rewrite(graph, plan(matches, order), order, copy_structures, settings, attention=programs,
                     portfolio=portfolio, size_from_first=hoist, slot_copies=hoist)
    if hoist:  # compiled graphs (export's have no ONNX function for it)
        fuse_self_terms(graph, report)
    if programs and settings.attention == "fused":
        fuse_dense_attention(graph, report)
    report.notes += list(dict.fromkeys(notes))
    report.linear_moved = moved
    report.dropouts = dropouts
    if hoist:
        h = hoist_pass(gm, copy=copy_structures, check=settings.structure_check)
        report.hoisted, report.hoisted_nodes = h.regions, h.nodes
    graph.lint()
    gm.recompile()
    report.op_calls = fused_op_calls(gm)
    return report


FUSED_OPS = ("spmm", "spmm_self", "spmm_sparse", "spmm_bf16", "csr_degree", "edge_softmax", "message_reduce", "message_edges", "message_softmax", "attention", "attention_v2",
             "attention_dot", "dense_attention")


def fused_op_calls(gm: GraphModule) -> dict:
    """How many calls of each fused compute op (:data:`FUSED_OPS`) ``gm`` holds, inside its
    hoisted regions too."""
    from ..ops import hoisted as _hoisted
    from ..ops import targets

    by_target = {getattr(targets, name.upper()): name for name in FUSED_OPS}
    by_target[targets.MHA_FORWARD] = "dense_attention"  # a multi-head attention around the op
    counts: dict = {}

    def walk(graph) -> None:
        for n in graph.nodes:
            if n.op != "call_function":
                continue
            if n.target in by_target:
                counts[by_target[n.target]] = counts.get(by_target[n.target], 0) + 1
            elif n.target is targets.HOISTED:
                walk(_hoisted.region(n.args[0]).graph)

    walk(gm.graph)
    return counts


__all__ = ["run", "PassReport", "Fused", "Unfused", "Fusions", "FUSED_OPS", "fused_op_calls"]
