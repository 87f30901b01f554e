"""The emitter: a message program (:mod:`gnncompile.ops.program`) as the C++ source of one
kernel of a message op for the CPU: ``message_reduce`` (a reduction), ``message_sum_multi``
(several result slots, each summed over the row: the backward's derivative programs) or
``message_edges`` (every edge's message, written per edge or per CSR slot, optionally as group
sums).

What the interpreter (native/cpu/message_core.h) decides per edge and per instruction at run
time is fixed here at generation time: the instruction list, its constants (written as exact
hexadecimal literals), every input's side and width class, the dtypes, the reduction and the
feature tile. The expression becomes one statement per instruction over locals (SSA values, one
per instruction), inside one loop over the tile's features, so values stay in registers and no
tile makes a round trip through memory. Everything else is the interpreter's own code, included
from the torch-free headers: the row walk's checks (``row_ok``, ``in_range``), ``fold_extreme``
for max / min, ``store_reduced`` for the mean's scale and the arg record; the walk of each op is
the interpreter's (reduce_rows, sum_rows_multi, edge_rows in message_core.h), with its checks in
the same order and its prefetch (into L2 rather than L1 in a reduction that computes an edge
encoder and gathers rows through col).
The glue runs the kernel per chunk of its balanced row split
(native/cpu/codegen_abi.h).

Numerics: every operator is the interpreter's expression, in the same type and the same order,
and the kernel is compiled with ``-ffp-contract=off``, so that no product of one instruction is
fused with a sum of another into one multiply-add (the interpreter's instructions pass through
memory, which cannot fuse; inside an instruction, ``gelu_grad``'s ``cdf + v * pdf`` and an edge
encoder's sum of products, the interpreter's file, native/cpu/message.cpp, is compiled with
``-ffp-contract=off`` too: tests/codegen checks it). An edge encoder (side ``enc``) is computed per
edge and tile by the interpreter's own code (native/cpu/encoder_core.h), D fixed at generation;
in a reduction (message_reduce, message_sum_multi, message_softmax) for kEncodeBlock edges at once
(encode_block: the edges share each load of Wt, every column the same sum in the same order, so
the same bits), kept in an EncoderBlock over the chunk's rows where one tile covers F (a block
crosses rows), cut at the row's end where F takes several tiles; those kernels prefetch three
times the knob's distance ahead (a block reads its edges' features up to 4 slots ahead).
Measured (benchmarks/results/codegen_encoder_block_zen4_s54.md, Zen 4): relu(x_j + lin(a_e)) 1.80x
the spmm against 2.12x edge by edge in the same run.
Transcendental operators call the interpreter's functions: in float32 native/cpu/vmath.h's
(``vm::exp``, ``vm::erf``, ...: inline and branch-free, so the loop holding them vectorizes; a few
ulp from the correctly rounded value), in float64 libm's (``vm::`` forwards to ``std::``); ``pow``
is libm's in both. Equal bit for bit (the same inline code, the same flags: the kernels and the
interpreter's message.cpp are compiled with ``-ffp-contract=off -fno-trapping-math``). Generated and
interpreted results are compared bit for bit in tests/codegen (NaN compared as NaN: which NaN's
sign a sum of two NaNs keeps is the instruction's operand order, the compiler's choice).
"""
from __future__ import annotations

import math
import struct
from dataclasses import dataclass
from typing import List, Optional, Sequence, Tuple

from ..ops import program as P

ABI = 3  # native/cpu/codegen_abi.h, kCodegenAbi
REDUCES = {"sum": 0, "add": 0, "mean": 1, "max": 2, "amax": 2, "min": 3, "amin": 3}
_REDUCE_NAMES = {0: "Sum", 1: "Mean", 2: "Max", 3: "Min"}
TILE = {"float32": 128, "float64": 64}  # features per tile: as the interpreter and the tuned spmm


KINDS = ("reduce", "multi", "edges", "encgrad", "softmax")
MAX_RESULTS = 16  # kMaxResults (native/cpu/message_core.h)


@dataclass(frozen=True)
class Spec:
    """What one generated kernel is specialised on: the key of native/cpu/message_codegen.h.

    ``op`` is the native op the kernel stands in for: 'reduce' (``message_reduce``, its
    ``reduce``), 'multi' (``message_sum_multi``, the program's ``results`` slots each summed over
    the row) or 'edges' (``message_edges``: written per edge at ``perm[j]``, or at ``j`` with
    ``by_slot``; ``out`` 'f' for an output of width F, 'g' for group sums of F / out_width) or
    'softmax' (``message_softmax``: the softmax aggregation of the messages with the temperature
    read from the last input, a constant the program does not read; out and lse per row)."""

    code: Tuple[int, ...]
    consts: Tuple[float, ...]
    sides: Tuple[int, ...]
    kinds: Tuple[str, ...]  # per input: 'f' (width F), 's' (width 1), 'g' (another divisor of F)
    reduce: int  # 0 sum, 1 mean, 2 max, 3 min (reduce only)
    dtype: str  # float32 / float64
    index: str  # int32 / int64
    op: str = "reduce"
    results: Tuple[int, ...] = ()
    by_slot: bool = False
    out: str = "f"
    # per input: D, the features of an edge encoder (side enc, whose kind is the width class of
    # the encoder's output, Wt's), 0 for the others; () when no input is an encoder
    dims: Tuple[int, ...] = ()
    enc: int = -1  # encgrad: the encoder's input
    need_features: bool = False  # encgrad: the features' gradient written too

    def dim(self, k: int) -> int:
        return self.dims[k] if self.dims else 0

    def op_key(self) -> str:
        if self.op == "reduce":
            return f"r{self.reduce}"
        if self.op == "multi":
            return "m" + ".".join(str(r) for r in self.results)
        if self.op == "encgrad":
            return f"n{self.enc}.{int(self.need_features)}{self.out}"
        if self.op == "softmax":
            return "s"
        return f"e{int(self.by_slot)}{self.out}"

    def key(self) -> str:
        """The registry key, byte for byte as codegen_key (native/cpu/message_codegen.cpp) writes it
        (an edge encoder's input: its side, its output's width class, then ``d<D>``)."""
        ks = ",".join(f"{struct.unpack('<Q', struct.pack('<d', float(c)))[0]:016x}" for c in self.consts)
        ins = ",".join(f"{s}{k}" + (f"d{self.dim(i)}" if s in P.ENCODERS else "")
                       for i, (s, k) in enumerate(zip(self.sides, self.kinds)))
        return (f"v{ABI}|{self.op_key()}|{'f64' if self.dtype == 'float64' else 'f32'}|"
                f"{'i64' if self.index == 'int64' else 'i32'}|c{','.join(str(c) for c in self.code)}|k{ks}|i{ins}")


def width_kind(width: int, F: int) -> str:
    return "f" if width == F else ("s" if width == 1 else "g")


def make_spec(code: Sequence[int], consts: Sequence[float], sides: Sequence[int], widths: Sequence[int], F: int,
              reduce: str, dtype, index_dtype, *, op: str = "reduce", results: Sequence[int] = (),
              out_width: Optional[int] = None, by_slot: bool = False, enc: Optional[int] = None,
              need_features: bool = False) -> Spec:
    """The :class:`Spec` of a ``message_reduce`` call (dtypes as torch dtypes or their names); with
    ``op='multi'`` of a ``message_sum_multi`` call (``results``; ``reduce`` must be 'sum'), with
    ``op='edges'`` of a ``message_edges`` call (``out_width``, ``by_slot``; ``reduce`` 'sum'), with
    ``op='encgrad'`` of a ``message_encoder_grad`` call (``enc``, ``need_features``; ``out_width``
    the encoder's W)."""
    if op not in KINDS:
        raise ValueError(f"gnncompile.codegen: unknown op {op!r} (one of {', '.join(KINDS)})")
    if reduce not in REDUCES:
        raise ValueError(f"gnncompile.codegen: unknown reduce {reduce!r}")
    if op != "reduce" and REDUCES[reduce] != 0:
        raise ValueError(f"gnncompile.codegen: a '{op}' kernel sums (reduce 'sum'), got {reduce!r}")
    dt = str(dtype).replace("torch.", "")
    it = str(index_dtype).replace("torch.", "")
    if dt not in TILE:
        raise TypeError(f"gnncompile.codegen: generated kernels take float32 or float64 inputs, got {dt}")
    if it not in ("int32", "int64"):
        raise TypeError(f"gnncompile.codegen: index dtype must be int32 or int64, got {it}")
    if len(sides) != len(widths):
        raise ValueError(f"gnncompile.codegen: {len(sides)} sides for {len(widths)} inputs")
    written = check_program(code, consts, len(sides))
    kinds, dims = _kinds(sides, widths, int(F))
    res: Tuple[int, ...] = ()
    out = "f"
    if op == "multi":
        res = tuple(int(r) for r in results)
        if not 1 <= len(res) <= MAX_RESULTS:
            raise ValueError(f"gnncompile.codegen: 1 to {MAX_RESULTS} results, got {len(res)}")
        if any(r not in written for r in res):
            raise ValueError(f"gnncompile.codegen: results {list(res)} name a slot that no instruction writes")
    elif op == "edges":
        if out_width is None or int(out_width) < 1 or int(F) % int(out_width):
            raise ValueError(f"gnncompile.codegen: out_width {out_width} does not divide the message width {F}")
        out = "f" if int(out_width) == int(F) else "g"
    elif op == "encgrad":
        if enc is None or not 0 <= int(enc) < len(sides) or int(sides[int(enc)]) not in P.ENCODERS:
            raise ValueError(f"gnncompile.codegen: an 'encgrad' kernel needs enc, the input of an edge encoder "
                             f"(got {enc})")
        if out_width is None or int(out_width) != int(widths[int(enc) + 1]):
            raise ValueError(f"gnncompile.codegen: an 'encgrad' kernel's out_width is its encoder's width "
                             f"{widths[int(enc) + 1]}, got {out_width}")
        out = "f" if int(out_width) == int(F) else "g"
    elif op == "softmax" and (not sides or int(sides[-1]) != P.CONST):
        raise ValueError("gnncompile.codegen: a 'softmax' kernel reads its temperature from its last input, a constant")
    elif results or out_width is not None or by_slot:
        raise ValueError("gnncompile.codegen: results / out_width / by_slot belong to 'multi' and 'edges' kernels")
    return Spec(tuple(int(c) for c in code), tuple(float(c) for c in consts), tuple(int(s) for s in sides),
                kinds, REDUCES[reduce], dt, it, op, res, bool(by_slot) if op == "edges" else False, out, dims,
                int(enc) if op == "encgrad" else -1, bool(need_features) if op == "encgrad" else False)


def _kinds(sides: Sequence[int], widths: Sequence[int], F: int) -> Tuple[Tuple[str, ...], Tuple[int, ...]]:
    """Every input's width class, and every edge encoder's D (``widths``: every input's columns;
    an encoder's are its D, its output's width is input k + 1's: program.py): the checks of
    native/cpu/message.cpp's check_encoder that the widths allow, as ValueError."""
    kinds, dims = [], []
    for k, (s, w) in enumerate(zip(sides, widths)):
        if int(s) not in P.ENCODERS:
            kinds.append(width_kind(int(w), F))
            dims.append(0)
            continue
        if k + 2 >= len(sides) or int(sides[k + 1]) != P.CONST or int(sides[k + 2]) != P.CONST:
            raise ValueError(f"gnncompile.codegen: the edge encoder at input {k} needs its weight and bias as "
                             f"constant inputs {k + 1} and {k + 2}")
        W = int(widths[k + 1])
        if int(w) < 1 or W < 1 or F % W or int(widths[k + 2]) != W:
            raise ValueError(f"gnncompile.codegen: the edge encoder at input {k} has D = {w}, a weight of width {W} "
                             f"and a bias of width {widths[k + 2]}: not D >= 1 and one width dividing {F}")
        kinds.append(width_kind(W, F))
        dims.append(int(w))
    return tuple(kinds), (tuple(dims) if any(int(s) in P.ENCODERS for s in sides) else ())


def check_program(code: Sequence[int], consts: Sequence[float], n_inputs: int) -> set:
    """The checks of native/cpu/message.cpp's check_program, as ValueError; returns the slots written."""
    if len(code) == 0 or len(code) % P.INSTR:
        raise ValueError("gnncompile.codegen: code must hold whole 5-int instructions")
    written = set()
    for i in range(0, len(code), P.INSTR):
        op, dst, a, b, c = (int(v) for v in code[i:i + P.INSTR])
        if op not in P.OPS or not 0 <= dst < P.MAX_SLOTS:
            raise ValueError(f"gnncompile.codegen: bad instruction {list(code[i:i + P.INSTR])}")
        name, ar, npar = P.OPS[op]
        if name == "in":
            if not 0 <= a < n_inputs:
                raise ValueError(f"gnncompile.codegen: instruction {i // P.INSTR} reads input {a} of {n_inputs}")
        elif name == "const":
            if not 0 <= a < len(consts):
                raise ValueError(f"gnncompile.codegen: instruction {i // P.INSTR} reads constant {a}")
        else:
            if a not in written or (ar == 2 and b not in written):
                raise ValueError(f"gnncompile.codegen: instruction {i // P.INSTR} reads a slot before it is written")
            if (npar >= 1 and not 0 <= b < len(consts)) or (npar == 2 and not 0 <= c < len(consts)):
                raise ValueError(f"gnncompile.codegen: instruction {i // P.INSTR} reads a missing constant")
        written.add(dst)
    return written


def _lit(v: float) -> str:
    """A double literal equal to ``v`` bit for bit, as ``acc_t``."""
    if math.isnan(v):
        bits = struct.unpack("<Q", struct.pack("<d", v))[0]
        return f"acc_t(__builtin_bit_cast(double, uint64_t(0x{bits:016x}ull)))"
    if math.isinf(v):
        return f"acc_t({'-' if v < 0 else ''}std::numeric_limits<double>::infinity())"
    return f"acc_t({float(v).hex()})"


def _as_acc(v: float, dtype: str) -> float:
    """``v`` converted to the compute type (what the interpreter compares its constants as)."""
    if dtype == "float64" or math.isnan(v) or math.isinf(v):
        return v
    try:
        return struct.unpack("<f", struct.pack("<f", v))[0]
    except OverflowError:
        return math.copysign(math.inf, v)


def _pow_number(x: str, c: float, dtype: str) -> str:
    """pow_number (message_core.h) with its branch taken here: the same special cases, tested on
    the constant in the compute type."""
    ca = _as_acc(c, dtype)
    if ca == 2.0:
        return f"{x} * {x}"
    if ca == 3.0:
        return f"{x} * {x} * {x}"
    if ca == 0.5:
        return f"std::sqrt({x})"
    if ca == -0.5:
        return f"acc_t(1) / std::sqrt({x})"
    if ca == -1.0:
        return f"acc_t(1) / {x}"
    if ca == -2.0:
        return f"acc_t(1) / ({x} * {x})"
    return f"std::pow({x}, {_lit(c)})"


# scalar calls that keep a loop holding them from vectorizing: libm's pow, and in float64 every
# function of native/cpu/vmath.h (libm there); the float32 ones are inline and vectorize
_CALLS = {"float32": ("std::pow",), "float64": ("std::pow", "vm::")}


ENC_UNROLL = 32  # an edge encoder of up to this many features is one unrolled sum per feature


def _enc_value(k: int, D: int, c: str, dtype: str, cuda: bool = False) -> str:
    """Edge encoder ``k``'s value at column ``c`` (an expression) for the edge whose features are
    at ``p<k>`` (Wt at ``wt<k>``, of width ``ew<k>``; b at ``bs<k>``), in one line: b[c], then
    each product added in feature order, each product rounded, as the interpreter (the CPU
    kernels are compiled with -ffp-contract=off; on CUDA the products are ``__fmul_rn`` /
    ``__dmul_rn``, which are never fused into a multiply-add). Unrolled up to ENC_UNROLL
    features, a loop beyond."""
    def mul(x: str, y: str) -> str:
        if cuda:
            return f"{'__dmul_rn' if dtype == 'float64' else '__fmul_rn'}({x}, {y})"
        return f"{x} * {y}"
    if D <= ENC_UNROLL:
        terms = [f"acc_t(bs{k}[{c}])"]
        for d in range(D):
            row = "" if d == 0 else (f"ew{k} + " if d == 1 else f"{d} * ew{k} + ")
            terms.append(mul(f"acc_t(p{k}[{d}])", f"acc_t(wt{k}[{row}{c}])"))
        return " + ".join(terms)
    return (f"[&] {{ const int64_t ec = {c}; acc_t ev = acc_t(bs{k}[ec]); for (int d = 0; d < {D}; ++d) "
            f"ev = ev + {mul(f'acc_t(p{k}[d])', f'acc_t(wt{k}[d * ew{k} + ec])')}; return ev; }}()")


def _statements(code: Sequence[int], consts: Sequence[float], kinds: Sequence[str], dtype: str,
                dims: Sequence[int] = (), cuda: bool = False) -> Tuple[List[tuple], str, dict]:
    """The per-feature statements of the program (feature ``f``, tile offset ``t``), per
    instruction (its local, its lines, the locals it reads, whether it calls libm, whether it only
    reads an input or a constant), the name of
    its result and the local holding each slot's last value (what the interpreter's registers
    hold after the program: message_sum_multi's results). Input k's value at ``f`` is read from
    ``p<k>`` (width F or a divisor of F) or ``s<k>`` (width 1), set up by the caller. An edge
    encoder's (``dims[k]`` > 0: ``p<k>`` its features) is computed per feature on CUDA
    (:func:`_enc_value`); on the CPU the caller computes it per edge: ``s<k>`` (width 1), or
    ``e<k>``, the tile's columns (from ``c0_<k>`` below width F): in a reduction (a tile walk) a
    row of encoder_core.h's EncoderBlock (kEncodeBlock edges computed at once), in the per-edge
    kernels by encode_run."""
    lines: List[str] = []
    instrs: List[tuple] = []
    reg = {}
    res = ""
    for i in range(0, len(code), P.INSTR):
        op, dst, a, b, c = (int(v) for v in code[i:i + P.INSTR])
        name = P.OPS[op][0]
        v = f"v{i // P.INSTR}"
        x = reg.get(a, "")
        y = reg.get(b, "")
        start = len(lines)
        arity = P.OPS[op][1] if name not in ("in", "const") else 0
        deps = [x, y][:arity]
        pb = _lit(consts[b]) if name not in ("in", "const") and P.OPS[op][2] >= 1 else ""
        pc = _lit(consts[c]) if P.OPS[op][2] == 2 else ""
        if name == "in" and dims and dims[a]:
            k = a
            if cuda:
                rhs = _enc_value(k, dims[k], {"f": "f", "s": "0", "g": f"f / div{k}"}[kinds[k]], dtype, cuda)
            else:
                rhs = {"s": f"s{k}", "f": f"e{k}[t]", "g": f"e{k}[f / div{k} - c0_{k}]"}[kinds[k]]
        elif name == "in":
            k = a
            if kinds[k] == "f":
                rhs = f"acc_t(p{k}[f])"
            elif kinds[k] == "s":
                rhs = f"s{k}"
            else:
                rhs = f"acc_t(p{k}[f / div{k}])"
        elif name == "const":
            rhs = _lit(consts[a])
        elif name in ("add", "sub", "mul", "div"):
            rhs = f"{x} {dict(add='+', sub='-', mul='*', div='/')[name]} {y}"
        elif name == "neg":
            rhs = f"-{x}"
        elif name == "relu":
            rhs = f"{x} < acc_t(0) ? acc_t(0) : {x}"
        elif name == "leaky_relu":
            rhs = f"{x} > acc_t(0) ? {x} : {x} * {pb}"
        elif name == "elu":
            rhs = f"{x} > acc_t(0) ? {x} : {pb} * vm::expm1({x})"
        elif name == "gelu":
            rhs = f"{x} * acc_t(0.5) * (acc_t(1) + vm::erf({x} * acc_t(0.70710678118654752440)))"
        elif name == "sigmoid":
            rhs = f"vm::sigmoid({x})"
        elif name == "tanh":
            rhs = f"vm::tanh({x})"
        elif name == "softplus":
            rhs = f"{x} * {pb} > {pc} ? {x} : vm::log1p(vm::exp({x} * {pb})) / {pb}"
        elif name == "exp":
            rhs = f"vm::exp({x})"
        elif name == "log":
            rhs = f"vm::log({x})"
        elif name == "clamp":
            lines.append(f"const acc_t {v}c = {x} < {pb} ? {pb} : {x};")
            rhs = f"{x} != {x} ? {x} : ({v}c > {pc} ? {pc} : {v}c)"
        elif name == "pow":
            rhs = f"std::pow({x}, {y})"
        elif name == "sqrt":
            rhs = f"std::sqrt({x})"
        elif name == "abs":
            rhs = f"std::abs({x})"
        elif name == "sign":
            rhs = f"{x} > acc_t(0) ? acc_t(1) : ({x} < acc_t(0) ? acc_t(-1) : acc_t(0))"
        elif name == "step":
            rhs = f"{x} <= acc_t(0) ? acc_t(0) : acc_t(1)"
        elif name == "leaky_relu_grad":
            rhs = f"{x} > acc_t(0) ? acc_t(1) : {pb}"
        elif name == "elu_grad":
            rhs = f"{x} > acc_t(0) ? acc_t(1) : {pb} * vm::exp({x})"
        elif name == "gelu_grad":
            lines.append(f"const acc_t {v}c = acc_t(0.5) * (acc_t(1) + vm::erf({x} * acc_t(0.70710678118654752440)));")
            lines.append(f"const acc_t {v}p = vm::exp(acc_t(-0.5) * {x} * {x}) * acc_t(0.39894228040143267794);")
            rhs = f"{v}c + {x} * {v}p"
        elif name == "softplus_grad":
            lines.append(f"const acc_t {v}z = vm::exp({x} * {pb});")
            rhs = f"{x} * {pb} > {pc} ? acc_t(1) : {v}z / ({v}z + acc_t(1))"
        elif name == "clamp_grad":
            rhs = f"({x} >= {pb} && {x} <= {pc}) ? acc_t(1) : acc_t(0)"
        elif name == "pow_exp_grad":
            rhs = f"({x} == acc_t(0) && {y} >= acc_t(0)) ? acc_t(0) : std::pow({x}, {y}) * vm::log({x})"
        elif name == "powc":
            rhs = _pow_number(x, consts[b], dtype)
        elif name == "gate":
            rhs = f"{y} != acc_t(0) ? {x} : acc_t(0)"
        elif name == "eq":
            rhs = f"{x} == {y} ? acc_t(1) : acc_t(0)"
        else:  # pragma: no cover - check_program refuses unknown opcodes
            raise ValueError(f"gnncompile.codegen: no emitter for '{name}'")
        lines.append(f"const acc_t {v} = {rhs};")
        mine = lines[start:]
        instrs.append((v, mine, deps, any(fn in ln for ln in mine for fn in _CALLS[dtype]), name in ("in", "const")))
        reg[dst] = v
        res = v
    return instrs, res, dict(reg)


def _loops(instrs, tail: List[str], tail_reads: Sequence[str], head: str, indent: str = "    "
           ) -> Tuple[List[str], List[str]]:
    """The per-feature loops of a program over one tile: one loop while the program calls no libm
    function (every value in registers, a loop the compiler vectorizes; float32's transcendental
    functions are vmath.h's, inline). A program that calls libm (float64's exp, erf, tanh, ...;
    pow in both: scalar calls, which keep a loop that holds them from vectorizing)
    is cut into loops at each call: the call's own scalar loop, and between calls loops of plain
    arithmetic that vectorize, the values one loop hands to a later one kept in tile arrays (as
    the interpreter keeps every value: the same operations in the same order, the same bits).
    ``tail`` (the fold or the store, reading ``tail_reads``) ends the last loop; ``head`` opens
    each loop's body (``f`` from ``t``). Returns (declarations of the tile arrays, the loops)."""
    segs: List[list] = []
    for ins in instrs:
        if ins[3] or not segs or segs[-1][-1][3]:
            segs.append([ins])
        else:
            segs[-1].append(ins)
    where, leaf = {}, {}  # local -> its segment; an input's or a constant's local -> its line
    for k, seg in enumerate(segs):
        for ins in seg:
            where[ins[0]] = k
            if ins[4]:
                leaf[ins[0]] = ins[1][0]
    reads = [set(d for ins in seg for d in ins[2]) for seg in segs]
    reads[-1] |= set(tail_reads)
    # inputs and constants a later loop reads are read again there, the others handed in arrays
    again = [sorted((n for n in r if n in leaf and where[n] < k), key=lambda n: int(n[1:])) for k, r in enumerate(reads)]
    handed = sorted({n for k, r in enumerate(reads) for n in r if where.get(n, k) < k and n not in leaf},
                    key=lambda n: int(n[1:]))
    decls = [f"  alignas(64) acc_t a_{n}[TILE];" for n in handed]
    out: List[str] = []
    for k, seg in enumerate(segs):
        out.append(f"{indent}for (int t = 0; t < n; ++t) {{")
        out.append(head)
        out += [f"{indent}  {leaf[n]}" for n in again[k]]
        out += [f"{indent}  const acc_t {n} = a_{n}[t];" for n in handed if n in reads[k] and where[n] < k]
        out += [f"{indent}  {ln}" for ins in seg for ln in ins[1]]
        if k == len(segs) - 1:
            out += tail
        else:
            out += [f"{indent}  a_{n}[t] = {n};" for n in handed
                    if where[n] == k and any(n in reads[m] for m in range(k + 1, len(segs)))]
        out.append(f"{indent}}}")
    return decls, out


_HEAD = """\
// Generated by gnncompile.codegen (gnncompile/codegen/emit.py): one {what} kernel.
// key: {key}
#include <cmath>
#include <cstdint>
#include <limits>

#include "common/dtype.h"
#include "common/macros.h"
#include "cpu/codegen_abi.h"
#include "cpu/reduce_core.h"
#include "cpu/rows_core.h"
#include "cpu/vmath.h"

namespace {{
using namespace gnncompile;
using namespace gnncompile::cpu;
using scalar_t = {scalar};
using acc_t = {scalar};
using index_t = {index};
constexpr int TILE = {tile};

// Prefetches what CSR slot j reads through col / perm (as the interpreter's prefetch_slot).
// Always inlined: a prefetch has no side effect the compiler sees, so a call of this function,
// left out of line, is a call of a pure function whose result is unused, and is deleted.
__attribute__((always_inline)) inline void prefetch_slot(const GenArgs& a, int64_t j, int64_t f0, int n) {{
{prefetch}}}
"""

# the exported entry points of every CPU kernel: the ABI version, and the row loop (each row
# checked as the interpreter checks it) calling the kernel's per-row body
_ROWS = """\
}}  // namespace

extern "C" int gnncompile_codegen_abi() {{ return kCodegenAbi; }}

extern "C" int gnncompile_message_rows(const GenArgs* ap, int64_t row_begin, int64_t row_end) {{
  const GenArgs& a = *ap;
  const index_t* rowptr = static_cast<const index_t*>(a.rowptr);
  for (int64_t row = row_begin; row < row_end; ++row) {{
    if (!row_ok(rowptr, row, a.num_edges)) return static_cast<int>(Status::BadRowptr);
    const int64_t begin = static_cast<int64_t>(rowptr[row]), end = static_cast<int64_t>(rowptr[row + 1]);
{row_body}  }}
  return 0;
}}
"""


# message_reduce and message_sum_multi: the interpreter's reduce_rows / sum_rows_multi, one tile
# of one row at a time, the prefetch of its prefetch_ahead
_TILE = """
constexpr Reduce R = Reduce::{reduce};
constexpr bool kArg = R == Reduce::Max || R == Reduce::Min;
// how many times the prefetch-distance knob's edges ahead the walk prefetches (3 where an encoder
// is computed by blocks of edges: a block reads its edges' features up to kEncodeBlock - 1 slots
// ahead, and the x_j rows must be in the cache when its values are used; see emit.py)
constexpr int64_t kPrefetchScale = {prefetch_scale};

// the edge encoders' blocks (EncoderBlock), kept over the rows of a chunk (empty without one)
struct EncBlocks {{
{blocks}
}};

// One tile [f0, f0 + n) of row `row`; FULL: n == TILE, a bound known at compile time.
template <bool FULL>
inline int tile(const GenArgs& a, int64_t row, int64_t begin, int64_t end, int64_t f0, int n_rt, EncBlocks& eb,
                int64_t chunk_end) {{
  const int n = FULL ? TILE : n_rt;
  const int64_t F = a.F;
  const index_t* col = static_cast<const index_t*>(a.col);
  const index_t* perm = static_cast<const index_t*>(a.perm);
  const index_t* slot = static_cast<const index_t*>(a.slot);
  (void)col; (void)perm; (void)slot; (void)eb;
  // the last slot an encoder block may reach: the chunk's where one tile covers the row
  const int64_t jlim = F <= TILE ? chunk_end : end;
  (void)jlim;
{setup}
{acc}
{arrays}
  for (int64_t j = begin; j < end; ++j) {{
    {{  // the prefetch of the interpreter's prefetch_ahead: past the row's end too
      const int64_t ahead = j + kPrefetchScale * a.prefetch;
      if (ahead < end) {{
        prefetch_slot(a, ahead, f0, n);
      }} else if (f0 + n < F) {{
        const int64_t wrap = begin + (ahead - end);
        if (wrap < end) prefetch_slot(a, wrap, f0 + n, static_cast<int>(F - f0 - n < TILE ? F - f0 - n : TILE));
      }} else if (ahead < a.num_edges) {{
        prefetch_slot(a, ahead, 0, static_cast<int>(F < TILE ? F : TILE));
      }}
    }}
{edge}{enc}
{loops}
  }}
{store}
  return static_cast<int>(Status::Ok);
}}
""" + _ROWS.replace("{row_body}", """\
    int64_t f0 = 0;
    int st = 0;
    for (; f0 + TILE <= a.F; f0 += TILE)
      if ((st = tile<true>(a, row, begin, end, f0, TILE, eb, chunk_end)) != 0) return st;
    if (f0 < a.F)
      if ((st = tile<false>(a, row, begin, end, f0, static_cast<int>(a.F - f0), eb, chunk_end)) != 0) return st;
""").replace("""  const index_t* rowptr = static_cast<const index_t*>(a.rowptr);
  for (int64_t row""", """  const index_t* rowptr = static_cast<const index_t*>(a.rowptr);
  EncBlocks eb;
  // the chunk's last slot (rowptr[row_end], read as a bound only: every row is still checked)
  int64_t chunk_end = static_cast<int64_t>(rowptr[row_end]);
  if (chunk_end < 0 || chunk_end > a.num_edges) chunk_end = a.num_edges;
  (void)chunk_end;
  for (int64_t row""")

# message_edges: the interpreter's edge_rows (every edge's message written, in the user's edge
# order or by CSR slot; grouped sums added feature by feature in order, as there)
_EDGES = """
constexpr bool kBySlot = {by_slot};

inline int row_edges(const GenArgs& a, int64_t row, int64_t begin, int64_t end) {{
  const int64_t F = a.F;
  const index_t* col = static_cast<const index_t*>(a.col);
  const index_t* perm = static_cast<const index_t*>(a.perm);
  const index_t* slot = static_cast<const index_t*>(a.slot);
  (void)col; (void)slot;
  scalar_t* out = static_cast<scalar_t*>(a.out);
  const int64_t out_width = a.out_width;
  const int64_t div_o = F / out_width;
  (void)div_o;
{setup}
{arrays}
  for (int64_t j = begin; j < end; ++j) {{
    if (j + a.prefetch < a.num_edges) {{  // past the row's end too
      prefetch_slot(a, j + a.prefetch, 0, static_cast<int>(F < TILE ? F : TILE));
      const int64_t ea = kBySlot ? j + a.prefetch : static_cast<int64_t>(perm[j + a.prefetch]);
      if (in_range(ea, a.num_edges)) prefetch_bytes<1, 0>(out + ea * out_width, out_width * sizeof(scalar_t));
    }}
{edge}
    scalar_t* o = out + (kBySlot ? j : e) * out_width;
    for (int64_t f0 = 0; f0 < F; f0 += TILE) {{
      const int n = static_cast<int>(F - f0 < TILE ? F - f0 : TILE);{enc}
{loops}
    }}
  }}
  return static_cast<int>(Status::Ok);
}}
""" + _ROWS.replace("{row_body}", """\
    const int st = row_edges(a, row, begin, end);
    if (st != 0) return st;
""")

# message_encoder_grad: edge_rows' walk, every edge's value grouped to the encoder's W columns in
# its row of the chunk's scratch, folded into the chunk's accumulators by blocks of
# kEncoderGradBlock edges (encode_grad_edges, encoder_core.h), as the interpreter's
# encoder_grad_rows (message_core.h): the same blocks, flushed at the chunk's end too
_ENCGRAD = """
constexpr int kEnc = {enc};
constexpr bool kNeedA = {need_a};
constexpr int64_t kD = {D};

// the edges of a block, pending until kEncoderGradBlock of them (or the chunk's end) flush
struct Pending {{
  const scalar_t* a[kEncoderGradBlock];
  scalar_t* da[kEncoderGradBlock];
  int n = 0;
}};

inline int row_encgrad(const GenArgs& a, int64_t row, int64_t begin, int64_t end, Pending& pend) {{
  const int64_t F = a.F;
  const index_t* col = static_cast<const index_t*>(a.col);
  const index_t* perm = static_cast<const index_t*>(a.perm);
  const index_t* slot = static_cast<const index_t*>(a.slot);
  (void)col; (void)slot;
  const int64_t W = a.out_width;
  const int64_t div_o = F / W;
  (void)div_o;
  acc_t* dwt = static_cast<acc_t*>(a.out);
  acc_t* db = dwt + kD * W;
  acc_t* scratch = db + W;
  scalar_t* da = static_cast<scalar_t*>(a.out2);
  const scalar_t* ga = static_cast<const scalar_t*>(a.inputs[kEnc]);
  const scalar_t* gwt = static_cast<const scalar_t*>(a.inputs[kEnc + 1]);
{setup}
{arrays}
  for (int64_t j = begin; j < end; ++j) {{
    if (j + a.prefetch < a.num_edges) {{  // past the row's end too
      prefetch_slot(a, j + a.prefetch, 0, static_cast<int>(F < TILE ? F : TILE));
      const int64_t ea = static_cast<int64_t>(perm[j + a.prefetch]);
      if ({prefetch_a} && in_range(ea, a.num_edges)) prefetch_bytes<0, 0>(ga + ea * kD, kD * sizeof(scalar_t));
    }}
{edge}
    acc_t* vb = scratch + pend.n * W;
    {vb_zero}
    for (int64_t f0 = 0; f0 < F; f0 += TILE) {{
      const int n = static_cast<int>(F - f0 < TILE ? F - f0 : TILE);{enc_lines}
{loops}
    }}
    pend.a[pend.n] = ga + {ra} * kD;  // (enc_slot: the features and their gradient per CSR slot)
    pend.da[pend.n] = kNeedA ? da + {ra} * kD : nullptr;
    if (++pend.n == kEncoderGradBlock) {{
      encode_grad_edges<acc_t>(pend.a, pend.da, pend.n, kD, scratch, gwt, W, dwt, db);
      pend.n = 0;
    }}
  }}
  return static_cast<int>(Status::Ok);
}}

}}  // namespace

extern "C" int gnncompile_codegen_abi() {{ return kCodegenAbi; }}

extern "C" int gnncompile_message_rows(const GenArgs* ap, int64_t row_begin, int64_t row_end) {{
  const GenArgs& a = *ap;
  const index_t* rowptr = static_cast<const index_t*>(a.rowptr);
  Pending pend;
  for (int64_t row = row_begin; row < row_end; ++row) {{
    if (!row_ok(rowptr, row, a.num_edges)) return static_cast<int>(Status::BadRowptr);
    const int64_t begin = static_cast<int64_t>(rowptr[row]), end = static_cast<int64_t>(rowptr[row + 1]);
    const int st = row_encgrad(a, row, begin, end, pend);
    if (st != 0) return st;
  }}
  if (pend.n > 0) {{  // the chunk's last block
    acc_t* dwt = static_cast<acc_t*>(a.out);
    encode_grad_edges<acc_t>(pend.a, pend.da, pend.n, kD, dwt + kD * a.out_width + a.out_width,
                             static_cast<const scalar_t*>(a.inputs[kEnc + 1]), a.out_width, dwt,
                             dwt + kD * a.out_width);
  }}
  return 0;
}}
"""

_WHAT = {"reduce": "message_reduce", "multi": "message_sum_multi", "edges": "message_edges",
         "encgrad": "message_encoder_grad", "softmax": "message_softmax"}


def _input_pointers(k: int, kind: str) -> List[str]:
    """Input ``k``'s base pointer and width (and group divisor for a grouped input), as the
    kernels of both targets set them up before their rows."""
    lines = [f"  const scalar_t* in{k} = static_cast<const scalar_t*>(a.inputs[{k}]);",
             f"  const int64_t w{k} = a.widths[{k}];",
             f"  (void)w{k};"]
    if kind == "g":
        lines.append(f"  const int64_t div{k} = a.divs[{k}];")
    return lines


def _encoder_pointers(k: int, kind: str) -> List[str]:
    """Edge encoder ``k``'s pointers (its features ``in<k>``, Wt ``wt<k>`` of width ``ew<k>``, b
    ``bs<k>``: inputs k, k + 1, k + 2) and group divisor, as the kernels of both targets set them
    up before their rows."""
    lines = [f"  const scalar_t* in{k} = static_cast<const scalar_t*>(a.inputs[{k}]);",
             f"  const scalar_t* wt{k} = static_cast<const scalar_t*>(a.inputs[{k + 1}]);",
             f"  const scalar_t* bs{k} = static_cast<const scalar_t*>(a.inputs[{k + 2}]);",
             f"  const int64_t ew{k} = a.widths[{k + 1}];",
             f"  (void)ew{k};"]
    if kind == "g":
        lines.append(f"  const int64_t div{k} = a.divs[{k + 1}];")
    return lines


def emit(spec: Spec) -> str:
    """The C++ source of ``spec``'s kernel."""
    sides, kinds = spec.sides, spec.kinds
    encgrad = spec.op == "encgrad"
    edges = spec.op == "edges" or encgrad  # encgrad: edge_rows' walk
    reads_col = P.COL in sides
    # message_edges writes at perm[j], message_encoder_grad reads the encoder at perm[j]: read
    # and checked always
    reads_perm = P.EDGE in sides or P.ENC in sides or edges
    reads_slot = P.SLOT in sides or P.ENCS in sides  # (an enc_slot encoder's features: at sl)
    # a tile walk (reduce, multi, softmax) computes its encoders of width class f / g by blocks of
    # edges (encoder_core.h, EncoderBlock); the per-edge kernels (edges, encgrad) edge by edge
    tiled = not edges
    scalar = "double" if spec.dtype == "float64" else "float"
    setup, edge, prefetch, enc = [], [], [], []
    # edge encoders are computed (and their feature rows prefetched) only where an instruction reads them
    read = {int(spec.code[i + 2]) for i in range(0, len(spec.code), P.INSTR) if spec.code[i] == P.OPCODE["in"]}
    # the pointers of every input: rows fixed for the tile (row / const sides) set up once
    for k, (s, kind) in enumerate(zip(sides, kinds)):
        if s in P.ENCODERS:
            if k not in read:
                continue
            setup += _encoder_pointers(k, kind)
            if kind != "s":
                setup.append(f"  const acc_t* e{k} = nullptr;" if tiled else f"  alignas(64) acc_t e{k}[TILE];")
            continue
        setup += _input_pointers(k, kind)
        if s in (P.ROW, P.CONST):
            r = "row" if s == P.ROW else "0"
            setup.append(f"  const scalar_t* p{k} = in{k} + {r} * w{k};")
            if kind == "s":
                setup.append(f"  const acc_t s{k} = acc_t(p{k}[0]);")
    # per edge: its neighbour, id and CSR slot, checked as the interpreter's edge_of checks them
    if reads_col:
        edge.append("    const int64_t src = static_cast<int64_t>(col[j]);")
        edge.append("    if (!in_range(src, a.num_src)) return static_cast<int>(Status::BadCol);")
    if reads_perm:
        edge.append("    const int64_t e = static_cast<int64_t>(perm[j]);")
        edge.append("    if (!in_range(e, a.num_edges)) return static_cast<int>(Status::BadPerm);")
    if reads_slot:
        edge.append("    int64_t sl = j;")
        edge.append("    if (slot != nullptr) {")
        edge.append("      sl = static_cast<int64_t>(slot[j]);")
        edge.append("      if (!in_range(sl, a.num_edges)) return static_cast<int>(Status::BadPerm);")
        edge.append("    }")
    for k, (s, kind) in enumerate(zip(sides, kinds)):
        if s in (P.ROW, P.CONST):
            continue
        if s in P.ENCODERS:  # its features, and its values per edge: the tile's columns (encoder_core.h)
            if k not in read:
                continue
            D = spec.dim(k)
            # enc: the features of edge e (through perm); enc_slot: of CSR slot sl (stored in CSR
            # order; a block's rows: slot[j + k], or j + k on the CSR itself, slot nullptr)
            row, idx = ("e", "perm") if s == P.ENC else ("sl", "slot")
            edge.append(f"    const scalar_t* p{k} = in{k} + {row} * {D};")
            edge.append(f"    (void)p{k};")
            ind = "      " if edges else "    "
            if kind == "s":
                edge.append(f"    const acc_t s{k} = {_enc_value(k, D, '0', spec.dtype)};")
            elif kind == "f" and tiled:
                enc.append(f"{ind}e{k} = eb.e{k}.get(j, jlim, {idx}, a.num_edges, in{k}, {D}, wt{k}, ew{k}, bs{k}, f0, n);")
            elif kind == "f":
                enc.append(f"{ind}encode_run<acc_t>(p{k}, {D}, wt{k} + f0, ew{k}, bs{k} + f0, n, e{k});")
            elif tiled:
                enc += [f"{ind}const int64_t c0_{k} = f0 / div{k};",
                        f"{ind}e{k} = eb.e{k}.get(j, jlim, {idx}, a.num_edges, in{k}, {D}, wt{k}, ew{k}, bs{k}, c0_{k}, "
                        f"static_cast<int>((f0 + n - 1) / div{k} - c0_{k} + 1));"]
            else:
                enc += [f"{ind}const int64_t c0_{k} = f0 / div{k};",
                        f"{ind}encode_run<acc_t>(p{k}, {D}, wt{k} + c0_{k}, ew{k}, bs{k} + c0_{k}, "
                        f"static_cast<int>((f0 + n - 1) / div{k} - c0_{k} + 1), e{k});"]
            continue
        r = {P.COL: "src", P.EDGE: "e", P.SLOT: "sl"}[s]
        edge.append(f"    const scalar_t* p{k} = in{k} + {r} * w{k};")
        if kind == "s":
            edge.append(f"    const acc_t s{k} = acc_t(p{k}[0]);")
    # prefetch: the rows read through col and perm (the interpreter's prefetch_slot). A reduction
    # (a tile walk: reduce, multi, softmax) that computes an edge encoder and gathers rows through
    # col prefetches into L2 (locality 2: prefetcht1, which Zen 4 fills into L2), the others as the
    # interpreter (locality 0: prefetchnta, into L1). Measured side by side on Zen 4
    # (benchmarks/results/README.md, codegen_encoder_zen4_s52): relu(x_j + lin(a_e)) faster with
    # it; the encoder alone (no gathered row) and the backward's per-edge kernels not. A prefetch
    # changes no value.
    hint = 2 if (spec.op in ("reduce", "multi", "softmax") and reads_col
                 and any(s in P.ENCODERS and k in read for k, s in enumerate(sides))) else 0
    if reads_col:
        prefetch.append("  const int64_t src = static_cast<int64_t>(static_cast<const index_t*>(a.col)[j]);")
        prefetch.append("  if (!in_range(src, a.num_src)) return;")
    if P.EDGE in sides or P.ENC in sides:
        prefetch.append("  const int64_t e = static_cast<int64_t>(static_cast<const index_t*>(a.perm)[j]);")
        prefetch.append("  if (!in_range(e, a.num_edges)) return;")
    for k, (s, kind) in enumerate(zip(sides, kinds)):
        if s == P.ENCS:  # features in CSR order: read in order (not prefetched, as a slot input)
            continue
        if s == P.ENC:  # the edge's features, all D of them (every tile reads them all)
            if k not in read:
                continue
            prefetch.append(f"  {{ const char* p = reinterpret_cast<const char*>(static_cast<const scalar_t*>("
                            f"a.inputs[{k}]) + e * {spec.dim(k)});")
            prefetch.append(f"    for (int b = 0; b < static_cast<int>({spec.dim(k)} * sizeof(scalar_t)); b += 64) "
                            f"__builtin_prefetch(p + b, 0, {hint}); }}")
            continue
        if s not in (P.COL, P.EDGE):
            continue
        r = "src" if s == P.COL else "e"
        # the tile's bytes of the row (a prefetch only warms the cache: results do not depend on it)
        first, size = {"f": ("f0", "n"), "s": ("0", "1")}.get(kind, (f"f0 / a.divs[{k}]", f"(n / a.divs[{k}] + 1)"))
        prefetch.append(f"  {{ const char* p = reinterpret_cast<const char*>(static_cast<const scalar_t*>("
                        f"a.inputs[{k}]) + {r} * a.widths[{k}] + {first});")
        prefetch.append(f"    const int bytes = static_cast<int>({size} * sizeof(scalar_t));")
        prefetch.append(f"    for (int b = 0; b < bytes; b += 64) __builtin_prefetch(p + b, 0, {hint}); }}")
    if not prefetch:
        prefetch.append("  (void)a; (void)j; (void)f0; (void)n;")
    instrs, res, reg = _statements(spec.code, spec.consts, kinds, spec.dtype, spec.dims)
    head = _HEAD.format(what=_WHAT[spec.op], key=spec.key(), scalar=scalar,
                        index="int64_t" if spec.index == "int64" else "int32_t", tile=TILE[spec.dtype],
                        prefetch="\n".join(prefetch) + "\n")
    if any(s in P.ENCODERS for s in sides) or encgrad:
        head = head.replace('#include "cpu/codegen_abi.h"\n',
                            '#include "cpu/codegen_abi.h"\n#include "cpu/encoder_core.h"\n')
    if encgrad:
        store = (f"        vb[f] = {res};" if spec.out == "f" else f"        vb[f / div_o] += {res};")
        arrays, loops = _loops(instrs, [store], [res], "        const int64_t f = f0 + t;\n        (void)f;",
                               indent="      ")
        return head + _ENCGRAD.format(enc=spec.enc, need_a="true" if spec.need_features else "false",
                                      ra="e" if sides[spec.enc] == P.ENC else "sl",
                                      prefetch_a="true" if sides[spec.enc] == P.ENC else "false",
                                      D=spec.dim(spec.enc), setup="\n".join(setup), arrays="\n".join(arrays),
                                      edge="\n".join(edge),
                                      vb_zero="" if spec.out == "f" else "for (int64_t c = 0; c < W; ++c) vb[c] = acc_t(0);",
                                      enc_lines="".join("\n" + ln for ln in enc), loops="\n".join(loops))
    if edges:
        store = (f"        o[f] = {res};" if spec.out == "f" else
                 f"        {{ scalar_t& d = o[f / div_o]; d = from_acc<scalar_t>(to_float(d) + {res}); }}")
        arrays, loops = _loops(instrs, [store], [res], "        const int64_t f = f0 + t;\n        (void)f;",
                               indent="      ")
        return head + _EDGES.format(by_slot="true" if spec.by_slot else "false", setup="\n".join(setup),
                                    arrays="\n".join(arrays), edge="\n".join(edge),
                                    enc="".join("\n" + ln for ln in enc),
                                    loops="\n".join(loops))
    loop_head = "      const int64_t f = f0 + t;\n      (void)f;"
    if spec.op == "multi":
        acc = [f"  alignas(64) acc_t acc{k}[TILE];" for k in range(len(spec.results))]
        acc += [f"  for (int t = 0; t < n; ++t) acc{k}[t] = acc_t(0);" for k in range(len(spec.results))]
        fold = [f"      acc{k}[t] += {reg[r]};" for k, r in enumerate(spec.results)]
        tail_reads = [reg[r] for r in spec.results]
        store = [f"  {{ scalar_t* o = static_cast<scalar_t*>(a.out) + ({k} * a.M + row) * F + f0;\n"
                 f"    for (int t = 0; t < n; ++t) o[t] = from_acc<scalar_t>(acc{k}[t]); }}"
                 for k in range(len(spec.results))]
        reduce = "Sum"
    elif spec.op == "softmax":  # the interpreter's softmax_rows (message_core.h), step for step
        T = len(sides) - 1  # the temperature: the last input, a constant
        tread = {"s": f"s{T}", "f": f"acc_t(p{T}[f])"}.get(kinds[T], f"acc_t(p{T}[f / div{T}])")
        acc = ["  alignas(64) acc_t mx[TILE];", "  alignas(64) acc_t sm[TILE];", "  alignas(64) acc_t ws[TILE];",
               "  alignas(64) acc_t tt[TILE];", "  for (int t = 0; t < n; ++t) {", "    const int64_t f = f0 + t;",
               "    (void)f;", f"    tt[t] = {tread};", "    mx[t] = -std::numeric_limits<acc_t>::infinity();",
               "    sm[t] = acc_t(0);", "    ws[t] = acc_t(0);", "  }"]
        fold = [f"      const acc_t v_ = {res};", "      const acc_t z_ = tt[t] * v_;",
                "      const acc_t m_ = z_ > mx[t] ? z_ : mx[t];", "      const acc_t c_ = vm::exp(mx[t] - m_);",
                "      const acc_t p_ = vm::exp(z_ - m_);", "      sm[t] = sm[t] * c_ + p_;",
                "      ws[t] = ws[t] * c_ + p_ * v_;", "      mx[t] = m_;"]
        tail_reads = [res]
        store = ["  scalar_t* o = static_cast<scalar_t*>(a.out) + row * F + f0;",
                 "  scalar_t* l = static_cast<scalar_t*>(a.out2) + row * F + f0;",
                 "  if (end > begin) {",
                 "    for (int t = 0; t < n; ++t) {",
                 "      o[t] = from_acc<scalar_t>(ws[t] / sm[t]);",
                 "      l[t] = from_acc<scalar_t>(mx[t] + vm::log(sm[t]));",
                 "    }",
                 "  } else {",
                 "    for (int t = 0; t < n; ++t) {",
                 "      o[t] = scalar_t(0);",
                 "      l[t] = scalar_t(0);",
                 "    }",
                 "  }"]
        reduce = "Sum"
    else:
        acc = ["  alignas(64) acc_t acc[TILE];", "  int32_t win[kArg ? TILE : 1];", "  acc_t eq[kArg ? TILE : 1];",
               "  for (int t = 0; t < n; ++t) acc[t] = reduce_init<R, acc_t>();",
               "  if (kArg)", "    for (int t = 0; t < n; ++t) { win[t] = -1; eq[t] = acc_t(0); }"]
        if spec.reduce in (2, 3):
            fold = [f"      fold_extreme(R == Reduce::Min, {res}, static_cast<int32_t>(j - begin), acc[t], win[t], eq[t]);"]
        else:
            fold = [f"      acc[t] += {res};"]
        tail_reads = [res]
        store = ["  store_reduced<scalar_t, R>(acc, win, eq, begin, end - begin, n, static_cast<scalar_t*>(a.out) + "
                 "row * F + f0,", "                             kArg ? a.arg + row * F + f0 : nullptr);"]
        reduce = _REDUCE_NAMES[spec.reduce]
    arrays, loops = _loops(instrs, fold, tail_reads, loop_head)
    blocks = [f"  EncoderBlock<acc_t, index_t, TILE> e{k};" for k, (s, kind) in enumerate(zip(sides, kinds))
              if s in P.ENCODERS and k in read and kind != "s"]
    return head + _TILE.format(reduce=reduce, prefetch_scale=3 if blocks else 1,
                               blocks="\n".join(blocks) or "  char unused;", setup="\n".join(setup), acc="\n".join(acc), arrays="\n".join(arrays),
                               edge="\n".join(edge), enc="".join("\n" + ln for ln in enc), loops="\n".join(loops),
                               store="\n".join(store))


__all__ = ["Spec", "make_spec", "emit", "width_kind", "check_program", "TILE", "REDUCES", "ABI", "KINDS",
           "MAX_RESULTS"]
