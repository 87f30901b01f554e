"""Message programs: a per-edge elementwise expression, encoded for one interpreter kernel.

A message program computes one value per edge and feature ``f`` of a message of width ``F``
(the message's features flattened) from its *inputs*, each a 2-D tensor ``[rows, W]`` read at
column ``f // (F // W)``:

=========  ======  ===================================================================
side       code    the row read for the edge ``e = perm[j]`` in CSR slot ``j`` of row ``r``
=========  ======  ===================================================================
``col``    0       ``col[j]`` (the neighbour: PyG's ``x_j``)
``row``    1       ``r`` (the node being aggregated into: PyG's ``x_i``)
``edge``   2       ``e`` (a per-edge tensor in the user's edge order)
``const``  3       row 0 (a tensor that does not depend on the edge: a parameter)
``slot``   4       ``j`` (a per-edge tensor stored in CSR order: no random access; on a
                   transposed structure, the CSR slot of the traversed slot, ``slot[j]``)
``enc``    5       ``e``, through an edge encoder computed inside the kernel (below)
``enc_slot`` 6     ``j`` (``slot[j]`` on a transposed structure), through an edge encoder
                   whose features are stored in CSR order (as ``slot`` is to ``edge``)
=========  ======  ===================================================================

An ``enc`` input ``k`` is an *edge encoder*: a linear map of narrow edge features computed per
edge inside the kernels, so that its ``E x W`` output never exists in memory. Input ``k`` is the
edge features ``a`` (``[E, D]``, the user's edge order, read like an ``edge`` input; ``D`` need not
divide ``F``); inputs ``k + 1`` and ``k + 2`` are ``const`` inputs holding the map's transposed
weight ``Wt`` (``[D, W]``) and bias ``b`` (``[1, W]``), which no instruction reads. An
``enc_slot`` input is the same encoder with its features in CSR slot order (``a[perm]``, a copy
made once per structure and tensor: ``gnncompile.ops.slots``), read in order instead of at random
through ``perm``; the values are the same bit for bit. The value read
for edge ``e`` at feature ``f`` (column ``c = f // (F / W)``) is

    v = b[c];  for d in 0 .. D-1:  v = v + a[e, d] * Wt[d, c]

in the compute type, in that order, each product rounded before the sum (no fused multiply-add):
the interpreter and the generated kernels compute it bit for bit alike.

``W`` is ``F`` (one value per feature), ``1`` (one per edge) or any divisor of ``F`` (one per
head: ``[E, H, 1]`` against ``[E, H, C]`` messages).

Expressions are hash-consed tuples ``(op, children, params)``; equal sub-expressions are the
same tuple, so the encoding computes each once. The encoding is a flat ``int`` list of
5-int instructions ``(opcode, dst, a, b, c)`` over register tiles (slots) plus a ``float``
list of constants; the result is the last instruction's ``dst``. The kernels
(native/cpu/message_core.h) and the torch evaluator here (:func:`evaluate`) run the same code.

Numerics of the transcendental operators (exp, log, tanh, sigmoid, softplus, elu, gelu and the
derivative helpers built on them): in float32 the kernels (the interpreter and the generated
ones, bit for bit alike) compute them with native/cpu/vmath.h, vectorizable float32 functions a
few ulp from the correctly rounded value (benchmarks/results/vmath.md) with torch's special
values; in float64 with libm. :func:`evaluate` runs torch's own functions, so the two agree to a
few ulp, not bit for bit (tests compare them with tolerances). ``pow`` is libm's in both dtypes.

Backward programs are derived from the same code (:func:`derivative`): the gradient with
respect to input ``k`` is the program ``G * dm/d(input k)`` with the upstream gradient ``G``
as one more input; nothing of the forward pass is stored.
"""
from __future__ import annotations

import functools
import math
from typing import Dict, List, Sequence, Tuple

import torch

COL, ROW, EDGE, CONST, SLOT, ENC, ENCS = 0, 1, 2, 3, 4, 5, 6
SIDES = {"col": COL, "row": ROW, "edge": EDGE, "const": CONST, "slot": SLOT, "enc": ENC, "enc_slot": ENCS}
#: the sides of an edge encoder: its features read per edge (ENC, at perm[j]) or stored per CSR
#: slot (ENCS, at the traversal's CSR slot, as SLOT is to EDGE: a copy in CSR order, read in order)
ENCODERS = (ENC, ENCS)

# opcode -> (name, number of slot operands, number of float params)
OPS: Dict[int, Tuple[str, int, int]] = {
    0: ("in", 0, 0), 1: ("const", 0, 1),
    2: ("add", 2, 0), 3: ("sub", 2, 0), 4: ("mul", 2, 0), 5: ("div", 2, 0), 6: ("neg", 1, 0),
    7: ("relu", 1, 0), 8: ("leaky_relu", 1, 1), 9: ("elu", 1, 1), 10: ("gelu", 1, 0),
    11: ("sigmoid", 1, 0), 12: ("tanh", 1, 0), 13: ("softplus", 1, 2), 14: ("exp", 1, 0),
    15: ("log", 1, 0), 16: ("clamp", 1, 2), 17: ("pow", 2, 0), 18: ("sqrt", 1, 0),
    # derivative helpers (never matched from a graph)
    19: ("step", 1, 0), 20: ("leaky_relu_grad", 1, 1), 21: ("elu_grad", 1, 1), 22: ("gelu_grad", 1, 0),
    23: ("softplus_grad", 1, 2), 24: ("clamp_grad", 1, 2), 25: ("pow_exp_grad", 2, 0),
    26: ("abs", 1, 0), 27: ("sign", 1, 0),
    # x ** c for a number c, with torch's special cases (sqrt for 0.5, x * x for 2, ...)
    28: ("powc", 1, 1),
    # derivative helpers: gate(x, y) = x where y != 0, else 0 (torch's where(cond, grad, 0),
    # which gives 0 also for an infinite or NaN grad); eq(x, y) = 1 where x == y, else 0 (which
    # messages reach a max / min: torch's scatter_reduce gradient)
    29: ("gate", 2, 0), 30: ("eq", 2, 0),
}
OPCODE = {name: code for code, (name, _, _) in OPS.items()}
# a valid parameter tuple for each opcode that takes parameters (the others take none): what
# example programs of every opcode use (the codegen tests, the CUDA compile check)
EXAMPLE_PARAMS: Dict[str, Tuple[float, ...]] = {
    "leaky_relu": (0.2,), "elu": (1.3,), "softplus": (2.0, 3.0), "clamp": (-0.5, 0.75),
    "leaky_relu_grad": (0.2,), "elu_grad": (0.7,), "softplus_grad": (2.0, 3.0), "clamp_grad": (-0.5, 0.75),
    "powc": (2.5,)}
MAX_SLOTS = 32
INSTR = 5

Expr = tuple  # (op, children, params)


# ----------------------------------------------------------------------------- construction
def inp(k: int) -> Expr:
    return ("in", (), (k,))


def const(v: float) -> Expr:
    return ("const", (), (float(v),))


def _is_const(e: Expr, v=None) -> bool:
    return e[0] == "const" and (v is None or e[2][0] == v)


def node(op: str, *children: Expr, params: Sequence[float] = ()) -> Expr:
    """``op`` applied to ``children``, folding the identities that derivatives produce."""
    params = tuple(float(p) for p in params)
    if op == "add":
        a, b = children
        if _is_const(a, 0.0):
            return b
        if _is_const(b, 0.0):
            return a
    elif op == "sub":
        a, b = children
        if _is_const(b, 0.0):
            return a
        if _is_const(a, 0.0):
            return node("neg", b)
    elif op == "mul":  # no folding of a product by 0: inf * 0 and NaN * 0 are NaN
        a, b = children
        if _is_const(a, 1.0):
            return b
        if _is_const(b, 1.0):
            return a
    elif op == "div":
        a, b = children
        if _is_const(b, 1.0):
            return a
    elif op == "neg":
        (a,) = children
        if a[0] == "neg":
            return a[1][0]
        if _is_const(a):
            return const(-a[2][0])
    if children and all(_is_const(c) for c in children) and op in _FOLD:
        return const(_FOLD[op](*(c[2][0] for c in children)))
    return (op, tuple(children), params)


_FOLD = {"add": lambda a, b: a + b, "sub": lambda a, b: a - b, "mul": lambda a, b: a * b}


# ----------------------------------------------------------------------------- encoding
def _topo(root: Expr) -> List[Expr]:
    order, seen = [], set()
    stack = [(root, False)]
    while stack:
        x, done = stack.pop()
        if done:
            order.append(x)
            continue
        if x in seen:
            continue
        seen.add(x)
        stack.append((x, True))
        for c in reversed(x[1]):
            if c not in seen:
                stack.append((c, False))
    return order


def encode(root: Expr) -> Tuple[List[int], List[float]]:
    """(code, consts) of ``root``; slots are reused once their last reader has run."""
    code, consts, _ = encode_many([root])
    return code, consts


def encode_many(roots: Sequence[Expr]) -> Tuple[List[int], List[float], List[int]]:
    """(code, consts, result slots) of several expressions in one instruction stream: shared
    sub-expressions computed once, every root's slot kept to the end."""
    order: List[Expr] = []
    seen = set()
    for r in roots:
        for x in _topo(r):
            if x not in seen:
                seen.add(x)
                order.append(x)
    last_use = {}
    for i, x in enumerate(order):
        for c in x[1]:
            last_use[c] = i
    for r in roots:
        last_use[r] = len(order)
    free: List[int] = []
    slot: Dict[Expr, int] = {}
    n_slots = 0
    code: List[int] = []
    consts: List[float] = []
    cidx: Dict[float, int] = {}

    def c_index(v: float) -> int:
        key = ("nan",) if math.isnan(v) else v
        if key not in cidx:
            cidx[key] = len(consts)
            consts.append(v)
        return cidx[key]

    for i, x in enumerate(order):
        op, children, params = x
        operands = [slot[c] for c in children]
        for c in dict.fromkeys(children):  # operands whose last reader this is free their slot (in
            # operand order: a set's order follows string hashes, which differ between processes)
            if last_use[c] == i:
                free.append(slot[c])
        if free:
            dst = free.pop()
        else:
            dst = n_slots
            n_slots += 1
        if n_slots > MAX_SLOTS:
            raise ValueError(f"message program needs more than {MAX_SLOTS} registers")
        slot[x] = dst
        if op == "in":
            ins = [OPCODE["in"], dst, int(params[0]), 0, 0]
        elif op == "const":
            ins = [OPCODE["const"], dst, c_index(params[0]), 0, 0]
        else:
            ar = OPS[OPCODE[op]][1]
            a = operands[0]
            b = operands[1] if ar == 2 else (c_index(params[0]) if params else 0)
            c = c_index(params[1]) if (ar == 1 and len(params) > 1) else 0
            ins = [OPCODE[op], dst, a, b, c]
        code += ins
    return code, consts, [slot[r] for r in roots]


def decode(code: Sequence[int], consts: Sequence[float]) -> Expr:
    """The expression of an encoded program (the inverse of :func:`encode`)."""
    if len(code) == 0 or len(code) % INSTR:
        raise ValueError("message program: code length is not a positive multiple of 5")
    regs: Dict[int, Expr] = {}
    out = None
    for i in range(0, len(code), INSTR):
        opc, dst, a, b, c = (int(v) for v in code[i:i + INSTR])
        if opc not in OPS or not 0 <= dst < MAX_SLOTS:
            raise ValueError(f"message program: bad instruction {list(code[i:i + INSTR])}")
        name, ar, npar = OPS[opc]
        if name == "in":
            out = inp(a)
        elif name == "const":
            out = const(consts[a])
        else:
            kids = [regs[a]] + ([regs[b]] if ar == 2 else [])
            params = []
            if ar == 1 and npar >= 1:
                params.append(consts[b])
            if ar == 1 and npar == 2:
                params.append(consts[c])
            out = (name, tuple(kids), tuple(float(p) for p in params))
        regs[dst] = out
    return out


# ----------------------------------------------------------------------------- derivatives
def _terms(x: Expr, g: Expr) -> List[Expr]:
    """The adjoint of every child of ``x`` given ``g``, the adjoint of ``x``, written as torch's
    backward formulas write them (operand order, and ``where`` rather than a product with a 0/1
    mask where torch selects, so that an infinite or NaN gradient gives 0 where torch gives 0)."""
    op, ch, p = x
    one = const(1.0)
    if op == "add":
        return [g, g]
    if op == "sub":
        return [g, node("neg", g)]
    if op == "mul":
        return [node("mul", g, ch[1]), node("mul", g, ch[0])]
    if op == "div":  # grad / b, -grad * a / (b * b)
        a, b = ch
        return [node("div", g, b), node("div", node("mul", node("neg", g), a), node("mul", b, b))]
    if op == "neg":
        return [node("neg", g)]
    if op == "relu":  # threshold_backward: 0 where a <= 0 (so NaN lets the gradient through)
        return [node("gate", g, node("step", ch[0]))]
    if op == "leaky_relu":
        return [node("mul", g, node("leaky_relu_grad", ch[0], params=p))]
    if op == "elu":
        return [node("mul", g, node("elu_grad", ch[0], params=p))]
    if op == "gelu":
        return [node("mul", g, node("gelu_grad", ch[0]))]
    if op == "sigmoid":  # grad * (1 - y) * y
        return [node("mul", node("mul", g, node("sub", one, x)), x)]
    if op == "tanh":  # grad * (1 - y * y)
        return [node("mul", g, node("sub", one, node("mul", x, x)))]
    if op == "softplus":
        return [node("mul", g, node("softplus_grad", ch[0], params=p))]
    if op == "exp":
        return [node("mul", g, x)]
    if op == "log":  # grad / a
        return [node("div", g, ch[0])]
    if op == "clamp":  # where(lo <= a <= hi, grad, 0)
        return [node("gate", g, node("clamp_grad", ch[0], params=p))]
    if op == "sqrt":  # grad / (2 * y)
        return [node("div", g, node("mul", const(2.0), x))]
    if op == "abs":
        return [node("mul", g, node("sign", ch[0]))]
    if op == "powc":  # c == 0: zeros; else grad * (c * a ** (c - 1))
        c = p[0]
        if c == 0.0:
            return [const(0.0)]
        return [node("mul", g, node("mul", const(c), node("powc", ch[0], params=(c - 1.0,))))]
    if op == "pow":  # where(b == 0, 0, grad * (b * a ** (b - 1))), grad * where(a == 0 & b >= 0, 0, y * log a)
        a, b = ch
        da = node("gate", node("mul", g, node("mul", b, node("pow", a, node("sub", b, one)))), b)
        return [da, node("mul", g, node("pow_exp_grad", a, b))]
    raise ValueError(f"message program: no derivative for '{op}'")


def backward_expr(root: Expr, grad: Expr) -> Dict[int, Expr]:
    """Reverse mode over the expression DAG: ``{input k: grad * d root / d input k}``."""
    order = _topo(root)
    adj: Dict[Expr, Expr] = {root: grad}
    out: Dict[int, Expr] = {}
    for x in reversed(order):
        g = adj.get(x)
        if g is None:
            continue
        if x[0] == "in":
            k = x[2][0]
            out[k] = node("add", out[k], g) if k in out else g
            continue
        if x[0] == "const":
            continue
        for c, term in zip(x[1], _terms(x, g)):
            adj[c] = node("add", adj[c], term) if c in adj else term
    return out


def upstream(root: Expr, n_inputs: int, extreme: "bool | str" = False) -> Expr:
    """The upstream gradient of a program's derivatives: input ``n_inputs`` (``G``); for a max /
    min reduction's formula (``extreme`` True), ``eq(m, y) * q`` with ``y`` the reduced value and
    ``q`` the gradient share (inputs ``n_inputs`` and ``n_inputs + 1``; see ops/extremes.py); for
    a softmax aggregation (``extreme`` 'softmax': gnncompile::message_softmax, out = sum of
    alpha * m with alpha = softmax(t * m)), ``d out / d m`` per edge times the row's gradient,
    :func:`softmax_upstream`."""
    if extreme == "softmax":
        return softmax_upstream(root, n_inputs)
    if not extreme:
        return inp(n_inputs)
    return node("mul", node("eq", root, inp(n_inputs)), inp(n_inputs + 1))


def _softmax_alpha(root: Expr, n_inputs: int) -> Expr:
    t, lse = inp(n_inputs + 3), inp(n_inputs + 2)
    return node("exp", node("sub", node("mul", t, root), lse))


def softmax_upstream(root: Expr, n_inputs: int) -> Expr:
    """The gradient reaching message ``m`` (``root``) of a softmax aggregation: with the row's
    upstream gradient ``q``, its result ``y`` and log-sum-exp ``lse`` (inputs ``n_inputs`` to
    ``n_inputs + 2``, read per destination) and the temperature ``t`` (input ``n_inputs + 3``, a
    constant), ``alpha = exp(t * m - lse)`` and ``q * alpha * (1 + t * (m - y))``
    (``d/dm_e sum_k alpha_k m_k = alpha_e + t alpha_e (m_e - y)``)."""
    q, y, t = inp(n_inputs), inp(n_inputs + 1), inp(n_inputs + 3)
    scale = node("add", const(1.0), node("mul", t, node("sub", root, y)))
    return node("mul", node("mul", q, _softmax_alpha(root, n_inputs)), scale)


def softmax_temperature_grad(code: Sequence[int], consts: Sequence[float], n_inputs: int
                             ) -> Tuple[List[int], List[float]]:
    """The program whose sum over every edge (and, for one temperature shared by the features,
    every feature) is the temperature's gradient of a softmax aggregation of program (code,
    consts): ``q * alpha * m * (m - y)`` (inputs as :func:`softmax_upstream`)."""
    root = decode(tuple(code), tuple(consts))
    q, y = inp(n_inputs), inp(n_inputs + 1)
    e = node("mul", node("mul", q, _softmax_alpha(root, n_inputs)), node("mul", root, node("sub", root, y)))
    c, cs = encode(e)
    return list(c), list(cs)


@functools.lru_cache(maxsize=512)
def derivative(code: Tuple[int, ...], consts: Tuple[float, ...], k: int, n_inputs: int, extreme: "bool | str" = False
               ) -> Tuple[Tuple[int, ...], Tuple[float, ...]]:
    """The program ``G * d m / d input k`` of program (code, consts), with ``G`` the upstream
    gradient (:func:`upstream`); a program of the constant 0 when m ignores input k."""
    root = decode(code, consts)
    grads = backward_expr(root, upstream(root, n_inputs, extreme))
    c, cs = encode(grads.get(k, const(0.0)))
    return tuple(c), tuple(cs)


# ----------------------------------------------------------------------------- evaluation
def _gelu_grad(a):
    cdf = 0.5 * (1.0 + torch.erf(a * (1.0 / math.sqrt(2.0))))
    pdf = torch.exp(-0.5 * a * a) * (1.0 / math.sqrt(2.0 * math.pi))
    return cdf + a * pdf


def _softplus_grad(a, beta, thr):
    z = torch.exp(a * beta)
    return torch.where(a * beta > thr, torch.ones_like(a), z / (z + 1.0))


def _pow_exp_grad(a, b):
    r = torch.pow(a, b) * torch.log(a)
    return torch.where((a == 0) & (b >= 0), torch.zeros_like(r), r)


_TORCH = {
    "add": torch.add, "sub": torch.sub, "mul": torch.mul, "div": torch.div, "neg": torch.neg,
    "relu": torch.relu, "gelu": torch.nn.functional.gelu, "sigmoid": torch.sigmoid, "tanh": torch.tanh,
    "exp": torch.exp, "log": torch.log, "sqrt": torch.sqrt, "abs": torch.abs, "sign": torch.sign,
    "pow": torch.pow, "step": lambda a: (~(a <= 0)).to(a.dtype), "gelu_grad": _gelu_grad,
    "pow_exp_grad": _pow_exp_grad, "powc": lambda a, c: torch.pow(a, c),
    "gate": lambda a, b: torch.where(b != 0, a, torch.zeros_like(a)),
    "eq": lambda a, b: (a == b).to(a.dtype),
    "leaky_relu": lambda a, s: torch.nn.functional.leaky_relu(a, s),
    "elu": lambda a, al: torch.nn.functional.elu(a, al),
    "softplus": lambda a, b, t: torch.nn.functional.softplus(a, b, t),
    "clamp": lambda a, lo, hi: torch.clamp(a, None if lo == -math.inf else lo, None if hi == math.inf else hi),
    "leaky_relu_grad": lambda a, s: torch.where(a > 0, torch.ones_like(a), torch.full_like(a, s)),
    # NaN gives NaN, as torch's vectorized elu backward (its scalar tail loop passes the gradient)
    "elu_grad": lambda a, al: torch.where(a > 0, torch.ones_like(a), al * torch.exp(a)),
    "softplus_grad": _softplus_grad,
    "clamp_grad": lambda a, lo, hi: ((a >= lo) & (a <= hi)).to(a.dtype),
}


def encode_edges(a: torch.Tensor, wt: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """An ``enc`` input's values for the rows of ``a`` (``[R, D]``): ``b + a @ Wt`` summed in the
    kernels' order (``[R, W]``). The reference of the kernels' edge encoder."""
    v = b.expand(a.shape[0], wt.shape[1])
    for d in range(a.shape[1]):
        v = v + a[:, d:d + 1] * wt[d:d + 1]
    return v


def evaluate(code: Sequence[int], consts: Sequence[float], values: Sequence[torch.Tensor], F: int
             ) -> torch.Tensor:
    """Runs a program with torch ops on ``values`` (input k: ``[R, W_k]`` or ``[1, W_k]``, read
    at column ``f // (F // W_k)``); returns ``[R, F]``. The reference of the kernels."""
    return evaluate_slots(code, consts, values, F, last=True)


def evaluate_slots(code, consts, values, F: int, last: bool = False):
    """:func:`evaluate`, returning every slot's final value (or, with ``last``, the result)."""
    regs: Dict[int, torch.Tensor] = {}
    like = next((v for v in values if v is not None), None)
    out = None
    for i in range(0, len(code), INSTR):
        opc, dst, a, b, c = (int(v) for v in code[i:i + INSTR])
        name, ar, npar = OPS[opc]
        if name == "in":
            v = values[a]
            W = v.shape[1]
            out = v if W == F else v.repeat_interleave(F // W, dim=1)
        elif name == "const":
            out = torch.full((1, F), consts[a], dtype=like.dtype, device=like.device)
        else:
            args = [regs[a]] + ([regs[b]] if ar == 2 else [])
            params = []
            if ar == 1 and npar >= 1:
                params.append(consts[b])
            if ar == 1 and npar == 2:
                params.append(consts[c])
            out = _TORCH[name](*args, *params)
        regs[dst] = out
    return out if last else regs


__all__ = ["COL", "ROW", "EDGE", "CONST", "SLOT", "ENC", "ENCS", "ENCODERS", "SIDES", "OPS", "OPCODE", "MAX_SLOTS", "inp", "const", "node",
           "encode", "encode_many", "decode", "derivative", "upstream", "backward_expr", "evaluate"]
