"""What the rewrites may assume about a node: the semantics guard of the passes.

A rewrite replaces nodes by a fused op that computes what they computed, at another place in
the graph and from their inputs. That is exact only when

* every argument of every replaced call is one the rewrite models (:func:`unmodelled`): a
  ``torch.div(a, b, rounding_mode='floor')`` is not a true division, an ``out=`` tensor is a
  write, ``gelu(approximate='tanh')`` is another function. :data:`SIGNATURES` lists, for every
  operation the passes read, each argument it can take (torch's schemas and the functional
  signatures; ``self`` named ``input``) and how it is handled: an operand the rewrite reads, a
  number parameter it models, anything (shapes of views), or the one value it assumes (the
  default); any other value, or an argument not listed, leaves the node as it is;
* nothing writes in place, between the place a value was read and the place the fused op
  reads it, to that value or to any tensor sharing its memory (:class:`Writes`): ``m.add_(y)``
  after ``m = x[j] * 2``, ``h.relu_()`` between ``h[j]`` and the scatter, a write through a view.

Both are checked by the matchers (:mod:`.match`, :mod:`.messages`) and by the algebraic rewrites
(:mod:`.algebra`); a node that fails is kept as written (a leaf computed outside the program) or
leaves its chain unfused, and ``explain()`` says why.
"""
from __future__ import annotations

import contextlib
import functools
import inspect
import math
import operator
import threading
from collections import defaultdict
from typing import Any, Dict, Iterable, List, Optional, Tuple

import torch
from torch.fx import Node

from .canonical import opname

# ----------------------------------------------------------------------------- signatures
OPERAND = "operand"  # a tensor or number the rewrite reads as a value
PARAM = "param"  # a number the rewrite models (a Node there is refused by the caller)
ANY = "any"  # anything: shapes and dims of views, dtype / device of a conversion
INPLACE = "inplace"  # F.<act>(..., inplace=...): a write, handled by :class:`Writes`
VARARGS = "varargs"  # this and every further positional argument: anything (view(x, -1, H, C))

_OUT = ("out", None)


def _unary(*extra) -> tuple:
    return (("input", OPERAND),) + tuple(extra) + (_OUT,)


# op name (canonical.opname) -> its arguments in positional order, (name, handling). A handling
# that is not one of the four kinds above is the value the rewrite assumes (the default).
SIGNATURES: Dict[str, Tuple[Tuple[str, Any], ...]] = {
    # message programs: binary operators
    "add": (("input", OPERAND), ("other", OPERAND), ("alpha", 1), _OUT),
    "sub": (("input", OPERAND), ("other", OPERAND), ("alpha", 1), _OUT),
    "rsub": (("input", OPERAND), ("other", OPERAND), ("alpha", 1), _OUT),
    "mul": (("input", OPERAND), ("other", OPERAND), _OUT),
    "div": (("input", OPERAND), ("other", OPERAND), ("rounding_mode", None), _OUT),
    "pow": (("input", OPERAND), ("exponent", OPERAND), _OUT),
    # unary functions
    "relu": (("input", OPERAND), ("inplace", INPLACE), _OUT),
    "sigmoid": _unary(), "tanh": _unary(), "exp": _unary(), "log": _unary(), "sqrt": _unary(),
    "neg": _unary(), "negative": _unary(), "abs": _unary(),
    "leaky_relu": (("input", OPERAND), ("negative_slope", PARAM), ("inplace", INPLACE), _OUT),
    "elu": (("input", OPERAND), ("alpha", PARAM), ("inplace", INPLACE), ("scale", 1), ("input_scale", 1), _OUT),
    "softplus": (("input", OPERAND), ("beta", PARAM), ("threshold", PARAM), _OUT),
    "gelu": (("input", OPERAND), ("approximate", "none"), _OUT),
    "clamp": (("input", OPERAND), ("min", PARAM), ("max", PARAM), _OUT),
    "clip": (("input", OPERAND), ("min", PARAM), ("max", PARAM), _OUT),
    "clamp_min": (("input", OPERAND), ("min", PARAM), _OUT),
    "clamp_max": (("input", OPERAND), ("max", PARAM), _OUT),
    # views and copies that keep each edge's values in order (the dtype is checked separately)
    "view": (("input", OPERAND), ("size", VARARGS), ("dtype", ANY)),
    "reshape": (("input", OPERAND), ("shape", VARARGS)),
    "unsqueeze": (("input", OPERAND), ("dim", ANY)),
    "squeeze": (("input", OPERAND), ("dim", ANY)),
    "flatten": (("input", OPERAND), ("start_dim", ANY), ("end_dim", ANY), ("out_dim", None)),
    "contiguous": (("input", OPERAND), ("memory_format", ANY)),
    "clone": (("input", OPERAND), ("memory_format", ANY), _OUT),
    "stack": (("tensors", OPERAND), ("dim", ANY), _OUT),
    "float": (("input", OPERAND), ("memory_format", ANY)),
    "type_as": (("input", OPERAND), ("other", ANY)),
    "detach": (("input", OPERAND),),
    # gathers and scatters
    "index_select": (("input", OPERAND), ("dim", ANY), ("index", OPERAND), _OUT),
    "getitem": (("input", OPERAND), ("index", ANY)),
    "scatter_add": (("input", OPERAND), ("dim", ANY), ("index", OPERAND), ("src", OPERAND), _OUT),
    "scatter_add_": (("input", OPERAND), ("dim", ANY), ("index", OPERAND), ("src", OPERAND)),
    "scatter_reduce": (("input", OPERAND), ("dim", ANY), ("index", OPERAND), ("src", OPERAND),
                       ("reduce", ANY), ("include_self", ANY), _OUT),
    "scatter_reduce_": (("input", OPERAND), ("dim", ANY), ("index", OPERAND), ("src", OPERAND),
                        ("reduce", ANY), ("include_self", ANY)),
    "index_add": (("input", OPERAND), ("dim", ANY), ("index", OPERAND), ("source", OPERAND), ("alpha", ANY), _OUT),
    "index_add_": (("input", OPERAND), ("dim", ANY), ("index", OPERAND), ("source", OPERAND), ("alpha", ANY)),
    # the algebraic rewrites
    "linear": (("input", OPERAND), ("weight", OPERAND), ("bias", OPERAND), _OUT),
    "cat": (("tensors", OPERAND), ("dim", ANY), _OUT),
}
# `to` keeps every value when it changes neither dtype nor device (the caller checks both):
# any argument of it is fine then.
VALUE_PRESERVING = ("to",)

# The operations the message builder models (:mod:`.messages`), for the enumeration test.
MESSAGE_OPS = ("add", "sub", "rsub", "mul", "div", "pow", "relu", "sigmoid", "tanh", "exp", "log", "sqrt",
               "neg", "negative", "abs", "leaky_relu", "elu", "softplus", "gelu", "clamp", "clip",
               "clamp_min", "clamp_max", "view", "reshape", "unsqueeze", "squeeze", "flatten", "contiguous",
               "clone", "stack", "float", "type_as", "to")


def _same(a: Any, b: Any) -> bool:
    if isinstance(a, Node) or isinstance(b, Node):
        return False
    if isinstance(a, float) and isinstance(b, (int, float)) and math.isnan(a):
        return False
    try:
        return type(a) in (int, float, bool, str, type(None)) and a == b and (a is None) == (b is None)
    except Exception:
        return False


def unmodelled(n: Node) -> Optional[str]:
    """Why the passes do not model call ``n`` as its name says (an argument not listed in
    :data:`SIGNATURES`, or listed with a value other than the one assumed), or None."""
    name = opname(n)
    if name is None or name in VALUE_PRESERVING:
        return None
    sig = SIGNATURES.get(name)
    if sig is None:
        return f"'{name}' is not an operation the passes model"
    va = next((i for i, (_, rule) in enumerate(sig) if rule == VARARGS), None)
    if len(n.args) > len(sig) and va is None:
        return f"'{name}' called with {len(n.args)} positional arguments"
    given = [(sig[i] if va is None or i < va else sig[va], v) for i, v in enumerate(n.args)]
    names = {p[0]: p for p in sig}
    for k, v in n.kwargs.items():
        if k not in names:
            return f"'{name}' with keyword argument {k}={_show(v)}"
        given.append((names[k], v))
    for (pname, rule), v in given:
        if rule in (OPERAND, PARAM, ANY, INPLACE, VARARGS):
            continue
        if v is rule or _same(v, rule):
            continue
        return f"'{name}' with {pname}={_show(v)}"
    return None


def _show(v: Any) -> str:
    return f"'{v.name}'" if isinstance(v, Node) else repr(v)


# ----------------------------------------------------------------------------- writes
# Results that share memory with their first argument (over-approximated: a `reshape` or `to`
# that copies is still counted as a view; a wrong "alias" only makes the guard stricter).
_VIEWS = {
    "view", "view_as", "reshape", "reshape_as", "expand", "expand_as", "broadcast_to", "unsqueeze", "squeeze",
    "flatten", "unflatten", "transpose", "t", "permute", "narrow", "select", "contiguous", "detach", "as_strided",
    "split", "chunk", "unbind", "split_with_sizes", "tensor_split", "movedim", "moveaxis", "swapaxes", "swapdims",
    "diagonal", "real", "imag", "view_as_real", "view_as_complex", "alias", "unfold", "to", "type", "float",
    "double", "half", "bfloat16", "type_as", "cpu", "cuda", "requires_grad_",
}
_NOT_WRITES = {"requires_grad_", "retain_grad", "detach_", "share_memory_", "record_stream"}
_IOPS = {operator.iadd, operator.isub, operator.imul, operator.itruediv, operator.ifloordiv, operator.imod,
         operator.ipow, operator.iand, operator.ior, operator.ixor, operator.ilshift, operator.irshift}


@functools.lru_cache(maxsize=None)
def _inplace_position(fn) -> Optional[int]:
    """Position of the ``inplace`` parameter of a Python function (F.relu, F.dropout ...)."""
    try:
        params = list(inspect.signature(fn).parameters)
    except (TypeError, ValueError):
        return None
    return params.index("inplace") if "inplace" in params else None


def _nodes(v: Any) -> List[Node]:
    if isinstance(v, Node):
        return [v]
    if isinstance(v, (list, tuple)):
        return [x for x in v if isinstance(x, Node)]
    return []


def written_args(n: Node) -> List[Node]:
    """The graph values call ``n`` writes in place."""
    if n.op not in ("call_function", "call_method"):
        return []
    out: List[Node] = _nodes(n.kwargs.get("out"))
    first = n.args[0] if n.args and isinstance(n.args[0], Node) else None
    t = n.target
    if first is not None:
        name = t if n.op == "call_method" else getattr(t, "__name__", "")
        if t is operator.setitem or t in _IOPS:
            out.append(first)
        elif isinstance(name, str) and name.endswith("_") and not name.startswith("_") and name not in _NOT_WRITES:
            out.append(first)
        elif n.op == "call_function" and callable(t):
            pos = _inplace_position(t) if not isinstance(t, torch._ops.OpOverload) else None
            inplace = n.kwargs.get("inplace", n.args[pos] if pos is not None and pos < len(n.args) else False)
            if inplace is True:
                out.append(first)
    schema = getattr(t, "_schema", None)
    if schema is not None:  # an op overload with mutable arguments (torch.ops.aten.add_.Tensor ...)
        for i, a in enumerate(schema.arguments):
            if a.alias_info is not None and a.alias_info.is_write:
                v = n.args[i] if i < len(n.args) else n.kwargs.get(a.name)
                out += _nodes(v)
    return out


def _aliases_first(n: Node) -> bool:
    name = opname(n) or (n.target if n.op == "call_method" else getattr(n.target, "__name__", None))
    if n.op == "call_function" and n.target is operator.getitem:
        idx = n.args[1] if len(n.args) > 1 else None
        parts = idx if isinstance(idx, tuple) else (idx,)
        # indexing by a tensor copies (advanced indexing); basic indexing and tuple picks alias
        base = n.args[0].meta.get("example_value") if isinstance(n.args[0], Node) else None
        return not (isinstance(base, torch.Tensor) and any(isinstance(p, Node) for p in parts))
    return isinstance(name, str) and (name in _VIEWS or bool(written_args(n)))


class Writes:
    """In-place writes of a graph by position, over classes of values that may share memory
    (a value, its views, the results of in-place calls on it). ``first_write(n, lo, hi)`` is
    the first call that writes ``n``'s memory strictly after position ``lo`` and before
    ``hi`` (both node positions in the graph this was built from)."""

    @classmethod
    def of(cls, graph) -> "Writes":
        """``Writes(graph)``, or inside :func:`writes_cache` the one built before for ``graph``
        if the graph is unchanged since (see there)."""
        cache = getattr(_SCOPE, "cache", None)
        if cache is None or not CACHE[0]:
            return cls(graph)
        key = _snapshot(graph)
        hit = cache.get(id(graph))
        if (hit is not None and hit[0] is graph and len(hit[1]) == len(key)
                and all(map(operator.is_, hit[1], key))):
            STATS["reused"] += 1
            return hit[2]
        w = cls(graph)
        cache[id(graph)] = (graph, key, w)
        return w

    def __init__(self, graph) -> None:
        STATS["built"] += 1
        self.pos: Dict[Node, int] = {}
        self._parent: Dict[Node, Node] = {}
        self._writes: Dict[Node, List[Tuple[int, Node]]] = defaultdict(list)
        pending: List[Tuple[Node, Node]] = []
        for i, n in enumerate(graph.nodes):
            self.pos[n] = i
            if n.op not in ("call_function", "call_method"):
                continue
            if n.args and isinstance(n.args[0], Node) and _aliases_first(n):
                self._union(n, n.args[0])
            outs = _nodes(n.kwargs.get("out"))
            for o in outs:
                self._union(n, o)
            for w in written_args(n):
                pending.append((w, n))
        for w, n in pending:
            self._writes[self._find(w)].append((self.pos[n], n))
        self.any = bool(pending)

    def _find(self, n: Node) -> Node:
        p = self._parent.get(n, n)
        if p is n:
            return n
        r = self._find(p)
        self._parent[n] = r
        return r

    def _union(self, a: Node, b: Node) -> None:
        ra, rb = self._find(a), self._find(b)
        if ra is not rb:
            self._parent[ra] = rb

    def writes_of(self, n: Any) -> List[Node]:
        """Every call that writes ``n``'s memory (in graph order)."""
        if not isinstance(n, Node):
            return []
        return [w for _, w in sorted(self._writes.get(self._find(n), ()), key=lambda pw: pw[0])]

    def first_write(self, n: Any, lo: int, hi: int, allow: Iterable[Node] = ()) -> Optional[Node]:
        """The first call writing ``n``'s memory at a position in (lo, hi), except ``allow``."""
        if not isinstance(n, Node) or not self.any:
            return None
        allow = set(allow)
        for p, w in sorted(self._writes.get(self._find(n), ()), key=lambda pw: pw[0]):
            if lo < p < hi and w not in allow:
                return w
        return None

    def clean(self, nodes: Iterable[Any]) -> Optional[Node]:
        """A call writing the memory of any of ``nodes`` anywhere in the graph, or None."""
        for n in nodes:
            w = self.writes_of(n)
            if w:
                return w[0]
        return None


# ----------------------------------------------------------------------------- the cache
# Writes is rebuilt by each pass that checks writes, and the attention passes rebuild it per
# candidate: about ten builds of one graph per compile, most of them of a graph no pass changed
# in between. Inside writes_cache() (passes.run), Writes.of(graph) hands back the last one built
# for the same graph object when nothing it was built from has changed. What a Writes reads of a
# graph: the nodes in order; of each node its op, target, args and kwargs; and the recorded
# example value of a getitem's base (whether indexing it copies). The snapshot holds each of
# these objects and the check is by identity: FX keeps args and kwargs as immutable tuples and
# dicts (immutable_list / immutable_dict inside), so every change to them (an update_arg,
# replace_input_with, replace_all_uses_with, an args or kwargs assignment) installs new objects;
# inserting, erasing or moving a node changes the node sequence; a new target or meta value is
# another object. An equal object that is not the same one only makes a miss (a new build).
CACHE = [True]  # CACHE[0] = False: every Writes.of builds a new one (tests compare both ways)
STATS = {"built": 0, "reused": 0}
_SCOPE = threading.local()


def _snapshot(graph) -> list:
    out: list = []
    for n in graph.nodes:
        out += (n, n.op, n.target, n._args, n._kwargs, n.meta.get("example_value"))
    return out


@contextlib.contextmanager
def writes_cache():
    """Within it, on this thread, :meth:`Writes.of` reuses the analysis of an unchanged graph.
    Nested scopes share the outer one's cache; it is dropped when the outermost scope ends (the
    cache holds the graph's nodes, erased ones included)."""
    outer = getattr(_SCOPE, "cache", None)
    if outer is None:
        _SCOPE.cache = {}
    try:
        yield
    finally:
        if outer is None:
            _SCOPE.cache = None


def describe_write(w: Node, of: Node) -> str:
    """'written in place by add_ (at add_)' for a reason text."""
    name = opname(w) or (w.target if w.op == "call_method" else getattr(w.target, "__name__", w.op))
    return f"'{of.name}' is written in place by '{name}' (at {w.name})"


__all__ = ["SIGNATURES", "MESSAGE_OPS", "OPERAND", "PARAM", "ANY", "INPLACE", "VARARGS", "unmodelled", "Writes",
           "written_args", "describe_write", "table", "writes_cache"]


def table() -> str:
    """The accepted operations and how each of their arguments is handled, as a markdown table
    (docs/semantics.md is this table; tests/passes/test_semantics.py checks that they agree)."""
    words = {OPERAND: "read (an operand)", PARAM: "modelled (a number parameter)", ANY: "any value",
             INPLACE: "modelled (the write is tracked)", VARARGS: "any value (a shape)"}
    rows = ["| operation | argument | handling |", "|---|---|---|"]
    for name in sorted(SIGNATURES):
        for pname, rule in SIGNATURES[name]:
            how = words.get(rule) if isinstance(rule, str) and rule in words else \
                f"assumed {rule!r}; any other value: the node is kept as written"
            rows.append(f"| `{name}` | `{pname}` | {how} |")
    for name in VALUE_PRESERVING:
        rows.append(f"| `{name}` | any | kept only when it changes neither dtype nor device |")
    return "\n".join(rows) + "\n"
