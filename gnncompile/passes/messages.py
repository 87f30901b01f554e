"""Part of phase 3, match (read only): a scattered message that is an elementwise expression,
read as a message program (:mod:`gnncompile.ops.program`) for ``gnncompile::message_reduce``.

From the scatter's message the expression is walked back through elementwise ops (add, sub,
mul, div, neg, relu, leaky_relu, elu, gelu, sigmoid, tanh, softplus, exp, log, sqrt, abs,
clamp, pow) and views that keep each edge's values in order. It stops at its leaves:

* ``x[j]`` gathered by the destination index (the scatter's) -> an input read per destination;
* ``x[j]`` gathered by one other index, the same for all such leaves -> read per neighbour
  (that index becomes the structure's source);
* a linear map of narrow edge features (``linear(a, W, b)``, ``a`` per edge of width <= 32,
  read by nothing outside the message) -> an edge encoder, computed per edge inside the kernel
  (inputs ``a``, ``W^T``, ``b``: program.py), so its ``E x W`` output never exists, where
  :func:`encoder_inside` says so (by default: where its products per edge cost less than the
  ``E x W`` tensor outside, by ``D``, ``W`` and whether ``a`` needs a gradient); else read per edge;
* any other tensor with one row per edge -> read per edge (computed outside, as it is);
* a tensor without the edge dimension (a parameter) -> a constant input; a Python number -> a
  constant of the program.

Every leaf must broadcast into the message *per edge by prefix*: its values along the
message's leading feature dims, constant along the rest (one value per edge, per head, or per
feature). The program then reads leaf ``k`` of width ``W_k`` at feature ``f // (F / W_k)``.
"""
from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass, field
from typing import Any, Dict, List, Optional, Set, Tuple

import torch
from torch.fx import Node

from ..ops import program as P
from ..ops.checks import FLOAT_DTYPES
from .canonical import argument, fake_tensor, opname, same_size, size_key
from .match import Aggregate, IndexRef, NoMatch, Scatter, gather_of
from .semantics import Writes, describe_write, unmodelled, written_args

MAX_NODES = 96  # expression nodes per program
_BINARY = {"add": "add", "sub": "sub", "mul": "mul", "div": "div", "pow": "pow", "rsub": "rsub"}
_UNARY = {"relu": "relu", "sigmoid": "sigmoid", "tanh": "tanh", "exp": "exp", "log": "log",
          "sqrt": "sqrt", "neg": "neg", "abs": "abs", "negative": "neg"}
# elementwise functions with number parameters: (name, default) in positional order
_PARAMETRIC = {"leaky_relu": (("negative_slope", 0.01),), "elu": (("alpha", 1.0),),
               "softplus": (("beta", 1.0), ("threshold", 20.0))}
_VIEWS = ("view", "reshape", "unsqueeze", "squeeze", "flatten", "contiguous", "clone", "stack")
# Operations whose backward passes each incoming gradient on unchanged (add, sub and neg: with a
# sign) or selects it (relu: where(x > 0, g, 0); views, casts): computed twice, once inside a
# program and once outside, they give the leaves the same gradient terms as computed once
# (_Builder.shared).
_SPLIT_EXACT = frozenset(_VIEWS) | {"add", "sub", "neg", "relu", "to", "float", "type_as", "getitem", "cat"}
_MODELLED = (set(_BINARY) | set(_UNARY) | set(_PARAMETRIC) | set(_VIEWS)
             | {"gelu", "clamp", "clip", "clamp_min", "clamp_max", "to", "float", "type_as"})
# activations whose inplace=True the builder models: the write defines the value it returns
_INPLACE_OK = ("relu", "leaky_relu", "elu")


MAX_ENCODER_DEPTH = 32  # edge features an edge encoder inside the kernel reads per edge
ENCODER_MODES = ("auto", "inside", "outside")
# 'auto': an encoder's limit grows with its width up to this many columns (encoder_inside)
ENCODER_COLUMN_CAP = 40


def encoder_inside(mode: str, depth: int, width: int, needs_grad: bool) -> Tuple[bool, str]:
    """Whether an edge encoder of ``depth`` input features and ``width`` outputs goes inside the
    message program under ``Settings.edge_encoder`` ``mode``, and why not ('' where it does);
    ``needs_grad``: its input features need a gradient. 'inside' / 'outside' decide alone.

    'auto' (the default) weighs what each edge computes inside against what the ``E x width``
    tensor outside costs: inside, the kernels compute the map's ``depth x width`` products per
    edge (scalar: no multiply-add) in the forward, again in the backward and once more for the
    weight's gradient, and once more for the input's where it needs one (4 passes instead of 3);
    outside, matrix products (blocked, multiply-adds) compute them and the ``E x width`` output
    and its gradient go through memory. The kernels keep 8 vectors in flight (64 float32
    columns; 128 with AVX-512, then blocks of 4 and 2 vectors: native/cpu/encoder_core.h; a
    generated reduction's forward computes 5 edges at once, encode_block, sharing each load of
    the weight), so narrower maps cost more per column inside; a wider map's gain stops at 40
    columns. Inside where ``depth`` (times 4/3 where the input needs a gradient) is at most
    ``min(width, 40) / 2``. Measured, a training step on the zoo's graph (2000 nodes, 16k edges,
    AMD EPYC Zen 4 with encode_block, three runs: benchmarks/results/encoder_rule_zen4_s54.md),
    inside against outside: width 32 depth 8 1.35-1.82x (1.11-1.37x with the gradient), depth 16
    1.14-1.33x (0.74-0.88x with the gradient), depth 32 0.88-0.91x (0.61-0.77x with the gradient;
    SchNet's filter, 113k edges: 0.77-0.78x); width 128 depth 8 with the gradient 1.38-1.66x, depth
    16 1.10-1.12x (0.91-0.97x with the gradient: the cap was 64 columns, which put it inside, until
    this run), depth 32 0.91-1.01x. GINE at 100k nodes / 1M edges, width 128, depth 16 (Zen 2):
    894 ms inside against 1457 outside. The earlier table (Zen 2, before encode_block):
    benchmarks/results/encoder_rule.md."""
    if mode not in ENCODER_MODES:
        raise ValueError(f"edge encoder mode must be one of {ENCODER_MODES}, got {mode!r}")
    if mode == "inside":
        return True, ""
    if mode == "outside":
        return False, "edge_encoder 'outside'"
    cost = depth * 4 / 3 if needs_grad else depth
    limit = min(width, ENCODER_COLUMN_CAP) / 2
    if cost <= limit:
        return True, ""
    grad = " x 4/3 (its input needs a gradient)" if needs_grad else ""
    return False, (f"edge_encoder 'auto': depth {depth}{grad} > {limit:g} (min(width, {ENCODER_COLUMN_CAP}) / 2): "
                   "the products per edge inside would cost more than the E x width tensor outside")


@dataclass
class Leaf:
    node: Node  # the tensor the kernel reads (for a gather: the gathered node tensor)
    side: int
    width: int
    # an edge encoder (side enc): ``node`` is its edge features, of width ``depth``; its weight
    # and bias follow as leaves of role 'weight' (read transposed) and 'bias' ('zero_bias': the
    # map has none; ``node`` is then its weight, for the dtype and device)
    role: str = ""
    depth: int = 0
    source: Optional[Node] = None  # the encoder's linear node (what explain names)


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
    kept: Tuple[str, ...] = ()  # nodes the semantics guard kept as written (computed outside), why

    def describe(self) -> str:
        sides = {P.COL: "x_j", P.ROW: "x_i", P.EDGE: "edge", P.CONST: "param", P.ENC: "lin(edge)"}
        ins = ",".join(sides[lf.side] for lf in self.leaves if not lf.role)
        kept = f"; {'; '.join(self.kept)}" if self.kept else ""
        return f"{'+'.join(self.ops) or 'load'}({ins}){kept}"


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


# Calls that read only the size, dtype or device of a tensor (of every argument, or of the
# argument after self for the *_as methods): no gradient flows back through them.
_METADATA = {"new_zeros", "new_ones", "new_empty", "new_full", "size", "dim", "numel", "zeros_like",
             "ones_like", "empty_like", "full_like"}
_SHAPE_OF_OTHER = {"expand_as", "view_as", "reshape_as"}


def reads_value(user: Node, n: Node) -> bool:
    """Whether ``user`` reads the values of ``n`` (not only its size, dtype or device)."""
    name = opname(user)
    if name in _METADATA:
        return False
    if user.op == "call_function" and name == "getattr" and len(user.args) == 2 and user.args[1] in (
            "shape", "dtype", "device", "ndim", "is_cuda"):
        return False
    if name in _SHAPE_OF_OTHER:
        return bool(user.args) and user.args[0] is n
    return True


class _Builder:
    """Walks a message back to its leaves (module docstring). ``anchor`` is the node the fused
    op replaces: the kernel reads every leaf there, so a leaf written in place between the
    place the message read it and the anchor cannot be read by the kernel (:mod:`.semantics`)."""

    def __init__(self, message: Node, dst: IndexRef, dst_index: Node, anchor: Node, writes: Writes, stops=(),
                 no_encoder=(), encoders: "bool | str" = True):
        self.stops = set(stops)
        # Settings.edge_encoder: 'auto', 'inside' or 'outside' (True / False: 'inside' / 'outside')
        self.encoder_mode = encoders if isinstance(encoders, str) else ("inside" if encoders else "outside")
        self.no_encoder = set(no_encoder)  # linear nodes read as computed, not as edge encoders
        self.dst = dst
        self.dst_dtype = fake_tensor(dst_index).dtype
        self.E = fake_tensor(message).shape[0]
        self.dtype = fake_tensor(message).dtype
        self.writes = writes
        self.at = writes.pos[anchor]
        self.leaves: List[Leaf] = []
        self.leaf_index: Dict[Tuple[Node, int], int] = {}
        self.src: Optional[Tuple[IndexRef, Node]] = None
        self.memo: Dict[Node, Tuple[P.Expr, Tuple[int, ...]]] = {}
        self.count = 0
        self.ops: List[str] = []
        self.kept: List[str] = []  # nodes kept as written (computed outside) by the guard, with why
        self.reads: Dict[Node, int] = {}  # a leaf computed outside -> its first reader's position
        self.leafed: Set[Node] = set()  # nodes read as leaves (inputs of the program)
        self.encoders: Set[Node] = set()  # linear nodes read as edge encoders

    def shared(self, root: Node) -> List[Node]:
        """Operations inside the program whose value something outside it also reads, and whose
        recomputation would change a gradient. The graph computes them anyway, and eager sums
        their gradient from every reader before applying the derivatives below them once:
        recomputed inside the program, the kernel would apply them to its own share and autograd
        to the other (``0 * inf`` is NaN where eager's ``(g + 0) * inf`` is inf; ``d * a + d * b``
        rounds otherwise than ``d * (a + b)``). They are read as computed instead, unless every
        operation below them inside the program passes a gradient on unchanged or selects it
        (:data:`_SPLIT_EXACT`: add, sub, neg, relu, views): then each share reaches the leaves
        as it is, and the leaves sum the same terms as eager does (only their order differs, as
        in every fused sum)."""
        inner = {n for n in self.memo if isinstance(n, Node) and n not in self.leafed}
        out = []
        for n in inner:
            if n is root or opname(n) in _VIEWS or opname(n) in ("to", "float", "type_as"):
                continue
            if any(u not in inner and reads_value(u, n) for u in n.users) and not self._split_exact(n, inner):
                out.append(n)
        return out

    def _split_exact(self, n: Node, inner: Set[Node]) -> bool:
        """Whether every operation of the program from ``n`` down to its leaves is in
        :data:`_SPLIT_EXACT` (see :meth:`shared`)."""
        todo, seen = [n], set()
        while todo:
            m = todo.pop()
            if m in seen or m not in inner:
                continue  # a leaf (read from outside the program) ends the path
            seen.add(m)
            if opname(m) not in _SPLIT_EXACT:
                return False
            todo += [a for a in m.all_input_nodes]
        return True

    # ---- leaves
    def _leaf(self, n: Node, side: int, width: int) -> P.Expr:
        key = (n, side)
        if key not in self.leaf_index:
            self.leaf_index[key] = len(self.leaves)
            self.leaves.append(Leaf(n, side, width))
        return P.inp(self.leaf_index[key])

    def _encoder(self, n: Node) -> Optional[P.Expr]:
        """An edge encoder (module docstring) for ``n``, or None where ``n`` is not one: a
        ``linear`` of per-edge features of width <= MAX_ENCODER_DEPTH with a 2-D weight, in the
        message's dtype, whose inputs hold at the anchor what the linear map read (the kernel
        reads them there) and whose output nothing writes in place."""
        if self.encoder_mode == "outside" or opname(n) != "linear" or n in self.no_encoder \
                or n.kwargs.keys() - {"input", "weight", "bias"}:
            return None
        a, w, bias = argument(n, 0, "input"), argument(n, 1, "weight"), argument(n, 2, "bias")
        if not isinstance(a, Node) or not isinstance(w, Node) or not (bias is None or isinstance(bias, Node)):
            return None
        av, wv, out = fake_tensor(a), fake_tensor(w), fake_tensor(n)
        bv = fake_tensor(bias) if bias is not None else None
        fs = self._per_edge(a)
        if av is None or wv is None or out is None or fs is None or len(fs) != 1 or wv.dim() != 2:
            return None
        D, width = fs[0], _static(wv.shape)
        if width is None or not 1 <= D <= MAX_ENCODER_DEPTH or width[1] != D or out.dim() != 2:
            return None
        if any(v is not None and (v.dtype != self.dtype or v.device != out.device) for v in (av, wv, bv)):
            return None
        if bias is not None and (bv is None or _static(bv.shape) != (width[0],)):
            return None
        pos = self.writes.pos
        for x in (a, w, bias):
            if x is not None and self.writes.first_write(x, pos[n] - 1, self.at) is not None:
                return None
        if self.writes.first_write(n, pos[n], self.at) is not None:
            return None
        inside, why = encoder_inside(self.encoder_mode, D, width[0], bool(av.requires_grad))
        if not inside:
            note = f"edge encoder '{n.name}' ({D} -> {width[0]} features) computed outside: {why}"
            if note not in self.kept:
                self.kept.append(note)
            return None
        key = (n, P.ENC)
        if key not in self.leaf_index:
            self.leaf_index[key] = len(self.leaves)
            W = width[0]
            self.leaves += [Leaf(a, P.ENC, W, depth=D, source=n), Leaf(w, P.CONST, W, role="weight", depth=D),
                            Leaf(w if bias is None else bias, P.CONST, W, role="zero_bias" if bias is None else "bias")]
        self.encoders.add(n)
        return P.inp(self.leaf_index[key])

    def _per_edge(self, n: Node) -> Optional[Tuple[int, ...]]:
        v = fake_tensor(n)
        if v is None or v.dim() < 1 or not same_size(v.shape[0], self.E):
            return None
        return _static(v.shape[1:])

    def _gather_moves(self, g: Node, x: Node, j: Node) -> Optional[str]:
        """Why the kernel may not read ``x`` at the anchor in place of ``g = x[j]`` (None: it may)."""
        pos = self.writes.pos
        w = self.writes.first_write(x, pos[g] - 1, self.at)
        if w is not None:
            return describe_write(w, x) + " between the gather and the scatter"
        w = self.writes.first_write(g, pos[g], self.at)
        if w is not None:
            return describe_write(w, g)
        w = self.writes.clean([j])
        if w is not None:
            return describe_write(w, j)
        if fake_tensor(j).dtype != self.dst_dtype:
            return f"gathered by a {fake_tensor(j).dtype} index into a {self.dst_dtype} one"
        return None

    def leaf(self, n: Any, reader: Optional[Node]) -> Tuple[P.Expr, Optional[Tuple[int, ...]]]:
        """(expression, feature shape) of a leaf; shape None for a constant input (broadcast
        from the right, checked by the caller)."""
        if isinstance(n, (int, float)) and not isinstance(n, bool):
            return P.const(float(n)), None
        if not isinstance(n, Node):
            raise NoMatch(f"message reads a {type(n).__name__} constant")
        self.leafed.add(n)
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
            is_row = ref == self.dst
            is_col = not is_row and (self.src is None or ref == self.src[0]) \
                and same_size(fake_tensor(j).shape[0], self.E)
            if is_row or is_col:
                why = self._gather_moves(n, x, j)
                if why is not None:  # the gathered rows are read as computed, per edge
                    self.kept.append(f"gather '{n.name}' kept as written: {why}")
                elif is_row:
                    return self._leaf(x, P.ROW, math.prod(fs)), fs
                else:
                    if self.src is None:
                        self.src = (ref, j)
                    return self._leaf(x, P.COL, math.prod(fs)), fs
        if reader is not None:  # read by the kernel at the anchor: checked in check_reads()
            self.reads[n] = min(self.reads.get(n, self.at), self.writes.pos.get(reader, self.at))
        fs = self._per_edge(n)
        if fs is not None and v.dim() >= 1:
            enc = self._encoder(n)
            if enc is not None:
                return enc, fs
            return self._leaf(n, P.EDGE, math.prod(fs) if fs else 1), fs
        shape = _static(v.shape)
        if shape is None:
            raise NoMatch("message reads a tensor of symbolic size that is not per edge")
        return self._leaf(n, P.CONST, math.prod(shape) if shape else 1), None

    def check_reads(self) -> None:
        """Every leaf computed outside holds, at the anchor, what the message read."""
        for n, first in self.reads.items():
            w = self.writes.first_write(n, first - 1, self.at)
            if w is not None:
                raise NoMatch(describe_write(w, n) + " after the message reads it")

    # ---- expression
    def child(self, a: Any, parent: Tuple[int, ...], reader: Node) -> P.Expr:
        """The expression of operand ``a`` of an elementwise node of feature shape ``parent``."""
        e, fs = self.visit(a, reader)
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

    def visit(self, n: Any, reader: Optional[Node]) -> Tuple[P.Expr, Optional[Tuple[int, ...]]]:
        if isinstance(n, Node) and n in self.memo:
            e, fs = self.memo[n]
            if n in self.reads and reader is not None:
                self.reads[n] = min(self.reads[n], self.writes.pos.get(reader, self.at))
            return e, fs
        self.count += 1
        if self.count > MAX_NODES:
            raise NoMatch(f"message expression has more than {MAX_NODES} operations")
        r = self._visit(n, reader)
        if isinstance(n, Node):
            self.memo[n] = r
        return r

    def _guard(self, n: Node, reader: Optional[Node]) -> Optional[str]:
        """Why node ``n``, an operation the builder knows, must be kept as written: an argument
        it does not model, a dtype or device change, or an in-place write to its value before
        the anchor (a modelled in-place activation that reads ``n`` as its only user is the
        write that defines its own value, and is allowed)."""
        why = unmodelled(n)
        if why is not None:
            return why
        v = fake_tensor(n)
        inner = fake_tensor(n.args[0]) if n.args else None
        if opname(n) in ("to", "float", "type_as") and (inner is None or inner.dtype != v.dtype
                                                       or inner.device != v.device):
            return f"'{opname(n)}' converts {inner.dtype if inner is not None else '?'} to {v.dtype}"
        allow = ()
        if reader is not None and opname(reader) in _INPLACE_OK and n in written_args(reader) \
                and set(n.users) == {reader}:
            allow = (reader,)
        w = self.writes.first_write(n, self.writes.pos[n], self.at, allow)
        if w is not None:
            return describe_write(w, n)
        return None

    def _visit(self, n: Any, reader: Optional[Node]) -> Tuple[P.Expr, Optional[Tuple[int, ...]]]:
        name = opname(n)
        fs = self._per_edge(n) if isinstance(n, Node) else None
        if fs is None or gather_of(n) is not None or name is None or n in self.stops \
                or name not in _MODELLED or fake_tensor(n).dtype != self.dtype:
            return self.leaf(n, reader)
        why = self._guard(n, reader)
        if why is not None:
            self.kept.append(f"'{n.name}' kept as written: {why}")
            return self.leaf(n, reader)
        if name in _VIEWS:
            return self._view(n, name, fs, reader)
        if name in _BINARY and len(n.args) >= 2:
            a, b = argument(n, 0), argument(n, 1, "other")
            if name == "pow":
                b = argument(n, 1, "exponent")
            ea, eb = self.child(a, fs, n), self.child(b, fs, n)
            if name == "rsub":
                ea, eb, name = eb, ea, "sub"
            if name == "pow" and eb[0] == "const":  # torch's pow by a number (its own special cases)
                self.ops.append("pow")
                return P.node("powc", ea, params=eb[2]), fs
            self.ops.append(name)
            return P.node(name, ea, eb), fs
        if name in _UNARY:
            self.ops.append(_UNARY[name])
            return P.node(_UNARY[name], self.child(n.args[0], fs, n)), fs
        if name in _PARAMETRIC:  # number parameters, by position after the input or by name
            params = [argument(n, i + 1, key, default) for i, (key, default) in enumerate(_PARAMETRIC[name])]
            if not all(isinstance(v, (int, float)) and not isinstance(v, bool) for v in params):
                return self._keep(n, reader, f"'{name}' with a parameter that is not a number")
            self.ops.append(name)
            return P.node(name, self.child(n.args[0], fs, n), params=params), fs
        if name == "gelu":
            self.ops.append(name)
            return P.node(name, self.child(n.args[0], fs, n)), fs
        if name in ("clamp", "clip", "clamp_min", "clamp_max"):
            lo = argument(n, 1, "min") if name in ("clamp", "clip", "clamp_min") else None
            hi = argument(n, 2, "max") if name in ("clamp", "clip") else (argument(n, 1, "max") if name == "clamp_max" else None)
            if not all(v is None or (isinstance(v, (int, float)) and not isinstance(v, bool)) for v in (lo, hi)):
                return self._keep(n, reader, "clamp with bounds that are not numbers")
            self.ops.append("clamp")
            return P.node("clamp", self.child(n.args[0], fs, n),
                          params=(-math.inf if lo is None else lo, math.inf if hi is None else hi)), fs
        if name in ("to", "float", "type_as"):
            return self.visit(n.args[0], n)
        return self.leaf(n, reader)

    def _keep(self, n: Node, reader: Optional[Node], why: str):
        self.kept.append(f"'{n.name}' kept as written: {why}")
        return self.leaf(n, reader)

    def _view(self, n: Node, name: str, fs: Tuple[int, ...], reader: Optional[Node]):
        if name == "stack":
            parts = argument(n, 0, "tensors")
            if not isinstance(parts, (list, tuple)) or len(parts) != 1:
                return self.leaf(n, reader)
            inner = parts[0]
        else:
            inner = n.args[0]
        ifs = self._per_edge(inner) if isinstance(inner, Node) else None
        if ifs is None or math.prod(ifs) != math.prod(fs) or fake_tensor(inner).dtype != self.dtype:
            return self.leaf(n, reader)
        e, _ = self.visit(inner, n)
        return e, fs


def _encoders_under_shared(b: "_Builder", root: Node, anchor: Node, absorbed=()) -> Set[Node]:
    """The edge encoders of ``b`` below an operation of the program whose value something
    outside the program reads too (the root: something besides ``anchor``): other programs
    over that value recompute it, each with the encoder, where reading the map as computed
    computes it once (PNA's mean, min, max and std of one message: 1.16x slower inside)."""
    if not b.encoders:
        return set()
    inner = {m for m in b.memo if isinstance(m, Node) and m not in b.leafed}
    out: Set[Node] = set()
    for m in inner:
        readers = [u for u in m.users if u not in inner and reads_value(u, m)]
        if m is root:
            readers = [] if root is anchor else [u for u in readers if u is not anchor and u not in absorbed]
        if not readers:
            continue
        todo, seen = [m], set()
        while todo:
            k = todo.pop()
            if k in seen:
                continue
            seen.add(k)
            if k in b.encoders:
                out.add(k)
            elif k in inner:
                todo += list(k.all_input_nodes)
    return out


def _build(message: Any, dst: IndexRef, dst_index: Node, anchor: Node, writes: Writes, stops=(),
           encoders: "bool | str" = True, absorbed=()):
    mv = fake_tensor(message)
    if not isinstance(message, Node) or mv is None:
        raise NoMatch("message is not a tensor of the graph")
    if mv.dtype not in (torch.float32, torch.float64):
        raise NoMatch(f"message of dtype {mv.dtype} (programs run in float32 / float64)")
    fs = _static(mv.shape[1:])
    if fs is None:
        raise NoMatch("message has a symbolic feature size")
    w = writes.clean([dst_index])
    if w is not None:
        raise NoMatch(describe_write(w, dst_index) + ": the index of the reduction changes")
    F = math.prod(fs)
    given = set(stops)
    stops, no_encoder = set(stops), set()
    while True:  # operations shared with the rest of the graph become inputs (_Builder.shared)
        b = _Builder(message, dst, dst_index, anchor, writes, stops, no_encoder, encoders)
        expr, efs = b.visit(message, anchor)
        shared = b.shared(message)
        # an edge encoder another reader needs too is computed anyway: read as computed; one
        # below an operation that other programs recompute too (PNA's one message under five
        # reductions) would be computed by each: read as computed once
        outside = {n for n in b.encoders
                   if any(u not in b.memo or u in b.leafed for u in n.users if reads_value(u, n))}
        outside |= _encoders_under_shared(b, message, anchor, absorbed)
        if not shared and not outside:
            break
        stops |= set(shared)
        no_encoder |= outside
    for n in sorted(stops - given, key=lambda n: writes.pos.get(n, 0)):
        if n in b.leafed:
            users = ", ".join(f"'{u.name}'" for u in n.users
                              if (u not in b.memo or u in b.leafed) and reads_value(u, n))
            b.kept.append(f"'{n.name}' read as computed: {users} outside the message also read it")
    if efs is None:
        raise NoMatch("message does not depend on the edge")
    b.check_reads()
    gathers = sum(1 for lf in b.leaves if lf.side in (P.COL, P.ROW))
    if not b.leaves:
        raise NoMatch("message is a constant")
    try:
        code, consts = P.encode(expr)
    except ValueError as e:
        raise NoMatch(str(e)) from None
    for k, lf in enumerate(b.leaves):
        if fake_tensor(lf.node).dtype not in FLOAT_DTYPES:
            raise NoMatch(f"message reads a {fake_tensor(lf.node).dtype} tensor")
        if F % lf.width:
            raise NoMatch(f"an input of width {lf.width} does not divide the message width {F}")
        if fake_tensor(lf.node).requires_grad:  # its gradient is a program too: it must fit the kernels
            try:
                P.derivative(tuple(code), tuple(consts), k, len(b.leaves))
            except ValueError as e:
                raise NoMatch(f"the gradient of input {k} of the message: {e}") from None
    return b, code, consts, F, fs, gathers


def match_program(sc: Scatter, dst: IndexRef, writes: Writes, stops=(), encoders: "bool | str" = True,
                  absorbed=()) -> Program:
    """``sc`` as a message program (with edge encoders inside where ``encoders``); raises NoMatch
    saying why not. ``absorbed``: readers of the message that the fused op replaces too (a softmax
    aggregation's scores and weighted messages), not counted as other readers."""
    b, code, consts, F, fs, gathers = _build(sc.message, dst, sc.index, sc.node, writes, stops, encoders, absorbed)
    if sc.reduce in ("max", "min"):  # torch's formula for ties: its derivatives must fit the kernels too
        for k, lf in enumerate(b.leaves):
            if fake_tensor(lf.node).requires_grad:
                try:
                    P.derivative(tuple(code), tuple(consts), k, len(b.leaves), True)
                except ValueError as e:
                    raise NoMatch(f"the {sc.reduce} gradient of input {k} of the message: {e}") from None
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
                   ops=tuple(dict.fromkeys(b.ops)), kept=tuple(b.kept))


# ----------------------------------------------------------------------------- softmax aggregation
@dataclass
class SoftmaxProgram(Program):
    """PyG's softmax aggregation (``SoftmaxAggregation``: ``alpha = softmax(m * t, I)``, then
    ``scatter(m * alpha, I, sum)``) of a message program's messages ``m``: one
    ``gnncompile::message_softmax`` (one pass per row, an online maximum, no ``E x F`` scores);
    ``temperature``: the parameter ``t`` (a node, ``[Wt]`` / ``[1, Wt]`` with Wt 1 or the width)
    or a number (1.0 where the scores are the messages themselves)."""

    temperature: Any = 1.0
    softmax: Any = None  # the match.Softmax it absorbs


def _temperature(a: Node, m: Node, F: int) -> Optional[Any]:
    """``t`` where the scores ``a`` are ``m * t`` / ``t * m`` (a number, or a tensor without the
    edge dimension of Wt = 1 or F values, shaped [Wt] or [1, Wt]), 1.0 where ``a`` is ``m``; None
    otherwise."""
    if a is m:
        return 1.0
    if opname(a) != "mul" or len(a.args) != 2 or a.kwargs:
        return None
    x, t = a.args
    if x is not m:
        x, t = t, x
    if x is not m:
        return None
    if isinstance(t, (int, float)) and not isinstance(t, bool):
        return float(t)
    tv = fake_tensor(t) if isinstance(t, Node) else None
    mv = fake_tensor(m)
    if tv is None or mv is None or tv.dtype != mv.dtype or tv.device != mv.device or tv.dim() not in (1, 2):
        return None
    shape = _static(tv.shape)
    if shape is None or (tv.dim() == 2 and shape[0] != 1) or shape[-1] not in (1, F):
        return None
    return t


def _grad_enabled_at(n: Node) -> bool:
    """Whether gradient mode is on at node ``n`` of its graph (Dynamo records ``torch.no_grad()``
    blocks as calls of ``torch._C._set_grad_enabled``)."""
    on = True
    for m in n.graph.nodes:
        if m is n:
            return on
        if m.op == "call_function" and m.target is torch._C._set_grad_enabled and m.args \
                and isinstance(m.args[0], bool):
            on = m.args[0]
    return on


class NotSoftmaxAggregation(NoMatch):
    """The chain is not a softmax aggregation of messages (nothing to say in explain)."""


def match_softmax_program(sc: Scatter, sm: Any, writes: Writes, stops=(), encoders: "bool | str" = True
                          ) -> SoftmaxProgram:
    """``sc`` (a sum of ``m * alpha``) with ``alpha`` the fused softmax ``sm`` of scores ``m * t``
    (or ``m``) over the same index, as one :class:`SoftmaxProgram`; raises NoMatch saying why
    not (:class:`NotSoftmaxAggregation` where the chain is no softmax aggregation). The softmax's
    scores, its internal scatters and ``alpha`` must have no other reader."""
    msg = sc.message
    if sc.reduce != "sum" or opname(msg) != "mul" or len(msg.args) != 2 or msg.kwargs:
        raise NotSoftmaxAggregation("not a sum of messages times a softmax")
    m, alpha = msg.args
    if alpha is not sm.anchor:
        m, alpha = alpha, m
    if alpha is not sm.anchor or not isinstance(m, Node):
        raise NotSoftmaxAggregation("not a sum of messages times a softmax")
    if IndexRef.of(sc.index) != sm.dst:
        raise NoMatch("the softmax groups the edges by another index than the sum")
    mv, av = fake_tensor(m), fake_tensor(sm.scores)
    if mv is None or av is None or mv.dim() != 2 or av.shape != mv.shape:
        raise NotSoftmaxAggregation("the softmax's scores are not [E, F] like the messages")
    if any(u is not msg and reads_value(u, alpha) for u in alpha.users) or \
            any(u is not sc.node and reads_value(u, msg) for u in msg.users):
        raise NoMatch("the softmax's weights or the weighted messages are read elsewhere")
    if _grad_enabled_at(sc.node) and not (_grad_enabled_at(sm.anchor) and _grad_enabled_at(sm.scores)):
        # SoftmaxAggregation(semi_grad=True): no gradient through alpha, which the op's backward has
        raise NoMatch("the softmax's weights are computed without gradient (semi_grad)")
    F = _static(mv.shape[1:])
    if F is None or len(F) != 1:
        raise NoMatch("messages of a symbolic or multi-dimensional feature size")
    t = _temperature(sm.scores, m, F[0])
    if t is None:
        raise NotSoftmaxAggregation("the softmax's scores are not the messages times a temperature")
    internal = set(sm.internals) | {sm.anchor}
    a = sm.scores
    sub = sm.anchor.args[0].args[0]  # exp(a - max[i]) / sum[i]
    detached = {u for u in a.users if opname(u) == "detach"
                and all(w in internal for w in u.users if reads_value(w, u))}
    if a is not m:  # scores m * t: read only by the softmax (its sub and the detached max)
        readers = [u for u in a.users if reads_value(u, a)]
        if not all(u is sub or u in internal or u in detached for u in readers):
            raise NoMatch("the softmax's scores are read outside the softmax")
    prog = match_program(dataclasses.replace(sc, message=m), IndexRef.of(sc.index), writes, stops, encoders,
                         absorbed={msg, a, sub, *detached})
    if prog.x is None and prog.gathers == 0:
        raise NoMatch("messages that gather no node features")
    if isinstance(t, Node) and writes.first_write(t, writes.pos[sm.scores] - 1, writes.pos[sc.node]) is not None:
        raise NoMatch("the temperature is written in place before the sum")
    needs_csc = any(lf.side == P.COL and fake_tensor(lf.node).requires_grad for lf in prog.leaves)
    fields = {k: getattr(prog, k) for k in prog.__dataclass_fields__}
    fields.update(reduce="softmax", needs_csc=needs_csc, temperature=t, softmax=sm)
    return SoftmaxProgram(**fields)


# ----------------------------------------------------------------------------- edge programs
_GEMM_USERS = ("linear", "matmul", "mm")
_ELEMENTWISE = set(_BINARY) | set(_UNARY) | set(_PARAMETRIC) | {"gelu", "clamp", "clip", "clamp_min", "clamp_max"}


@dataclass
class EdgeProgram(Program):
    """A per-edge elementwise expression over gathered rows that a GEMM reads (an MLP on edges:
    EdgeConv's ``relu(W [x_i, x_j - x_i] + b)`` after :mod:`.algebra`): computed by
    ``gnncompile::message_edges`` in one pass instead of one E x F tensor per operation."""


def match_edge_programs(graph, structures: List[Tuple[IndexRef, str, Node]], writes: Writes,
                        stops=(), encoders: "bool | str" = True) -> List[EdgeProgram]:
    """Edge programs over the structures the piece builds anyway (``structures``: destination
    row of an edge_index, its number of destinations, and the destination index node)."""
    out: List[EdgeProgram] = []
    if not structures:
        return out
    for n in graph.nodes:
        if opname(n) not in _ELEMENTWISE or not any(opname(u) in _GEMM_USERS for u in n.users):
            continue
        nv = fake_tensor(n)
        if nv is None or nv.dim() < 2:
            continue
        for dst, num_dst, dst_index in structures:
            try:
                b, code, consts, F, fs, gathers = _build(n, dst, dst_index, n, writes, stops, encoders)
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
                                   ops=tuple(dict.fromkeys(b.ops)), kept=tuple(b.kept)))
            break
    return out


__all__ = ["Leaf", "Program", "EdgeProgram", "SoftmaxProgram", "NotSoftmaxAggregation", "match_program",
           "match_softmax_program",
           "match_edge_programs"]
