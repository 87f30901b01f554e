"""Phase 5, rewrite: insert the planned structure ops and the fused ops, redirect the uses of
the nodes they replace, drop what became dead, and give the per-edge gathers that remain a
segment-sum gradient.

* Structures go before the first chain that uses them: ``cached_csr`` (or ``pair_csr``), and a
  ``cached_csc`` (or ``pair_csc``) per number of sources where a sum / mean gradient of the
  features flows back.
* Each chain becomes ``spmm``, ``edge_softmax`` or ``csr_degree`` at its anchor; the anchor's
  uses, and the later readers of an in-place-mutated zeros buffer, read the fused result.
* Per-edge gathers of a row of an edge_index that has a structure here (GAT's attention logits
  ``alpha_src[j] + alpha_dst[i]``, GATv2's ``x[j]``) become ``gnncompile::gather``, whose
  gradient is a parallel segment sum instead of a serial E-row index_add.

Nothing here launches a kernel; the inserted ops run when the compiled graph runs.
"""
from __future__ import annotations

import operator
from dataclasses import dataclass, field
from typing import Any, Callable, Dict, List, Optional, Tuple

import torch
from torch.fx import Node

from ..ops import targets
from ..ops.checks import FLOAT_DTYPES
from ..ops.message import loaded_edges
from .canonical import PURE, argument, fake_tensor, layer_of, opname, size_key
from ..ops import program as P
from .match import Aggregate, Degree, IndexRef, Match, Softmax, gather_of
from .messages import EdgeProgram, Program, SoftmaxProgram
from .plan import Plan, SharedStructure
from .portfolio import choose_implementations
from .order import aggregate_first
from .precision import gather_bf16
from .semantics import Writes, written_args
from .report import Fused, PassReport, Unfused
from ..settings import DEFAULT, Settings

Triple = Tuple[Node, Node, Node]
_PURE_OPS = (targets.MESSAGE_EDGES,)  # dropped when unused (an edge program recomputed in CSR order)


@dataclass
class Built:
    """The nodes inserted for one :class:`SharedStructure`."""

    shared: SharedStructure
    csr: Triple  # rowptr, col, perm
    num_dst: Any  # an int, or the size node of the zeros buffer
    csc: Dict[str, Triple] = field(default_factory=dict)  # by num_src size key
    slot_leaves: Dict[Node, Optional[Node]] = field(default_factory=dict)  # per-edge leaf -> in CSR order
    programs: Dict[tuple, Node] = field(default_factory=dict)  # fused programs, to compute each once
    writes: Optional[Writes] = None  # the in-place writes of the graph before the rewrite
    at: Optional[Node] = None  # the anchor of the chain being rewritten
    # per-edge inputs computed from narrower edge features are recomputed in CSR order (read at
    # the slot, not through perm); Settings.slot_order = False turns this off (A/B measurements)
    slot_order: bool = True
    check: str = ""  # the structure check mode baked into the structure ops (Settings.structure_check)
    copy: bool = False  # the structure ops hand out clones (inner compilers that recycle buffers)
    # graph input -> the same tensor in CSR slot order, copied once per structure and tensor
    # (gnncompile::cached_slot_rows, ops/slots.py): read in order by the message kernels
    slot_copies: Dict[Node, Node] = field(default_factory=dict)
    slot_copies_ok: bool = True  # compiled graphs only (export's graphs hold standard ops)


def node_order(graph) -> Dict[Node, int]:
    return {n: i for i, n in enumerate(graph.nodes)}


def _size0(graph, n: Node, first: bool = True):
    """The dim 0 of ``n``: an int, or (``first``) a ``size(0)`` node of the first tensor in the
    graph with the same (symbolic) dim 0 (an input, as a rule), not of ``n`` itself: a size read
    from a node that the rewrite leaves unused would keep it, and what computes it, alive (the
    zeros buffer of a replaced scatter, made by ``x_j.new_zeros``, kept a per-edge gather, the
    message's ops and the buffer running for nothing but its size: 5 ops over ``E x F`` tensors
    a GINEConv layer). ``first=False``: ``n``'s own size (export graphs, whose ONNX input names
    and fused attention depended on what that kept; not changed yet)."""
    v = fake_tensor(n).shape[0]
    if isinstance(v, int) or not first:
        return v if isinstance(v, int) else graph.call_method("size", (n, 0))
    want = size_key(v)
    for m in graph.nodes:
        if m is n:
            break
        mv = fake_tensor(m)
        if mv is not None and mv.dim() >= 1 and size_key(mv.shape[0]) == want:
            n = m
            break
    return graph.call_method("size", (n, 0))


def _unpack(graph, call: Node) -> Triple:
    return tuple(graph.call_function(operator.getitem, (call, i)) for i in range(3))  # type: ignore[return-value]


def _insert_csc(graph, b: Built, m: Aggregate, copy: bool) -> bool:
    """The transposed structure ``m`` needs, inserted before it unless it exists already."""
    nkey = size_key(fake_tensor(m.x).shape[0])
    if nkey in b.csc:
        return False
    with graph.inserting_before(m.anchor):
        num_src = _size0(graph, m.x)
        if b.shared.edge_index is not None:
            call = graph.call_function(targets.CACHED_CSC, (b.shared.edge_index, b.num_dst, num_src, copy, b.check))
        else:
            call = graph.call_function(targets.PAIR_CSC, (*b.csr, num_src))
        b.csc[nkey] = _unpack(graph, call)
    return True


def insert_structures(graph, p: Plan, copy: bool, report: PassReport, check: str = "",
                      size_from_first: bool = True) -> List[Built]:
    """One structure op per shared structure, before its first member (``copy``: the cached
    tensors are handed out as clones, for inner compilers that recycle buffers; ``check``: the
    structure check mode of the lookups, "" for the process-wide one)."""
    built = []
    for s in p.structures:
        first = s.members[0]
        with graph.inserting_before(first.anchor):
            num_dst = _size0(graph, first.buffer, size_from_first)
            if s.edge_index is not None:
                call = graph.call_function(targets.CACHED_CSR, (s.edge_index, num_dst, copy, check))
            else:
                call = graph.call_function(targets.PAIR_CSR, (first.dst_index, s.pair_src_index(), num_dst))
            b = Built(s, _unpack(graph, call), num_dst, check=check, copy=copy)
        report.structures += 1
        for m in s.members:
            if isinstance(m, Aggregate) and m.needs_csc and _insert_csc(graph, b, m, copy):
                report.transposed += 1
        built.append(b)
    return built


def _fused_spmm(graph, m: Aggregate, b: Built, knobs: List[int]) -> Node:
    xv = fake_tensor(m.x)
    x = graph.call_method("contiguous", (m.x,))
    w = None
    if m.weight is not None:
        w = graph.call_method("reshape", (m.weight, -1)) if m.weight_kind == "edge" \
            else graph.call_method("squeeze", (m.weight, -1))
        w = graph.call_method("contiguous", (w,))
    t = b.csc.get(size_key(xv.shape[0]), (None, None, None)) if m.needs_csc else (None, None, None)
    extra = (True,) if m.relu_input else ()  # (the max / min backward: gradients at x's zeros are dropped)
    call = graph.call_function(targets.SPMM, (*b.csr, w, x, m.reduce, knobs, *t, *extra))
    out = graph.call_function(operator.getitem, (call, 0))
    return graph.call_method("flatten", (out, 1)) if m.flat else out


_ROWWISE = ("linear", "view", "reshape", "repeat", "getitem", "unsqueeze", "squeeze", "contiguous", "flatten",
            "relu", "sigmoid", "tanh", "gelu", "elu", "leaky_relu", "softplus", "dropout")


def _per_edge_arg(n: Node, E) -> Optional[Node]:
    """The one per-edge tensor argument of ``n`` (the others must not have the edge dim)."""
    found = None
    for a in list(n.args) + list(n.kwargs.values()):
        for x in (a if isinstance(a, (list, tuple)) else (a,)):
            v = fake_tensor(x) if isinstance(x, Node) else None
            if v is not None and v.dim() >= 1 and size_key(v.shape[0]) == size_key(E):
                if found is not None and x is not found:
                    return None
                found = x
    return found


def _slot_chain(leaf: Node, writes: Writes, at: Node, wide_ok=()) -> Optional[Tuple[Node, List[Node]]]:
    """(root, chain) when the per-edge ``leaf`` is computed row by row from one narrower per-edge
    tensor ``root`` through ``chain`` (root first), with at least one linear map: edge features
    through an encoder. Rows commute with such a chain: ``chain(root)[perm] = chain(root[perm])``.
    The chain is computed again at ``at`` (the fused op): nothing it reads may be written in
    place between where it read it and there."""
    E = fake_tensor(leaf).shape[0]
    chain, cur, linear = [], leaf, False
    while opname(cur) in _ROWWISE and cur not in wide_ok:
        if opname(cur) == "dropout":
            return None  # random: the masks would follow the rows differently
        if opname(cur) == "repeat" and not (len(cur.args) > 1 and cur.args[1] == 1):
            return None
        if opname(cur) == "getitem":
            idx = cur.args[1]
            if not (isinstance(idx, tuple) and idx and idx[0] == slice(None, None, None)):
                return None
        if opname(cur) in ("unsqueeze", "squeeze", "flatten") and argument(cur, 1, "dim", 1) in (0, None):
            return None
        inner = _per_edge_arg(cur, E)
        if inner is None or inner is not argument(cur, 0):
            return None
        linear = linear or opname(cur) == "linear"
        chain.append(cur)
        cur = inner
    if not linear or not chain:
        return None
    end = writes.pos.get(at, len(writes.pos))
    for c in chain + [cur]:  # the chain's values, and what each of its calls reads
        if writes.first_write(c, writes.pos[c], end) is not None:
            return None
        if any(writes.first_write(a, writes.pos[c] - 1, end) is not None for a in c.all_input_nodes):
            return None
    if cur in wide_ok:
        return cur, list(reversed(chain))
    rv, lv = fake_tensor(cur), fake_tensor(leaf)
    if rv is None or rv.dim() < 1 or rv.numel() >= lv.numel():
        return None  # only a narrower root is cheaper to reorder than the leaf
    return cur, list(reversed(chain))


_VIEWS = ("reshape", "view", "contiguous")  # ops that keep a tensor's rows (dim 0) as they are


def _static_edges(v) -> Optional[int]:
    """The edge count of a per-edge tensor's fake ``v`` when it is a plain int (a graph whose size
    does not change between calls), else None."""
    e = v.shape[0] if v is not None and v.dim() >= 1 else None
    return e if isinstance(e, int) else None


def _slot_copy_root(node: Node, E) -> Optional[Node]:
    """The graph input ``node`` is read from (through reshapes that keep its rows: dim 0, the
    edges), if it qualifies for a copy in CSR slot order cached with the structure
    (:mod:`gnncompile.ops.slots`): a CPU float32 / float64 input of the compiled graph (a
    placeholder or a module attribute: the same tensor call after call, so the copy is reused)
    that needs no gradient, with a static edge count of at least ``SLOT_COPY_MIN_EDGES``. A
    tensor computed in the graph would be copied anew every call: not taken."""
    from ..ops.slots import SLOT_COPY_MIN_EDGES
    cur = node
    while cur.op in ("call_method", "call_function") and opname(cur) in _VIEWS and cur.args \
            and isinstance(cur.args[0], Node):
        cur = cur.args[0]
    if cur.op not in ("placeholder", "get_attr"):
        return None
    v = fake_tensor(cur)
    e = _static_edges(v)
    if v is None or e is None or not isinstance(E, int) or e != E or e < SLOT_COPY_MIN_EDGES:
        return None
    if v.device.type != "cpu" or v.dtype not in (torch.float32, torch.float64) or v.requires_grad:
        return None
    return cur


def _cached_slots(graph, node: Node, b: Built, row_width: Optional[int] = None) -> Optional[Node]:
    """``node`` (a per-edge input of a message program) read in CSR slot order from a copy cached
    with the structure (``gnncompile::cached_slot_rows``), reshaped to ``[-1, row_width]`` (or the
    root's own rows when None), or None where that does not apply (:func:`_slot_copy_root`; a
    structure not built from an ``edge_index``; Settings.slot_order off)."""
    if not b.slot_order or not b.slot_copies_ok or b.shared.edge_index is None:
        return None
    v = fake_tensor(node)
    if v is None or v.dim() < 1:
        return None
    root = _slot_copy_root(node, _static_edges(v))
    if root is None:
        return None
    rv = fake_tensor(root)
    if row_width is not None and rv.numel() != rv.shape[0] * row_width:
        return None
    out = b.slot_copies.get(root)
    if out is None:
        out = graph.call_function(targets.CACHED_SLOT_ROWS, (b.shared.edge_index, b.num_dst, root, b.copy, b.check))
        b.slot_copies[root] = out
    return out if row_width is None else graph.call_method("reshape", (out, (-1, row_width)))


def _leaf_in_csr_order(graph, leaf: Node, b: Built, knobs: List[int]) -> Optional[Node]:
    """``leaf`` recomputed in CSR order (side slot) from its reordered root, or None. A root
    that is an edge program of this structure (EdgeConv's MLP input) is recomputed in CSR order
    by the same program: no reordering of a wide tensor."""
    if leaf in b.slot_leaves:
        return b.slot_leaves[leaf]
    edge_programs = {m.anchor: m for m in b.shared.members if isinstance(m, EdgeProgram)}
    found = _slot_chain(leaf, b.writes, b.at, set(edge_programs))
    if found is not None and found[0] in edge_programs:  # its leaves are read again, at b.at
        root = found[0]
        end = b.writes.pos.get(b.at, len(b.writes.pos))
        reads = [lf.node for lf in edge_programs[root].leaves]
        if any(b.writes.first_write(n, b.writes.pos[root] - 1, end) is not None for n in reads):
            found = None
    out = None
    if found is not None:
        root, chain = found
        if root in edge_programs:
            start = _emit_program(graph, edge_programs[root], b, knobs, by_slot=True)
        else:  # a graph input copied once per structure (ops/slots.py), else reordered here each call
            start = _cached_slots(graph, root, b)
            if start is None:
                start = graph.call_method("index_select", (root, 0, b.csr[2]))
        mapping = {root: start}
        for n in chain:
            mapping[n] = graph.node_copy(n, lambda x: mapping.get(x, x))
        out = mapping[chain[-1]]
    b.slot_leaves[leaf] = out
    return out


def _fused_program(graph, m: Program, b: Built, knobs: List[int]) -> Node:
    """``gnncompile::message_reduce`` (``message_edges`` for an edge program) over the leaves of
    ``m``, reshaped to the message's shape. The same program over the same inputs and structure
    (PNA's mean, and the mean inside its std) is computed once."""
    key = (isinstance(m, EdgeProgram), tuple((lf.node, lf.side) for lf in m.leaves), tuple(m.code),
           tuple(m.consts), m.reduce, m.width, m.shape, getattr(m, "temperature", None))
    if key in b.programs:
        return b.programs[key]
    out = _emit_program(graph, m, b, knobs)
    b.programs[key] = out
    return out


def _prepare_generated(m: Program, sides: List[int], b: Built, by_slot: Optional[bool] = None,
                       temperature: int = 0) -> None:
    """With $GNNCOMPILE_CODEGEN=auto, the generated kernel of a CPU message_reduce (of a
    message_edges with ``by_slot`` given; of a message_softmax with ``temperature``, t's width) is
    built (or loaded from the disk cache) and registered
    now, at compile time (gnncompile.codegen); the graph calls the same op either way. The
    backward's derivative programs are prepared when the backward is traced (ops/message.py)."""
    from .. import codegen
    if not codegen.enabled():
        return
    # the structure ops' index dtype is their index input's (cached_csr / pair_csr)
    index = fake_tensor(b.csr[0])
    if index is None:
        index = fake_tensor(b.shared.edge_index if b.shared.edge_index is not None else b.shared.dst.tensor)
    leaf = fake_tensor(m.leaves[0].node)
    if leaf is None or index is None or leaf.device.type != "cpu" or leaf.dtype not in (torch.float32, torch.float64):
        return
    # every input's columns: an edge encoder's features have D (its values the width of its weight)
    widths = [lf.depth if lf.side == P.ENC else lf.width for lf in m.leaves]
    if temperature:  # message_softmax: its temperature, of that width, read as one more constant input
        spec = codegen.make_spec(m.code, m.consts, list(sides) + [P.CONST], widths + [temperature], m.width, "sum",
                                 leaf.dtype, index.dtype, op="softmax")
    elif by_slot is None:
        spec = codegen.make_spec(m.code, m.consts, sides, widths, m.width, m.reduce, leaf.dtype, index.dtype)
    else:
        spec = codegen.make_spec(m.code, m.consts, sides, widths, m.width, "sum", leaf.dtype,
                                 index.dtype, op="edges", out_width=m.width, by_slot=by_slot)
    codegen.prepare_spec(spec)


def _emit_program(graph, m: Program, b: Built, knobs: List[int], by_slot: bool = False) -> Node:
    ins, sides = [], []
    for lf in m.leaves:
        node, side = lf.node, lf.side
        if lf.role == "weight":  # an edge encoder's weight, read transposed ([D, W])
            ins.append(graph.call_method("contiguous", (graph.call_method("t", (node,)),)))
            sides.append(side)
            continue
        if lf.role == "zero_bias":  # an edge encoder without a bias
            ins.append(graph.call_method("new_zeros", (node, (1, lf.width))))
            sides.append(side)
            continue
        if side == P.ENC:  # its edge features: read in CSR slot order from a cached copy where that applies
            slots = _cached_slots(graph, node, b, lf.depth)
            ins.append(slots if slots is not None else graph.call_method("reshape", (node, (-1, lf.depth))))
            sides.append(P.ENCS if slots is not None else side)
            continue
        if side == P.EDGE and b.slot_order:
            reordered = _leaf_in_csr_order(graph, node, b, knobs)
            if reordered is not None:
                node, side = reordered, P.SLOT
            else:
                slots = _cached_slots(graph, node, b, lf.width)
                if slots is not None:
                    ins.append(slots)
                    sides.append(P.SLOT)
                    continue
        shape = (1, lf.width) if side == P.CONST else (-1, lf.width)
        ins.append(graph.call_method("reshape", (node, shape)))
        sides.append(side)
    csc: List[Node] = []
    if m.needs_csc and m.x is not None:
        csc = list(b.csc.get(size_key(fake_tensor(m.x).shape[0]), ()))
    if isinstance(m, EdgeProgram):
        _prepare_generated(m, sides, b, by_slot=by_slot)
        out = graph.call_function(targets.MESSAGE_EDGES, (*b.csr, ins, sides, list(m.code), list(m.consts),
                                                          m.width, m.width, by_slot, knobs, csc, None))
        return graph.call_method("reshape", (out, (-1, *m.shape)))
    if isinstance(m, SoftmaxProgram):  # one pass: the softmax aggregation
        t = m.temperature
        tv = fake_tensor(t) if isinstance(t, Node) else None
        _prepare_generated(m, sides, b, temperature=tv.numel() if tv is not None else 1)
        tt = (graph.call_method("reshape", (t, (1, -1))) if isinstance(t, Node)
              else graph.call_method("new_full", (ins[0], (1, 1), float(t))))
        call = graph.call_function(targets.MESSAGE_SOFTMAX, (*b.csr, ins, sides, list(m.code), list(m.consts),
                                                             m.width, tt, knobs, csc))
        out = graph.call_function(operator.getitem, (call, 0))
        return graph.call_method("reshape", (out, (-1, *m.shape)))
    _prepare_generated(m, sides, b)
    call = graph.call_function(targets.MESSAGE_REDUCE, (*b.csr, ins, sides, list(m.code),
                                                        list(m.consts), m.width, m.reduce, knobs, csc, None))
    out = graph.call_function(operator.getitem, (call, 0))
    return graph.call_method("reshape", (out, (-1, *m.shape)))


def _fused(graph, m: Match, b: Built, settings: Settings) -> Tuple[Node, Fused]:
    """The fused replacement of chain ``m``, inserted before its anchor, and its report line."""
    rowptr, _, perm = b.csr
    layer, at = layer_of(m.anchor), m.anchor.name
    b.at = m.anchor
    with graph.inserting_before(m.anchor):
        if isinstance(m, Program):
            knobs = settings.knobs_for(fake_tensor(m.leaves[0].node).device, "message")
            kind = "edges" if isinstance(m, EdgeProgram) else ("message" if m.gathers else "segment")
            if isinstance(m, SoftmaxProgram):
                kind = "message_softmax"
            return _fused_program(graph, m, b, knobs), Fused(kind, m.reduce, layer, False, at, m.describe())
        if isinstance(m, Aggregate):
            knobs = settings.knobs_for(fake_tensor(m.x).device, "spmm")
            return _fused_spmm(graph, m, b, knobs), Fused("spmm", m.reduce, layer, m.weight is not None, at,
                                                          "relu input" if m.relu_input else "")
        if isinstance(m, Softmax):
            knobs = settings.knobs_for(fake_tensor(m.scores).device, "edge_softmax")
            s = graph.call_method("contiguous", (m.scores,))
            out = graph.call_function(targets.EDGE_SOFTMAX, (rowptr, perm, s, knobs))
            return out, Fused("edge_softmax", "softmax", layer, False, at)
        assert isinstance(m, Degree)
        out = graph.call_function(targets.CSR_DEGREE, (rowptr, fake_tensor(m.buffer).dtype))
        return out, Fused("degree", "count", layer, False, at)


def _replace(graph, m: Match, out: Node, order: Dict[Node, int]) -> None:
    anchor = m.anchor
    if m.inplace:  # later readers of the mutated zeros buffer see the result
        pos = order[anchor]
        for u in list(m.buffer.users):
            if u is not anchor and u in order and order[u] > pos:
                u.replace_input_with(m.buffer, out)
    anchor.replace_all_uses_with(out)
    graph.erase_node(anchor)


def _call_of(out: Node) -> Node:
    """The fused op call behind a chain's result (getitem / flatten of it, or itself)."""
    while out.op == "call_function" and out.target is operator.getitem or opname(out) == "flatten":
        out = out.args[0]
    return out


def drop_dead(graph, claimed=()) -> None:
    """Drops unused pure nodes, and the claimed scatters (softmax internals) once nothing reads
    them or the zeros buffer they fill."""
    claimed = set(claimed)
    changed = True
    while changed:
        changed = False
        for n in reversed(list(graph.nodes)):
            if n.op not in ("call_function", "call_method") or n.users:
                continue
            if n.target in _PURE_OPS or opname(n) in PURE and not written_args(n):
                graph.erase_node(n)
                changed = True
            elif n in claimed and all(u is n for u in n.args[0].users):
                claimed.discard(n)
                graph.erase_node(n)
                changed = True


def rewrite(graph, p: Plan, order: Dict[Node, int], copy_structures: bool = False,
            settings: Optional[Settings] = None, attention: bool = False,
            portfolio: Optional[Callable] = None, size_from_first: bool = True,
            slot_copies: bool = True) -> PassReport:
    """Applies plan ``p`` to ``graph``; returns what was fused and what was left, with reasons.
    The kernel knobs of ``settings`` (default: none, the kernels' defaults) go into the fused
    calls as arguments. ``attention``: attention chains become one ``gnncompile::attention``
    (:mod:`.attention`) where ``settings.attention`` is 'fused'. ``portfolio``: the decision of
    each remaining spmm's implementation (:mod:`.portfolio`; None: native). ``size_from_first``:
    structure sizes read from the first tensor of that dim 0 (:func:`_size0`; compiled graphs,
    ``passes.run(hoist=True)``), else from the replaced scatter's buffer (export graphs).
    ``slot_copies``: large per-edge inputs of the graph read from a copy in CSR slot order cached
    with the structure (:func:`_cached_slots`; compiled graphs, not export's)."""
    settings = DEFAULT if settings is None else settings
    report = PassReport()
    writes = Writes.of(graph)
    built = insert_structures(graph, p, copy_structures, report, settings.structure_check, size_from_first)
    for b in built:
        b.writes = writes
        b.slot_order = settings.slot_order
        b.slot_copies_ok = slot_copies
    chains = sorted(((m, b) for b in built for m in b.shared.members), key=lambda mb: order[mb[0].anchor])
    outs = []
    for m, b in chains:
        out, line = _fused(graph, m, b, settings)
        report.fused.append(line)
        if line.kind == "segment":  # reduced in one pass, but the message itself is not fused
            built_by = opname(m.leaves[0].node) or m.leaves[0].node.op
            why = (f"message kept as written ({'; '.join(m.kept)})" if m.kept else
                   f"message built by '{built_by}' reads no gathered node features in an elementwise expression")
            line.note = f"{why}: each row's message is computed beforehand, as written, then reduced here"
            leaf = fake_tensor(m.leaves[0].node)
            if m.reduce in ("max", "min") and leaf is not None and loaded_edges(
                    m.code, [lf.side for lf in m.leaves], [lf.width for lf in m.leaves], m.width, leaf.dtype) is not None:
                line.note += ("; its gradient in one pass per row (gnncompile::extreme_edges_backward: the messages "
                              "equal to the extreme counted, the gradient shared among them, as torch's)")
        outs.append((m, out))
    copies = sum(len(b.slot_copies) for b in built)
    if copies:
        from ..ops.slots import SLOT_COPY_MIN_EDGES
        report.notes.append(
            f"edge inputs read in CSR slot order: {copies} input(s) copied once per structure and tensor "
            f"(gnncompile::cached_slot_rows, kept with the structure; a changed tensor is copied again), read in "
            f"order by the message kernels instead of through perm (inputs of the graph that need no gradient, "
            f">= {SLOT_COPY_MIN_EDGES} edges; settings slot_order=False turns it off)")
    # replace only now: chains may read other chains' anchors (a hop's output feeds the next)
    new_order = node_order(graph)
    for m, out in outs:
        _replace(graph, m, out, new_order)
    for n, why in p.unfused.items():
        report.unfused.append(Unfused(opname(n), layer_of(n), why, n.name))
    drop_dead(graph, p.claimed)
    report.gathers = rewrite_edge_gathers(graph, built, settings)
    lines = {_call_of(out): line for (_, out), line in zip(outs, report.fused)}
    # each of the three attention fusions starts from an edge_softmax call (a GAT / GATv2 spmm's
    # weights are one, a TransformerConv chain is found from one): without any, none can fuse
    # (and their modules need not be imported)
    if attention and settings.attention == "fused" and any(
            n.op == "call_function" and n.target is targets.EDGE_SOFTMAX for n in graph.nodes):
        from .attention import fuse_attention
        from .attention_dot import fuse_attention_dot
        from .attention_v2 import fuse_attention_v2

        if fuse_attention(graph, built, settings, lines, report.fused):
            drop_dead(graph)
        if fuse_attention_v2(graph, built, settings, lines, report.fused):
            drop_dead(graph)
        if fuse_attention_dot(graph, built, settings, lines, report.fused, report, copy_structures):
            drop_dead(graph)
    report.aggregated_first = aggregate_first(graph, lines, settings.reassociate, report.notes)
    report.vendor = choose_implementations(graph, lines, settings, portfolio)
    report.bf16 = gather_bf16(graph, lines, settings, report.fused)
    return report


# ----------------------------------------------------------------------------- gathers
def _grouping_structure(built: List[Built], ref: IndexRef, nkey: str) -> Optional[Tuple[Node, Node]]:
    """(rowptr, perm) of a structure that groups the edges by ``ref`` (a row of an edge_index)
    into ``nkey`` rows: the CSR for the destination row, a CSC for the source row."""
    for b in built:
        if b.shared.edge_index is not ref.tensor:
            continue
        if ref.row == 1 and b.shared.num_dst == nkey:
            return b.csr[0], b.csr[2]
        if ref.row == 0 and nkey in b.csc:
            return b.csc[nkey][0], b.csc[nkey][2]
    return None


def rewrite_edge_gathers(graph, built: List[Built], settings: Settings) -> int:
    """Per-edge gathers of a row of edge_index still in the graph become ``gnncompile::gather``
    where the gathered tensor needs a gradient and a structure grouping the edges by that index
    exists. Returns how many."""
    done = 0
    for n in list(graph.nodes):
        g = gather_of(n)
        if g is None:
            continue
        x, idx = g
        xv, ref = fake_tensor(x), IndexRef.of(idx)
        if xv is None or not xv.requires_grad or xv.dtype not in FLOAT_DTYPES or ref.row is None:
            continue
        structure = _grouping_structure(built, ref, size_key(xv.shape[0]))
        # the structure nodes must come before the gather: move them up if their inputs allow
        if structure is None or not _hoist_structure(graph, structure[0].args[0], n):
            continue
        with graph.inserting_before(n):
            new = graph.call_function(targets.GATHER, (x, idx, *structure, settings.knobs_for(xv.device, "gather")))
        n.replace_all_uses_with(new)
        graph.erase_node(n)
        done += 1
    return done


def _earlier_size(graph, size: Node, before: Node) -> Optional[Node]:
    """A ``size(0)`` node before ``before`` equal to ``size`` (the dim 0 of a tensor defined
    later): the size of the first earlier tensor with the same (possibly symbolic) dim 0."""
    if opname(size) != "size":
        return None
    tv = fake_tensor(size.args[0])
    want = size_key(tv.shape[0]) if tv is not None else None
    for m in graph.nodes:
        if m is before:
            return None
        mv = fake_tensor(m)
        if isinstance(mv, torch.Tensor) and mv.dim() >= 1 and size_key(mv.shape[0]) == want:
            with graph.inserting_before(before):
                return graph.call_method("size", (m, 0))
    return None


def _hoist_structure(graph, call: Node, before: Node) -> bool:
    """Moves a structure op ``call`` (and its getitem outputs) before ``before`` when it comes
    later. Its size arguments may be size nodes of tensors defined after ``before``: they are
    replaced by the size of an earlier tensor with the same (possibly symbolic) dim 0."""
    order = node_order(graph)
    if order[call] < order[before]:
        return True
    new_args = list(call.args)
    for i, a in enumerate(call.args):
        if not isinstance(a, Node) or order[a] < order[before]:
            continue
        sub = _earlier_size(graph, a, before)
        if sub is None:
            return False
        new_args[i] = sub
    call.args = tuple(new_args)
    outs = sorted((u for u in call.users if opname(u) == "getitem"), key=lambda u: order[u])
    before.prepend(call)
    for u in outs:
        before.prepend(u)
    return True


__all__ = ["Built", "node_order", "insert_structures", "rewrite", "drop_dead", "rewrite_edge_gathers"]
