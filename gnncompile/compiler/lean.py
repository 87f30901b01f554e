"""Lean forwards of PyG's common layers for Dynamo to trace: less of PyG's Python, the same graph.

Most of a compiled model's first call is Dynamo tracing PyG's Python (HISTORY section 33: 0.75-0.93
s of a 1.2-1.4 s first epoch on molecule batches): ``MessagePassing.propagate``'s generated code,
``_check_input``, ``_set_size``, ``collect``, the aggregation module, ``scatter`` / ``broadcast``,
``is_compiling()``. For a layer of a class in :data:`LEAN_CLASSES` (exact type: no subclass),
PyG's settings where the lean forward is written for them, and nothing that PyG's path would
honour and the lean one would not (no hooks of any kind, no ``explain``, ``decomposed_layers`` 1,
no method replaced on the instance), Dynamo traces the layer's lean forward instead of
``type(layer).forward``: the same tensor ops in the same order (the ``index_select`` gather, the
message, PyG's ``new_zeros(...).scatter_add_`` with its ``view`` / ``expand_as`` of the index),
so the FX graph the passes see is PyG's graph op for op, and unrewritten it computes PyG's
result bit for bit (tests/compiler/test_lean.py). Inputs the lean forward is not written for
(a bipartite tuple, a ``SparseTensor`` or ``EdgeIndex``, an explicit ``size``, ...) take PyG's
forward inside the same trace.

One exception to "op for op": within one trace (one output graph), GCNConv layers called on the
same edge_index value (the same graph node, not changed in place since: its fake tensor's version),
the same edge_weight value or None, the same ``improved`` / ``add_self_loops``, x's dtype and the
same number of nodes (an edge_weight that needs no gradient) trace PyG's ``gcn_norm`` once (:func:`gcn_norm_part`); the later layers reuse
its result and trace only ``lin`` and the propagation (:func:`gcn_propagate_part`). The same ops
on the same inputs, computed once instead of once per layer: the same bits, less to trace (PyG's
graph with one normalization, which the hoist pass would otherwise merge after tracing). Any
condition not met traces the layer's whole lean forward; :data:`NORM_MEMO` ``[0] = False`` turns
the sharing off.

How: while a gnncompile-compiled callable runs (:class:`scope`, entered with
:func:`~gnncompile.compiler.backend.dynamic_output_shapes` by the compiled module, the compiled
function and ``explain``), Dynamo's call of an ``nn.Module`` variable
(``UnspecializedNNModuleVariable.call_function``) is routed here first. The user's module
objects and classes are never modified: the substitution lives in Dynamo's tracer, for the
frames gnncompile compiles, and every condition it checked is guarded (the hook dicts' lengths,
the settings' values, the instance dicts not holding a replaced method, the aggregation module's
type), so a change after compiling (a hook registered, ``explain`` turned on) recompiles through
PyG's path. Other backends and plain ``torch.compile`` are not affected. ``settings={"choices":
{"lean_layers": "off"}}`` traces PyG's code as written; ``explain()`` lists the layers that took
the lean forward and, for a layer of a listed class that did not, why.
"""
from __future__ import annotations

import functools
import threading
import weakref
from typing import Callable, Dict, List, Optional, Tuple

import torch
from torch import Tensor

from .._log import get_logger

_log = get_logger(__name__)

from ..settings import LEAN_MODES  # noqa: E402  (settings.choices['lean_layers'])

# A module's hook dicts (Dynamo's own fast path checks the same six) and MessagePassing's.
_MODULE_HOOKS = ("_backward_hooks", "_backward_pre_hooks", "_forward_hooks", "_forward_hooks_with_kwargs",
                 "_forward_pre_hooks", "_forward_pre_hooks_with_kwargs")
_GLOBAL_HOOKS = ("_global_backward_pre_hooks", "_global_backward_hooks", "_global_forward_hooks",
                 "_global_forward_pre_hooks")
_MP_HOOKS = ("_propagate_forward_pre_hooks", "_propagate_forward_hooks", "_message_forward_pre_hooks",
             "_message_forward_hooks", "_aggregate_forward_pre_hooks", "_aggregate_forward_hooks",
             "_message_and_aggregate_forward_pre_hooks", "_message_and_aggregate_forward_hooks")
# methods PyG's path calls through the instance: one set on the instance (explain and
# decomposed_layers set ``propagate`` there) is honoured by PyG's path, so it declines the lean one
_METHODS = ("forward", "propagate", "collect", "_collect", "message", "aggregate", "update",
            "message_and_aggregate", "explain_message", "_check_input", "_set_size", "_index_select",
            "_lift", "edge_update", "edge_updater")


# ----------------------------------------------------------------------------- the lean forwards
def _scatter_sum(src: Tensor, index: Tensor, dim: int, dim_size) -> Tensor:
    """PyG's ``scatter(src, index, dim, dim_size, reduce='sum')`` for a plain tensor index: the
    same ops in the same order (``torch_geometric.utils._scatter.scatter`` and ``broadcast``)."""
    dim = src.dim() + dim if dim < 0 else dim
    size = src.size()[:dim] + (dim_size, ) + src.size()[dim + 1:]
    index = index.view(((1, ) * dim) + (-1, ) + ((1, ) * (src.dim() - dim - 1))).expand_as(src)
    return src.new_zeros(size).scatter_add_(dim, index, src)


def _plain(t) -> bool:
    return isinstance(t, Tensor) and type(t) is Tensor and t.layout == torch.strided


def _check_edge_index(edge_index: Tensor) -> None:
    """``MessagePassing._check_input`` for a plain tensor: the same errors."""
    if edge_index.dtype not in (torch.uint8, torch.int8, torch.int16, torch.int32, torch.int64):
        raise ValueError(f"Expected 'edge_index' to be of integer type (got '{edge_index.dtype}')")
    if edge_index.dim() != 2:
        raise ValueError(f"Expected 'edge_index' to be two-dimensional (got {edge_index.dim()} dimensions)")
    if edge_index.size(0) != 2:
        raise ValueError(f"Expected 'edge_index' to have size '2' in the first dimension (got "
                         f"'{edge_index.size(0)}')")


def _plain_inputs(x, edge_index) -> bool:
    return _plain(x) and x.dim() == 2 and _plain(edge_index)


def gin_forward(self, x, edge_index, size=None):
    """``GINConv.forward`` (sum aggregation, flow source_to_target, node_dim -2)."""
    if not (_plain_inputs(x, edge_index) and size is None):
        return _PYG_FORWARD["GINConv"](self, x, edge_index, size)
    _check_edge_index(edge_index)
    edge_index_i = edge_index[1]
    edge_index_j = edge_index[0]
    x_j = x.index_select(-2, edge_index_j)
    out = _scatter_sum(x_j, edge_index_i, -2, x.size(-2))
    out = out + (1 + self.eps) * x
    return self.nn(out)


def gine_forward(self, x, edge_index, edge_attr=None, size=None):
    """``GINEConv.forward`` (sum aggregation, flow source_to_target, node_dim -2)."""
    if not (_plain_inputs(x, edge_index) and size is None and _plain(edge_attr)):
        return _PYG_FORWARD["GINEConv"](self, x, edge_index, edge_attr, size)
    _check_edge_index(edge_index)
    edge_index_i = edge_index[1]
    edge_index_j = edge_index[0]
    x_j = x.index_select(-2, edge_index_j)
    if self.lin is None and x_j.size(-1) != edge_attr.size(-1):
        raise ValueError("Node and edge feature dimensionalities do not match. Consider setting the "
                         "'edge_dim' attribute of 'GINEConv'")
    if self.lin is not None:
        edge_attr = self.lin(edge_attr)
    out = (x_j + edge_attr).relu()
    out = _scatter_sum(out, edge_index_i, -2, x.size(-2))
    out = out + (1 + self.eps) * x
    return self.nn(out)


def gcn_forward(self, x, edge_index, edge_weight=None):
    """``GCNConv.forward`` with ``normalize=True, cached=False`` (sum aggregation, flow
    source_to_target, node_dim -2): ``gcn_norm`` for a plain edge_index, then the propagation."""
    norm = gcn_norm_part(self, x, edge_index, edge_weight)
    if norm is None:
        return _PYG_FORWARD["GCNConv"](self, x, edge_index, edge_weight)
    return gcn_propagate_part(self, x, norm[0], norm[1])


def gcn_norm_part(self, x, edge_index, edge_weight=None):
    """The first half of :func:`gcn_forward`: PyG's ``gcn_norm(edge_index, edge_weight,
    x.size(-2), improved, add_self_loops, flow, x.dtype)`` as the pair (edge_index, edge_weight),
    or None where the lean forward is not written for the inputs (PyG's forward then)."""
    if not (_plain_inputs(x, edge_index) and (edge_weight is None or _plain(edge_weight))):
        return None
    num_nodes = x.size(-2)
    fill_value = 2. if self.improved else 1.
    if self.add_self_loops:
        edge_index, edge_weight = add_remaining_self_loops(edge_index, edge_weight, fill_value, num_nodes)
    if edge_weight is None:
        edge_weight = torch.ones((edge_index.size(1), ), dtype=x.dtype, device=edge_index.device)
    row, col = edge_index[0], edge_index[1]
    if edge_weight.dim() != 1 or col.dim() != 1:
        return None  # (PyG raises there)
    deg = _scatter_sum(edge_weight, col, 0, num_nodes)
    deg_inv_sqrt = deg.pow_(-0.5)
    deg_inv_sqrt.masked_fill_(deg_inv_sqrt == float('inf'), 0)
    edge_weight = deg_inv_sqrt[row] * edge_weight * deg_inv_sqrt[col]
    return edge_index, edge_weight


def gcn_propagate_part(self, x, edge_index, edge_weight):
    """The second half of :func:`gcn_forward`: ``self.lin(x)``, then ``propagate(edge_index,
    x=x, edge_weight=edge_weight)`` with the normalized edge_index and edge_weight."""
    x = self.lin(x)
    _check_edge_index(edge_index)
    edge_index_i = edge_index[1]
    edge_index_j = edge_index[0]
    x_j = x.index_select(-2, edge_index_j)
    out = edge_weight.view(-1, 1) * x_j
    out = _scatter_sum(out, edge_index_i, -2, x.size(-2))
    if self.bias is not None:
        out = out + self.bias
    return out


# class name -> (lean forward, {attribute: allowed values}): settings the lean forward is written for
_SPECS: Dict[str, Tuple[Callable, Dict[str, tuple]]] = {
    "GINConv": (gin_forward, {}),
    "GINEConv": (gine_forward, {}),
    "GCNConv": (gcn_forward, {"normalize": (True, ), "cached": (False, ), "_cached_edge_index": (None, )}),
}
_COMMON = {"_explain": (None, False), "_decomposed_layers": (1, ), "flow": ("source_to_target", ),
           "node_dim": (-2, ), "aggr": ("add", "sum"), "_edge_mask": (None, ), "fuse": (True, False)}
#: the PyG classes (exact type) whose layers can take a lean forward
LEAN_CLASSES = tuple(_SPECS)
add_remaining_self_loops = None  # PyG's (set by _load; Dynamo substitutes gnncompile.ops.loops' op for it)
_PYG_FORWARD: Dict[str, Callable] = {}
_CLASSES: Dict[type, str] = {}  # the PyG class objects -> name
_SUM: List[type] = []  # torch_geometric.nn.aggr.SumAggregation


def _load() -> bool:
    global add_remaining_self_loops
    if _CLASSES:
        return True
    try:
        from torch_geometric.nn import GCNConv, GINConv, GINEConv
        from torch_geometric.nn.aggr import SumAggregation
        from torch_geometric.utils import add_remaining_self_loops as pyg_add
    except ImportError:  # pragma: no cover - PyG is a dependency
        return False
    for cls in (GINConv, GINEConv, GCNConv):
        _PYG_FORWARD[cls.__name__] = cls.__dict__["forward"]
        _CLASSES[cls] = cls.__name__
    add_remaining_self_loops = pyg_add
    _SUM.append(SumAggregation)
    return True


# ----------------------------------------------------------------------------- eligibility
def decline(module, length: Callable, value: Callable, aggr_type: Callable) -> str:
    """Why ``module`` (of a class in :data:`LEAN_CLASSES`) keeps PyG's forward, '' if it may
    take the lean one. ``length(obj, name)`` is the length of the hook dict ``obj.name`` (obj:
    'self', 'aggr' or 'globals'), ``value(name)`` an attribute's value, ``aggr_type()`` the
    aggregation module's type: plain reads for explain, guarded reads while Dynamo traces."""
    name = _CLASSES.get(type(module))
    if name is None:
        return "not one of " + ", ".join(LEAN_CLASSES) + " (exact type)"
    for attr in _MODULE_HOOKS:
        if length("self", attr):
            return f"a module hook ({attr})"
    for attr in _GLOBAL_HOOKS:
        if length("globals", attr):
            return f"a global module hook ({attr})"
    for attr in _MP_HOOKS:
        if length("self", attr):
            return f"a message-passing hook ({attr})"
    spec = dict(_COMMON, **_SPECS[name][1])
    for attr, allowed in spec.items():
        v = value(attr)
        if not any(v is a or (type(v) is type(a) and v == a) for a in allowed):
            return f"{attr}={v!r} (the lean forward is written for {' or '.join(map(repr, allowed))})"
    if aggr_type() is not _SUM[0]:
        return f"aggregation {aggr_type().__name__} (the lean forward sums)"
    for attr in _MODULE_HOOKS:
        if length("aggr", attr):
            return f"a hook on its aggregation module ({attr})"
    return ""


def why_not(module) -> str:
    """:func:`decline` read from the module object itself (no tracing)."""
    import torch.nn.modules.module as mm

    def length(obj, attr):
        return len(getattr(mm if obj == "globals" else module.aggr_module if obj == "aggr" else module, attr))
    if not _load():
        return "PyG not found"
    for attr in _METHODS:
        if attr in module.__dict__:
            return f"{attr} set on the instance"
    return decline(module, length, lambda a: getattr(module, a, None), lambda: type(module.aggr_module))


# ----------------------------------------------------------------------------- the scope
_local = threading.local()


class Record:
    """What the lean substitution did for one compiled model: layer -> kind taken, or why not."""

    def __init__(self) -> None:
        self.taken: Dict[int, Tuple[weakref.ref, str]] = {}
        self.declined: Dict[int, Tuple[weakref.ref, str]] = {}

    def note(self, module, why: str) -> None:
        entry = (weakref.ref(module), why or _CLASSES.get(type(module), type(module).__name__))
        if why:
            self.declined[id(module)] = entry
            self.taken.pop(id(module), None)
        else:
            self.taken[id(module)] = entry

    def lines(self, model) -> List[str]:
        """'convs.0 (GINConv)' per layer that took the lean forward, then 'convs.3 (GINConv):
        PyG's forward: why' per layer that did not (as last traced)."""
        names = {id(m): n for n, m in model.named_modules()} if isinstance(model, torch.nn.Module) else {}
        out = []
        for table, fmt in ((self.taken, "{} ({}): lean forward"), (self.declined, "{} ({}): PyG's forward: {}")):
            for key, (ref, what) in table.items():
                m = ref()
                if m is None:
                    continue
                label = names.get(key, "<model>") or "<model>"
                out.append(fmt.format(label, type(m).__name__, what))
        return out


class scope:
    """Context manager: while active (and ``enabled``), Dynamo traces the lean forward of the
    layers that may take it, noting what it did in ``record``; enabled or not, it marks the thread
    as running a gnncompile-compiled call (:mod:`gnncompile.compiler.trims`). Cheap (four
    attribute writes)."""

    __slots__ = ("_rec", "_prev", "_prev_active")

    def __init__(self, enabled: bool, record: Optional[Record] = None) -> None:
        self._rec = (record if record is not None else Record()) if enabled and AVAILABLE[0] else None

    def __enter__(self):
        # (``active``: a gnncompile-compiled call is running, lean forwards on or off;
        # gnncompile.compiler.trims reads it)
        self._prev = getattr(_local, "record", None)
        self._prev_active = getattr(_local, "active", False)
        _local.record = self._rec
        _local.active = True
        return self

    def __exit__(self, *exc):
        _local.record = self._prev
        _local.active = self._prev_active
        return False


# ----------------------------------------------------------------------------- Dynamo's side
AVAILABLE = [False]  # set by install() where this torch's Dynamo has the expected hook point


def _dynamo_choice(var, tx) -> Optional[Callable]:
    """The lean forward for the module variable ``var`` (guards installed for every condition
    read), or None: Dynamo's own path."""
    from torch._dynamo.guards import GuardBuilder, install_guard
    from torch._dynamo.source import AttrSource
    from torch._dynamo.variables import nn_module as nm

    mod = var.value
    name = _CLASSES.get(type(mod))
    if name is None or not var.source:
        return None
    # Dynamo's fast path to forward (no patched __call__ / _call_impl, no forward on the instance)
    if not (isinstance(mod.__call__, type(mod.forward)) and mod.__call__.__func__ is nm.unpatched_nn_module_call
            and mod._call_impl.__func__ is nm.unpatched_nn_module_call_impl):
        return None
    for attr in _METHODS:
        if var.has_key_in_generic_dict(tx, attr):
            _record_decline(mod, f"{attr} set on the instance")
            return None
    for attr in _METHODS:
        install_guard(var.source.make_guard(functools.partial(GuardBuilder.NOT_PRESENT_IN_GENERIC_DICT, attr=attr)))
    aggr_vt: list = []

    def realize(vt):
        return vt.realize() if hasattr(vt, "realize") else vt

    def aggr():
        if not aggr_vt:
            aggr_vt.append(realize(var.var_getattr(tx, "aggr_module")))
        return aggr_vt[0]

    def length(obj, attr):
        owner = tx.nn_modules_globals_vt if obj == "globals" else aggr() if obj == "aggr" else var
        n = realize(owner.var_getattr(tx, attr)).len()
        if obj == "self" and attr in _MP_HOOKS:
            # (a module's own hook dicts are guarded as Dynamo guards them: not at all by
            # default, torch._dynamo.config.skip_nnmodule_hook_guards; PyG's path skips
            # MessagePassing's hooks under torch.compile, but a layer with one keeps it)
            install_guard(AttrSource(var.source, attr).make_guard(GuardBuilder.SEQUENCE_LENGTH))
        return n

    def value(attr):
        v = realize(var.var_getattr(tx, attr)).as_python_constant()
        install_guard(AttrSource(var.source, attr).make_guard(GuardBuilder.CONSTANT_MATCH))
        return v

    def aggr_type():
        vt = aggr()
        if getattr(vt, "source", None) is not None:
            install_guard(vt.source.make_guard(GuardBuilder.TYPE_MATCH))
        return type(vt.value) if hasattr(vt, "value") else vt.python_type()

    try:
        why = decline(mod, length, value, aggr_type)
    except Exception as e:  # an attribute Dynamo cannot read as a constant: PyG's path
        why = f"not traceable as a constant ({type(e).__name__})"
    _record_decline(mod, why)
    return None if why else _SPECS[name][0]


def _record_decline(mod, why: str) -> None:
    rec = getattr(_local, "record", None)
    if rec is not None:
        rec.note(mod, why)


#: ``NORM_MEMO[0] = False``: every GCNConv layer traces its own ``gcn_norm`` (as before the memo)
NORM_MEMO = [True]
_MEMO_ATTR = "_gnncompile_gcn_norm_memo"


def _fake(vt):
    """The fake tensor of a plain TensorVariable ``vt`` (exact type), else None."""
    from torch._dynamo.variables.tensor import TensorVariable

    if type(vt) is not TensorVariable or vt.python_type() is not Tensor:
        return None
    v = vt.as_proxy().node.meta.get("example_value")
    return v if isinstance(v, Tensor) and v.layout == torch.strided else None


def _size_key(s):
    """x.size(-2) as a hashable key: the int, or the SymInt's expression."""
    if isinstance(s, int):
        return ("int", s)
    node = getattr(s, "node", None)
    expr = getattr(node, "expr", None)
    return None if expr is None else ("sym", expr)


def _gcn_memo_call(var, tx, args, kwargs):
    """A GCNConv layer's lean forward traced with its normalization shared: within one trace
    (one output graph), ``gcn_norm`` of the same edge_index node (unchanged since: its fake
    tensor's version), the same edge_weight node or None, the same ``improved`` and
    ``add_self_loops``, x's dtype and the same number of nodes (x.size(-2), the same expression)
    is traced once; a later layer reuses its result and traces only ``lin`` and the propagation.
    None where any condition is not met: the caller traces :func:`gcn_forward` whole."""
    from torch._dynamo.guards import GuardBuilder, install_guard
    from torch._dynamo.source import AttrSource
    from torch._dynamo.variables import ConstantVariable, TupleVariable, UserFunctionVariable

    if not NORM_MEMO[0] or len(args) not in (2, 3) or set(kwargs) - {"edge_weight"} or (len(args) == 3 and kwargs):
        return None
    def realize(vt):  # (an input not yet wrapped: what the traced forward's first use would do)
        return vt.realize() if hasattr(vt, "realize") else vt
    x_vt, ei_vt = realize(args[0]), realize(args[1])
    ew_vt = args[2] if len(args) == 3 else kwargs.get("edge_weight")
    ew_vt = None if ew_vt is None else realize(ew_vt)
    if ew_vt is not None and isinstance(ew_vt, ConstantVariable) and ew_vt.value is None:
        ew_vt = None
    fx, fei = _fake(x_vt), _fake(ei_vt)
    few = None if ew_vt is None else _fake(ew_vt)
    if fx is None or fei is None or (ew_vt is not None and few is None) or fx.dim() != 2:
        return None
    if few is not None and few.requires_grad:
        # (gradients into edge_weight through a shared normalization would be summed before its
        # backward instead of after each layer's: another order of float sums, so not PyG's bits)
        return None
    size = _size_key(fx.size(-2))
    if size is None:
        return None
    consts = []
    for attr in ("improved", "add_self_loops"):
        v = var.var_getattr(tx, attr)
        v = (v.realize() if hasattr(v, "realize") else v).as_python_constant()
        if type(v) is not bool:
            return None
        install_guard(AttrSource(var.source, attr).make_guard(GuardBuilder.CONSTANT_MATCH))
        consts.append(v)
    tracer = tx.output.current_tracer
    ei_node = ei_vt.as_proxy().node
    ew_node = None if ew_vt is None else ew_vt.as_proxy().node
    key = (id(tracer), ei_node, ew_node, consts[0], consts[1], fx.dtype, size)
    memo = getattr(tx.output, _MEMO_ATTR, None)
    if memo is None:
        memo = {}
        setattr(tx.output, _MEMO_ATTR, memo)
    versions = (fei._version, None if few is None else few._version)
    hit = memo.get(key)
    norm = None
    if hit is not None:
        h_tracer, h_versions, h_norm, h_out_versions = hit
        outs = [_fake(v) for v in h_norm.items]
        nodes = [v.as_proxy().node for v in h_norm.items]
        if (h_tracer is tracer and h_versions == versions and all(o is not None for o in outs)
                and tuple(o._version for o in outs) == h_out_versions
                and not any(getattr(n, "_erased", True) for n in nodes)
                and all(n.graph is tracer.graph for n in nodes)):
            norm = h_norm
    if norm is None:
        res = UserFunctionVariable(gcn_norm_part).call_function(
            tx, [var, x_vt, ei_vt, ew_vt if ew_vt is not None else ConstantVariable.create(None)], {})
        if not (isinstance(res, TupleVariable) and len(res.items) == 2):  # as gcn_forward: PyG's forward
            return UserFunctionVariable(_PYG_FORWARD["GCNConv"]).call_function(
                tx, [var, x_vt, ei_vt, ew_vt if ew_vt is not None else ConstantVariable.create(None)], {})
        outs = [_fake(v) for v in res.items]
        if any(o is None for o in outs):  # pragma: no cover - gcn_norm_part returns tensors
            memo.pop(key, None)
        else:
            memo[key] = (tracer, versions, res, tuple(o._version for o in outs))
        norm = res
    return UserFunctionVariable(gcn_propagate_part).call_function(tx, [var, x_vt] + list(norm.items), {})


def install() -> None:
    """Routes Dynamo's calls of module variables through :func:`_dynamo_choice` while a
    :class:`scope` is active (once per process; a no-op where this torch lacks the hook point or
    PyG is missing: explain() then lists no lean layer)."""
    if getattr(install, "done", False):
        return
    install.done = True
    if not _load():
        return
    try:
        from torch._dynamo import variables as V
        from torch._dynamo.variables import nn_module as nm

        cls = nm.UnspecializedNNModuleVariable
        orig = cls.call_function
        for need in ("unpatched_nn_module_call", "unpatched_nn_module_call_impl", "record_nn_module_stack",
                     "guard_to_detect_forward_monkeypatching"):
            getattr(nm, need)
        V.UserFunctionVariable  # noqa: B018
    except Exception as e:  # pragma: no cover - another torch
        _log.info("lean forwards unavailable in this torch (%s): PyG's code is traced as written", e)
        return

    def call_function(self, tx, args, kwargs):
        if getattr(_local, "record", None) is not None and type(self) is cls:
            try:
                fn = _dynamo_choice(self, tx)
            except Exception as e:  # another torch's Dynamo internals (an attribute or guard kind
                # missing): the layer is traced through PyG's code, as without lean forwards
                if not getattr(install, "warned", False):
                    install.warned = True
                    _log.info("lean forwards: reading %s failed inside Dynamo (%s: %s); PyG's code is traced "
                              "as written", type(self.value).__name__, type(e).__name__, e)
                if type(self.value) in _CLASSES:
                    _record_decline(self.value, f"not readable in this torch's Dynamo ({type(e).__name__})")
                fn = None
            if fn is not None:
                mod = self.value
                nm.guard_to_detect_forward_monkeypatching(self.source, mod)
                try:
                    with nm.record_nn_module_stack(str(id(mod)), self.get_nn_module_stack_source(), tx, mod):
                        if fn is gcn_forward:
                            out = _gcn_memo_call(self, tx, list(args), dict(kwargs))
                            if out is not None:
                                return out
                        return V.UserFunctionVariable(fn).call_function(tx, [self] + list(args), kwargs)
                except Exception:  # a graph break inside (Dynamo restarts without inlining the
                    rec = getattr(_local, "record", None)  # call) or an error: not taken
                    if rec is not None:
                        rec.taken.pop(id(mod), None)
                    raise
        return orig(self, tx, args, kwargs)

    call_function.__wrapped__ = orig
    cls.call_function = call_function
    AVAILABLE[0] = True


__all__ = ["LEAN_CLASSES", "LEAN_MODES", "Record", "scope", "install", "why_not", "decline",
           "gin_forward", "gine_forward", "gcn_forward",
           "gcn_norm_part", "gcn_propagate_part", "NORM_MEMO"]
