"""Message programs as ONNX functions: every distinct ``gnncompile::message_reduce`` /
``message_edges`` call of an exported program becomes one function of the ``gnncompile`` domain
whose body is standard ONNX (opset 18), written here from the program's instructions
(:mod:`gnncompile.ops.program`).

Names: ``message_<reduce>_<hash>`` (``reduce``: sum, mean, max, min) and ``message_edges_<hash>``,
``<hash>`` the first 8 hex digits of a SHA-256 of everything the body depends on (the program's
code and constants, the side and width of every input, the message width, the reduction or the
per-edge output's width and order, the float dtype): the same program in two layers is one
function called twice, and a name stays the same from one export to the next.

A function's inputs are ``rowptr, col, perm`` (the CSR structure, int64, as ``build_csr`` gives
it) and the program's inputs ``in_0 ... in_{k-1}`` (``[rows, W_k]``); its body, as the
reference (:func:`gnncompile.ops.message.message_reduce`):

1. reads every input for every CSR slot by its side: ``col`` ``Gather(in, col)`` (the index
   through ``in_range``: an index outside ``[0, rows)`` fails as eager's ``index_select``
   does), ``row`` ``Gather(in, csr_rows(rowptr, col))``, ``edge`` ``Gather(in, perm)``,
   ``const`` row 0, ``slot`` as it is;
2. widens an input of width ``1 < W < F`` to ``F`` (each value repeated ``F / W`` times: one
   value per head); widths 1 and ``F`` broadcast as they are;
3. evaluates the instructions, one or a few standard nodes each (:data:`EMITTERS`: every
   opcode of :data:`gnncompile.ops.program.OPS`, the derivative helpers included), with
   torch's semantics at NaN and at the edges of each function (``clamp`` keeps NaN,
   ``x ** 2`` is ``x * x``, ``softplus`` switches to ``x`` above its threshold, ``sign`` of
   NaN is 0, ...); in float64, ``erf`` (gelu) is computed in float32, onnxruntime having no
   double kernel for it;
4. ``message_reduce``: the ``[E, F]`` messages reduced per destination row by the
   ``segment_<reduce>`` helper of :mod:`.onnx_functions` (0 for a row without edges, NaN
   propagated by max / min); ``message_edges``: summed to the output width, and put back in the
   user's edge order (``ScatterND`` at ``perm``) unless asked in CSR order.
"""
from __future__ import annotations

import hashlib
import json
import math
from dataclasses import dataclass
from typing import Callable, Dict, List, Optional, Sequence, Tuple

import onnx
from onnx import TensorProto, helper

from ..ops import program as P
from .onnx_functions import DOMAIN, SEGMENT

OPSET = 18
_SIDE_NAMES = {P.COL: "col", P.ROW: "row", P.EDGE: "edge", P.CONST: "const", P.SLOT: "slot", P.ENC: "enc"}
_DTYPES = {TensorProto.FLOAT: "float32", TensorProto.DOUBLE: "float64", TensorProto.FLOAT16: "float16",
           TensorProto.BFLOAT16: "bfloat16"}


class ProgramNotExpressible(ValueError):
    """A message program (or one of its arguments) that the ONNX body cannot express."""


@dataclass(frozen=True)
class MessageSpec:
    """Everything the body of one message function depends on."""

    kind: str  # "reduce" (message_reduce) or "edges" (message_edges)
    reduce: str  # sum / mean / max / min; "" for edges
    code: Tuple[int, ...]
    consts: Tuple[float, ...]
    sides: Tuple[int, ...]
    widths: Tuple[int, ...]
    width: int  # F, the message width
    out_width: int = 0  # edges: the output's width
    by_slot: bool = False  # edges: the output in CSR order
    dtype: int = TensorProto.FLOAT  # the inputs' ONNX element type

    def key(self) -> str:
        data = [self.kind, self.reduce, list(self.code), [float(c).hex() for c in self.consts], list(self.sides),
                list(self.widths), self.width, self.out_width, self.by_slot, self.dtype]
        return hashlib.sha256(json.dumps(data).encode()).hexdigest()[:8]

    @property
    def name(self) -> str:
        return f"message_edges_{self.key()}" if self.kind == "edges" else f"message_{self.reduce}_{self.key()}"

    def describe(self) -> str:
        """'max of relu(x_i, x_j) [F=16]': what a reader of the file sees the function compute."""
        names = [op for op, _ in _ops_of(self.code)]
        ins = ",".join(_SIDE_NAMES.get(s, "?") for s in self.sides)
        what = "+".join(dict.fromkeys(n for n in names if n not in ("in", "const"))) or "load"
        head = f"{self.reduce} of" if self.kind == "reduce" else "per edge:"
        return f"{head} {what}({ins}) [F={self.width}]"


def _ops_of(code: Sequence[int]):
    for i in range(0, len(code), P.INSTR):
        opc = int(code[i])
        if opc not in P.OPS:
            raise ProgramNotExpressible(f"unknown opcode {opc}")
        yield P.OPS[opc][0], code[i:i + P.INSTR]


def check(spec: MessageSpec) -> None:
    """Raises :class:`ProgramNotExpressible` saying why ``spec`` has no ONNX body."""
    if spec.dtype not in _DTYPES:
        raise ProgramNotExpressible(f"inputs of ONNX element type {spec.dtype} (float types only)")
    if spec.kind == "reduce" and spec.reduce not in SEGMENT:
        raise ProgramNotExpressible(f"unknown reduction {spec.reduce!r}")
    if not spec.code or len(spec.code) % P.INSTR:
        raise ProgramNotExpressible("code length is not a positive multiple of 5")
    if len(spec.sides) != len(spec.widths) or not spec.sides:
        raise ProgramNotExpressible(f"{len(spec.widths)} inputs for {len(spec.sides)} sides")
    for k, (s, w) in enumerate(zip(spec.sides, spec.widths)):
        if s not in _SIDE_NAMES:
            raise ProgramNotExpressible(f"input {k} has unknown side {s}")
        if s == P.ENC:  # an edge encoder: features of any width, then its weight and bias
            if k + 2 >= len(spec.sides) or spec.sides[k + 1] != P.CONST or spec.sides[k + 2] != P.CONST:
                raise ProgramNotExpressible(f"the edge encoder at input {k} has no weight and bias inputs")
            continue
        if not isinstance(w, int) or w < 1 or spec.width % w:
            raise ProgramNotExpressible(f"input {k} has width {w}, which does not divide {spec.width}")
    if spec.kind == "edges" and (spec.out_width < 1 or spec.width % spec.out_width):
        raise ProgramNotExpressible(f"output width {spec.out_width} does not divide {spec.width}")
    for name, ins in _ops_of(spec.code):
        if name not in EMITTERS and name not in ("in", "const"):
            raise ProgramNotExpressible(f"no ONNX form for opcode '{name}'")
        if name == "in" and not 0 <= int(ins[2]) < len(spec.sides):
            raise ProgramNotExpressible(f"instruction reads input {int(ins[2])} of {len(spec.sides)}")


# ----------------------------------------------------------------------------- body builder
class _Body:
    """Nodes of one function body, with typed scalar constants (cached per value)."""

    def __init__(self, dtype: int):
        self.dtype = dtype
        self.nodes: List[onnx.NodeProto] = []
        self.count = 0
        self.scalars: Dict[str, str] = {}

    def fresh(self, hint: str = "t") -> str:
        self.count += 1
        return f"{hint}_{self.count}"

    def __call__(self, op_type: str, *inputs: str, domain: str = "", outputs: int = 1, **attrs):
        outs = [self.fresh(op_type.lower()) for _ in range(outputs)]
        self.nodes.append(helper.make_node(op_type, list(inputs), outs, domain=domain, **attrs))
        return outs[0] if outputs == 1 else outs

    def scalar(self, v: float) -> str:
        """A 0-d constant of the body's float type."""
        key = float(v).hex()
        if key not in self.scalars:
            t = helper.make_tensor(self.fresh("c"), self.dtype, [], [float(v)])
            self.scalars[key] = self("Constant", value=t)
        return self.scalars[key]

    def ints(self, values: Sequence[int]) -> str:
        return self("Constant", value_ints=[int(v) for v in values])

    def like(self, boolean: str, ref: str) -> str:
        return self("CastLike", boolean, ref)


def _powc(b: _Body, a: str, c: float) -> str:
    """``a ** c`` for a number ``c``, as torch computes it (its special cases)."""
    if c == 0.0:  # 1, also for NaN and infinities
        return b("Expand", b.scalar(1.0), b("Shape", a))
    if c == 1.0:
        return b("Identity", a)
    if c == 2.0:
        return b("Mul", a, a)
    if c == 3.0:
        return b("Mul", b("Mul", a, a), a)
    if c == 0.5:
        return b("Sqrt", a)
    if c == -0.5:
        return b("Reciprocal", b("Sqrt", a))
    if c == -1.0:
        return b("Reciprocal", a)
    if c == -2.0:
        return b("Reciprocal", b("Mul", a, a))
    return b("Pow", a, b.scalar(c))


def _log1p(b: _Body, y: str) -> str:
    """``log(1 + y)`` accurate for a small ``y`` (``log(u) * y / (u - 1)``, ``u = 1 + y``)."""
    u = b("Add", y, b.scalar(1.0))
    um1 = b("Sub", u, b.scalar(1.0))
    exact = b("Div", b("Mul", b("Log", u), y), um1)
    return b("Where", b("Equal", um1, b.scalar(0.0)), y, exact)


def _erf(b: _Body, a: str) -> str:
    """Erf; in a float64 body computed in float32 (onnxruntime's CPU Erf has no double kernel:
    a relative error of about 1e-7 there)."""
    if b.dtype != TensorProto.DOUBLE:
        return b("Erf", a)
    return b("Cast", b("Erf", b("Cast", a, to=TensorProto.FLOAT)), to=TensorProto.DOUBLE)


def _gelu(b: _Body, a: str) -> str:  # x * 0.5 * (1 + erf(x / sqrt(2)))
    erf = _erf(b, b("Mul", a, b.scalar(1.0 / math.sqrt(2.0))))
    return b("Mul", b("Mul", a, b.scalar(0.5)), b("Add", erf, b.scalar(1.0)))


def _gelu_grad(b: _Body, a: str) -> str:
    cdf = b("Mul", b("Add", _erf(b, b("Mul", a, b.scalar(1.0 / math.sqrt(2.0)))), b.scalar(1.0)), b.scalar(0.5))
    pdf = b("Mul", b("Exp", b("Mul", b("Mul", a, a), b.scalar(-0.5))), b.scalar(1.0 / math.sqrt(2.0 * math.pi)))
    return b("Add", cdf, b("Mul", a, pdf))


def _softplus(b: _Body, a: str, beta: float, thr: float) -> str:
    z = b("Mul", a, b.scalar(beta))
    soft = b("Div", _log1p(b, b("Exp", z)), b.scalar(beta))
    return b("Where", b("Greater", z, b.scalar(thr)), a, soft)


def _softplus_grad(b: _Body, a: str, beta: float, thr: float) -> str:
    z = b("Exp", b("Mul", a, b.scalar(beta)))
    return b("Where", b("Greater", b("Mul", a, b.scalar(beta)), b.scalar(thr)), b.scalar(1.0),
             b("Div", z, b("Add", z, b.scalar(1.0))))


def _clamp(b: _Body, a: str, lo: float, hi: float) -> str:
    """torch.clamp: ``min(max(a, lo), hi)``, NaN kept (comparisons with NaN are false)."""
    out = a
    if lo != -math.inf:
        out = b("Where", b("Less", out, b.scalar(lo)), b.scalar(lo), out)
    if hi != math.inf:
        out = b("Where", b("Greater", out, b.scalar(hi)), b.scalar(hi), out)
    return out if out is not a else b("Identity", a)


def _pow_exp_grad(b: _Body, a: str, e: str) -> str:
    r = b("Mul", b("Pow", a, e), b("Log", a))
    zero = b.scalar(0.0)
    return b("Where", b("And", b("Equal", a, zero), b("GreaterOrEqual", e, zero)), zero, r)


# opcode name -> emitter(body, operand names, number params) -> output name
EMITTERS: Dict[str, Callable[..., str]] = {
    "add": lambda b, x, p: b("Add", *x), "sub": lambda b, x, p: b("Sub", *x),
    "mul": lambda b, x, p: b("Mul", *x), "div": lambda b, x, p: b("Div", *x),
    "neg": lambda b, x, p: b("Neg", x[0]), "relu": lambda b, x, p: b("Relu", x[0]),
    "leaky_relu": lambda b, x, p: b("LeakyRelu", x[0], alpha=p[0]),
    "elu": lambda b, x, p: b("Elu", x[0], alpha=p[0]),
    "gelu": lambda b, x, p: _gelu(b, x[0]),
    "sigmoid": lambda b, x, p: b("Sigmoid", x[0]), "tanh": lambda b, x, p: b("Tanh", x[0]),
    "softplus": lambda b, x, p: _softplus(b, x[0], *p),
    "exp": lambda b, x, p: b("Exp", x[0]), "log": lambda b, x, p: b("Log", x[0]),
    "clamp": lambda b, x, p: _clamp(b, x[0], *p),
    "pow": lambda b, x, p: b("Pow", *x), "sqrt": lambda b, x, p: b("Sqrt", x[0]),
    "abs": lambda b, x, p: b("Abs", x[0]),
    # torch's (0 < a) - (a < 0): 0 for NaN, where ONNX's Sign gives NaN
    "sign": lambda b, x, p: b("Sub", b.like(b("Less", b.scalar(0.0), x[0]), x[0]),
                              b.like(b("Less", x[0], b.scalar(0.0)), x[0])),
    "powc": lambda b, x, p: _powc(b, x[0], p[0]),
    # derivative helpers (a matched forward never holds them; written for completeness)
    "step": lambda b, x, p: b.like(b("Not", b("LessOrEqual", x[0], b.scalar(0.0))), x[0]),
    "leaky_relu_grad": lambda b, x, p: b("Where", b("Greater", x[0], b.scalar(0.0)), b.scalar(1.0), b.scalar(p[0])),
    "elu_grad": lambda b, x, p: b("Where", b("Greater", x[0], b.scalar(0.0)), b.scalar(1.0),
                                  b("Mul", b("Exp", x[0]), b.scalar(p[0]))),
    "gelu_grad": lambda b, x, p: _gelu_grad(b, x[0]),
    "softplus_grad": lambda b, x, p: _softplus_grad(b, x[0], *p),
    "clamp_grad": lambda b, x, p: b.like(b("And", b("GreaterOrEqual", x[0], b.scalar(p[0])),
                                               b("LessOrEqual", x[0], b.scalar(p[1]))), x[0]),
    "pow_exp_grad": lambda b, x, p: _pow_exp_grad(b, *x),
    "gate": lambda b, x, p: b("Where", b("Not", b("Equal", x[1], b.scalar(0.0))), x[0], b.scalar(0.0)),
    "eq": lambda b, x, p: b.like(b("Equal", x[0], x[1]), x[0]),
}


def function_proto(spec: MessageSpec) -> onnx.FunctionProto:
    """The ONNX function of ``spec`` (module docstring); it calls the helpers of
    :mod:`.onnx_functions` (``in_range``, ``csr_rows``, ``segment_<reduce>``), which the
    exporter inlines (:func:`gnncompile.export.onnx_export._inline_helpers`)."""
    check(spec)
    b = _Body(spec.dtype)
    F = spec.width
    ins = [f"in_{k}" for k in range(len(spec.sides))]
    rows = None
    read: Dict[int, str] = {}

    def value(k: int) -> str:  # input k read per CSR slot, widened to F where 1 < W < F
        nonlocal rows
        if k in read:
            return read[k]
        side, W, x = spec.sides[k], spec.widths[k], ins[k]
        if side == P.COL:
            n = b("Shape", x, end=1)
            v = b("Gather", x, b("in_range", "col", n, domain=DOMAIN), axis=0)
        elif side == P.ROW:
            if rows is None:
                rows = b("csr_rows", "rowptr", "col", domain=DOMAIN)
            v = b("Gather", x, rows, axis=0)
        elif side == P.EDGE:
            v = b("Gather", x, "perm", axis=0)
        elif side == P.ENC:  # b + a Wt (program.py), the encoder's width in place of the features'
            v = b("Add", b("MatMul", b("Gather", x, "perm", axis=0), ins[k + 1]), ins[k + 2])
            W = spec.widths[k + 1]
        elif side == P.CONST:
            v = b("Slice", x, b.ints([0]), b.ints([1]), b.ints([0]))
        else:  # slot: stored in CSR order
            v = x
        if 1 < W < F:
            wide = b("Expand", b("Unsqueeze", v, b.ints([2])), b.ints([1, W, F // W]))
            v = b("Reshape", wide, b("Concat", b("Shape", v, end=1), b.ints([F]), axis=0))
        read[k] = v
        return v

    regs: Dict[int, str] = {}
    out = None
    for name, (opc, dst, a, bb, c) in _ops_of(spec.code):
        _, arity, npar = P.OPS[int(opc)]
        if name == "in":
            out = value(int(a))
        elif name == "const":
            out = b.scalar(spec.consts[int(a)])
        else:
            operands = [regs[int(a)]] + ([regs[int(bb)]] if arity == 2 else [])
            params = []
            if arity == 1 and npar >= 1:
                params.append(float(spec.consts[int(bb)]))
            if arity == 1 and npar == 2:
                params.append(float(spec.consts[int(c)]))
            out = EMITTERS[name](b, operands, params)
        regs[int(dst)] = out
    # [E, F] whatever broadcast the program did (a message of one value per edge, or a constant)
    m = b("Expand", out, b("Concat", b("Shape", "col"), b.ints([F]), axis=0))
    if spec.kind == "reduce":
        result = b(f"segment_{spec.reduce}", "rowptr", "col", m, domain=DOMAIN)
    else:
        if spec.out_width != F:
            grouped = b("Reshape", m, b("Concat", b("Shape", "col"), b.ints([spec.out_width, F // spec.out_width]),
                                        axis=0))
            m = b("ReduceSum", grouped, b.ints([2]), keepdims=0)
        result = m if spec.by_slot else b("ScatterND", m, b("Unsqueeze", "perm", b.ints([1])), m)
    result = b("Identity", result)
    b.nodes[-1].output[0] = "out"
    return helper.make_function(
        DOMAIN, spec.name, ["rowptr", "col", "perm", *ins], ["out"], b.nodes,
        opset_imports=[helper.make_opsetid("", OPSET), helper.make_opsetid(DOMAIN, 1)],
        doc_string=f"gnncompile message program: {spec.describe()}")


def spec_of(kind: str, inputs, sides, code, consts, width: int, reduce: str = "", out_width: int = 0,
            by_slot: bool = False, dtype: Optional[int] = None) -> MessageSpec:
    """The :class:`MessageSpec` of an op call whose program inputs are ``inputs`` (values with
    ``.shape`` and ``.dtype``, ONNX IR values or tensors)."""
    widths = []
    for k, v in enumerate(inputs):
        shape = getattr(v, "shape", None)
        w = shape[1] if shape is not None and len(shape) == 2 else None
        w = getattr(w, "value", w)  # an onnx_ir static dim
        if not isinstance(w, int):
            raise ProgramNotExpressible(f"input {k} of the message has no static width (shape {shape})")
        widths.append(int(w))
    if dtype is None:
        dt = getattr(inputs[0], "dtype", None)
        dtype = int(dt) if dt is not None else TensorProto.FLOAT
    spec = MessageSpec(kind, reduce, tuple(int(c) for c in code), tuple(float(c) for c in consts),
                       tuple(int(s) for s in sides), tuple(widths), int(width), int(out_width), bool(by_slot),
                       dtype)
    check(spec)
    return spec


__all__ = ["MessageSpec", "ProgramNotExpressible", "EMITTERS", "check", "function_proto", "spec_of"]
