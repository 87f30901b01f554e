"""Phase 1b, match (read only): a scattered message that is an elementwise expression, read as a
message program (:mod:`gnncompile.ops.program`) for ``gnncompile::message_reduce``.

From the scatter's message the expression is walked back through elementwise ops (add, sub,
mul, div, neg, relu, leaky_relu, elu, gelu, sigmoid, tanh, softplus, exp, log, sqrt, abs,
clamp, pow) and views that keep each edge's values in order. It stops at its leaves:

* ``x[j]`` gathered by the destination index (the scatter's) -> an input read per destination;
* ``x[j]`` gathered by one other index, the same for all such leaves -> read per neighbour
  (that index becomes the structure's source);
* any other tensor with one row per edge -> read per edge (computed outside, as it is);
* a tensor without the edge dimension (a parameter) -> a constant input; a Python number -> a
  constant of the program.

Every leaf must broadcast into the message *per edge by prefix*: its values along the
message's leading feature dims, constant along the rest (one value per edge, per head, or per
feature). The program then reads leaf ``k`` of width ``W_k`` at feature ``f // (F / W_k)``.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any, Dict, List, Optional, Tuple

import torch
from torch.fx import Node

from ..ops import program as P
from ..ops.checks import FLOAT_DTYPES
from .canonical import argument, fake_tensor, opname, same_size, size_key
from .match import Aggregate, IndexRef, NoMatch, Scatter, gather_of

MAX_NODES = 96  # expression nodes per program
_BINARY = {"add": "add", "sub": "sub", "mul": "mul", "div": "div", "pow": "pow", "rsub": "rsub"}
_UNARY = {"relu": "relu", "sigmoid": "sigmoid", "tanh": "tanh", "exp": "exp", "log": "log",
          "sqrt": "sqrt", "neg": "neg", "abs": "abs", "negative": "neg"}
# elementwise functions with number parameters: (name, default) in positional order
_PARAMETRIC = {"leaky_relu": (("negative_slope", 0.01),), "elu": (("alpha", 1.0),),
               "softplus": (("beta", 1.0), ("threshold", 20.0))}
_VIEWS = ("view", "reshape", "unsqueeze", "squeeze", "flatten", "contiguous", "clone", "stack")


@dataclass
class Leaf:
    node: Node  # the tensor the kernel reads (for a gather: the gathered node tensor)
    side: int
    width: int


@dataclass
class Program(Aggregate):
    """A scatter whose message is a program over :class:`Leaf` inputs."""

    leaves: List[Leaf] = field(default_factory=list)
    code: List[int] = field(default_factory=list)
    consts: List[float] = field(default_factory=list)
    width: int = 0
    shape: Tuple[int, ...] = ()  # the message's feature shape
    gathers: int = 0  # leaves gathered by an index (not computed per edge outside)
    ops: Tuple[str, ...] = ()

    def describe(self) -> str:
        sides = {P.COL: "x_j", P.ROW: "x_i", P.EDGE: "edge", P.CONST: "param"}
        ins = ",".join(sides[lf.side] for lf in self.leaves)
        return f"{'+'.join(self.ops) or 'load'}({ins})"


def _static(shape) -> Optional[Tuple[int, ...]]:
    out = []
    for s in shape:
        if not isinstance(s, int):
            try:
                s = int(str(s))
            except ValueError:
                return None
        out.append(s)
    return tuple(out)


def _prefix_width(child: Tuple[int, ...], parent: Tuple[int, ...]) -> Optional[int]:
    """Width of a child feature shape that broadcasts into ``parent`` by prefix (same rank,
    ``child[:k] == parent[:k]`` and ones after), else None."""
    if len(child) != len(parent):
        return None
    k = len(child)
    while k > 0 and child[k - 1] == 1:
        k -= 1
    if child[:k] != parent[:k]:
        return None
    return math.prod(child[:k])


class _Builder:
    def __init__(self, message: Node, dst: IndexRef, stops=()):
        self.stops = set(stops)
        self.dst = dst
        self.E = fake_tensor(message).shape[0]
        self.dtype = fake_tensor(message).dtype
        self.leaves: List[Leaf] = []
        self.leaf_index: Dict[Tuple[Node, int], int] = {}
        self.src: Optional[Tuple[IndexRef, Node]] = None
        self.memo: Dict[Node, Tuple[P.Expr, Tuple[int, ...]]] = {}
        self.count = 0
        self.ops: List[str] = []

    # ---- leaves
    def _leaf(self, n: Node, side: int, width: int) -> P.Expr:
        key = (n, side)
        if key not in self.leaf_index:
            self.leaf_index[key] = len(self.leaves)
            self.leaves.append(Leaf(n, side, width))
        return P.inp(self.leaf_index[key])

    def _per_edge(self, n: Node) -> Optional[Tuple[int, ...]]:
        v = fake_tensor(n)
        if v is None or v.dim() < 1 or not same_size(v.shape[0], self.E):
            return None
        return _static(v.shape[1:])

    def leaf(self, n: Any) -> Tuple[P.Expr, Optional[Tuple[int, ...]]]:
        """(expression, feature shape) of a leaf; shape None for a constant input (broadcast
        from the right, checked by the caller)."""
        if isinstance(n, (int, float)) and not isinstance(n, bool):
            return P.const(float(n)), None
        if not isinstance(n, Node):
            raise NoMatch(f"message reads a {type(n).__name__} constant")
        v = fake_tensor(n)
        if v is None:
            raise NoMatch(f"message reads '{opname(n) or n.op}', not a tensor")
        if v.dtype != self.dtype:
            raise NoMatch(f"message mixes dtype {v.dtype} into {self.dtype}")
        g = gather_of(n)
        if g is not None:
            x, j = g
            ref = IndexRef.of(j)
            xv = fake_tensor(x)
            fs = _static(xv.shape[1:])
            if fs is None:
                raise NoMatch("gathered features have a symbolic feature size")
            if ref == self.dst:
                return self._leaf(x, P.ROW, math.prod(fs)), fs
            if self.src is None:
                self.src = (ref, j)
            if ref == self.src[0] and same_size(fake_tensor(j).shape[0], self.E):
                return self._leaf(x, P.COL, math.prod(fs)), fs
        fs = self._per_edge(n)
        if fs is not None and v.dim() >= 1:
            return self._leaf(n, P.EDGE, math.prod(fs) if fs else 1), fs
        shape = _static(v.shape)
        if shape is None:
            raise NoMatch("message reads a tensor of symbolic size that is not per edge")
        return self._leaf(n, P.CONST, math.prod(shape) if shape else 1), None

    # ---- expression
    def child(self, a: Any, parent: Tuple[int, ...]) -> P.Expr:
        """The expression of operand ``a`` of an elementwise node of feature shape ``parent``."""
        e, fs = self.visit(a)
        if fs is None:  # a constant: aligned from the right against [E, *parent]
            if e[0] == "const":
                return e
            shape = _static(fake_tensor(a).shape)
            full = (1,) * (len(parent) + 1 - len(shape)) + shape if len(shape) <= len(parent) + 1 else None
            if full is None or full[0] != 1 or _prefix_width(full[1:], parent) is None:
                raise NoMatch(f"parameter of shape {list(shape)} does not broadcast per edge into {list(parent)}")
            return e
        if _prefix_width(fs, parent) is None:
            raise NoMatch(f"operand of shape [E, {', '.join(map(str, fs))}] broadcasts into "
                          f"[E, {', '.join(map(str, parent))}] other than per edge, head or feature")
        return e

    def visit(self, n: Any) -> Tuple[P.Expr, Optional[Tuple[int, ...]]]:
        if isinstance(n, Node) and n in self.memo:
            return self.memo[n]
        self.count += 1
        if self.count > MAX_NODES:
            raise NoMatch(f"message expression has more than {MAX_NODES} operations")
        r = self._visit(n)
        if isinstance(n, Node):
            self.memo[n] = r
        return r

    def _visit(self, n: Any) -> Tuple[P.Expr, Optional[Tuple[int, ...]]]:
        name = opname(n)
        fs = self._per_edge(n) if isinstance(n, Node) else None
        if fs is None or gather_of(n) is not None or name is None or n in self.stops:
            return self.leaf(n)
        if name in _VIEWS:
            return self._view(n, name, fs)
        if name in _BINARY and len(n.args) >= 2:
            a, b = argument(n, 0), argument(n, 1, "other")
            if name == "add" or name == "sub":
                alpha = n.kwargs.get("alpha", 1)
                if alpha != 1:
                    raise NoMatch(f"'{name}' with alpha={alpha}")
            if name == "pow":
                b = argument(n, 1, "exponent")
            ea, eb = self.child(a, fs), self.child(b, fs)
            if name == "rsub":
                ea, eb, name = eb, ea, "sub"
            self.ops.append(name)
            return P.node(name, ea, eb), fs
        if name in _UNARY:
            self.ops.append(_UNARY[name])
            return P.node(_UNARY[name], self.child(n.args[0], fs)), fs
        if name in _PARAMETRIC:  # number parameters, by position after the input or by name
            params = [argument(n, i + 1, key, default) for i, (key, default) in enumerate(_PARAMETRIC[name])]
            if not all(isinstance(v, (int, float)) for v in params):
                raise NoMatch(f"{name} with a tensor parameter")
            self.ops.append(name)
            return P.node(name, self.child(n.args[0], fs), params=params), fs
        if name == "gelu":
            if argument(n, 1, "approximate", "none") != "none":
                raise NoMatch("gelu(approximate='tanh')")
            self.ops.append(name)
            return P.node(name, self.child(n.args[0], fs)), fs
        if name in ("clamp", "clip", "clamp_min", "clamp_max"):
            lo = argument(n, 1, "min") if name in ("clamp", "clip", "clamp_min") else None
            hi = argument(n, 2, "max") if name in ("clamp", "clip") else (argument(n, 1, "max") if name == "clamp_max" else None)
            if any(isinstance(v, Node) for v in (lo, hi)):
                raise NoMatch("clamp with tensor bounds")
            self.ops.append("clamp")
            return P.node("clamp", self.child(n.args[0], fs),
                          params=(-math.inf if lo is None else lo, math.inf if hi is None else hi)), fs
        if name in ("to", "float", "type_as") and fake_tensor(n.args[0]) is not None \
                and fake_tensor(n.args[0]).dtype == self.dtype:
            return self.visit(n.args[0])
        return self.leaf(n)

    def _view(self, n: Node, name: str, fs: Tuple[int, ...]):
        if name == "stack":
            parts = argument(n, 0, "tensors")
            if not isinstance(parts, (list, tuple)) or len(parts) != 1:
                return self.leaf(n)
            inner = parts[0]
        else:
            inner = n.args[0]
        ifs = self._per_edge(inner) if isinstance(inner, Node) else None
        if ifs is None or math.prod(ifs) != math.prod(fs):
            return self.leaf(n)
        e, _ = self.visit(inner)
        return e, fs


def _build(message: Any, dst: IndexRef, stops=()):
    mv = fake_tensor(message)
    if not isinstance(message, Node) or mv is None:
        raise NoMatch("message is not a tensor of the graph")
    if mv.dtype not in (torch.float32, torch.float64):
        raise NoMatch(f"message of dtype {mv.dtype} (programs run in float32 / float64)")
    fs = _static(mv.shape[1:])
    if fs is None:
        raise NoMatch("message has a symbolic feature size")
    F = math.prod(fs)
    b = _Builder(message, dst, stops)
    expr, efs = b.visit(message)
    if efs is None:
        raise NoMatch("message does not depend on the edge")
    gathers = sum(1 for lf in b.leaves if lf.side in (P.COL, P.ROW))
    if not b.leaves:
        raise NoMatch("message is a constant")
    try:
        code, consts = P.encode(expr)
    except ValueError as e:
        raise NoMatch(str(e)) from None
    for lf in b.leaves:
        if fake_tensor(lf.node).dtype not in FLOAT_DTYPES:
            raise NoMatch(f"message reads a {fake_tensor(lf.node).dtype} tensor")
        if F % lf.width:
            raise NoMatch(f"an input of width {lf.width} does not divide the message width {F}")
    return b, code, consts, F, fs, gathers


def match_program(sc: Scatter, dst: IndexRef, stops=()) -> Program:
    """``sc`` as a message program; raises NoMatch saying why not."""
    b, code, consts, F, fs, gathers = _build(sc.message, dst, stops)
    if b.src is not None:
        src_ref, src_index = b.src
    elif dst.row is not None:
        src_ref, src_index = IndexRef(dst.tensor, 1 - dst.row), sc.index
    else:
        src_ref, src_index = dst, sc.index
    col = next((lf.node for lf in b.leaves if lf.side == P.COL), None)
    needs_csc = sc.reduce in ("sum", "mean") and any(
        lf.side == P.COL and fake_tensor(lf.node).requires_grad for lf in b.leaves)
    return Program(sc.node, dst, sc.index, size_key(fake_tensor(sc.buffer).shape[0]), sc.buffer, sc.inplace,
                   reduce=sc.reduce, x=col, src=src_ref, src_index=src_index, needs_csc=needs_csc,
                   leaves=b.leaves, code=code, consts=consts, width=F, shape=fs, gathers=gathers,
                   ops=tuple(dict.fromkeys(b.ops)))


# ----------------------------------------------------------------------------- edge programs
_GEMM_USERS = ("linear", "matmul", "mm")
_ELEMENTWISE = set(_BINARY) | set(_UNARY) | set(_PARAMETRIC) | {"gelu", "clamp", "clip", "clamp_min", "clamp_max"}


@dataclass
class EdgeProgram(Program):
    """A per-edge elementwise expression over gathered rows that a GEMM reads (an MLP on edges:
    EdgeConv's ``relu(W [x_i, x_j - x_i] + b)`` after :mod:`.algebra`): computed by
    ``gnncompile::message_edges`` in one pass instead of one E x F tensor per operation."""


def match_edge_programs(graph, structures: List[Tuple[IndexRef, str, Node]], stops=()) -> List[EdgeProgram]:
    """Edge programs over the structures the piece builds anyway (``structures``: destination
    row of an edge_index, its number of destinations, and a scatter node of it)."""
    out: List[EdgeProgram] = []
    if not structures:
        return out
    for n in graph.nodes:
        if opname(n) not in _ELEMENTWISE or not any(opname(u) in _GEMM_USERS for u in n.users):
            continue
        nv = fake_tensor(n)
        if nv is None or nv.dim() < 2:
            continue
        for dst, num_dst, _ in structures:
            try:
                b, code, consts, F, fs, gathers = _build(n, dst, stops)
            except NoMatch:
                continue
            if gathers == 0 or not b.ops or b.src is None or not b.src[0].is_row(1 - dst.row, of=dst.tensor):
                continue
            sized = next((lf.node for lf in b.leaves if lf.side in (P.ROW, P.COL)
                          and size_key(fake_tensor(lf.node).shape[0]) == num_dst), None)
            if sized is None:
                continue
            col = next((lf.node for lf in b.leaves if lf.side == P.COL), None)
            needs_csc = any(lf.side == P.COL and fake_tensor(lf.node).requires_grad for lf in b.leaves)
            out.append(EdgeProgram(n, dst, b.src[1], num_dst, sized, False, reduce="edges", x=col,
                                   src=b.src[0], src_index=b.src[1], needs_csc=needs_csc, leaves=b.leaves,
                                   code=code, consts=consts, width=F, shape=fs, gathers=gathers,
                                   ops=tuple(dict.fromkeys(b.ops))))
            break
    return out


__all__ = ["Leaf", "Program", "EdgeProgram", "match_program", "match_edge_programs"]
