"""Differential fuzzing of the compiler against eager PyG.

:func:`random_layer` writes a random user ``MessagePassing`` layer: a ``message(x_i, x_j, e, w)``
of a few statements over the gathered features, per-edge features ``e`` [E, F], a per-edge weight
``w`` [E, 1], learnable parameters and numbers, drawn from

* the operations message programs model (``+ - * /``, ``pow`` by numbers and tensors, relu,
  leaky_relu, elu, gelu, sigmoid, tanh, softplus, exp, log, sqrt, abs, neg, clamp), with every
  argument they take, default or not (``alpha=``, ``rounding_mode=``, ``approximate='tanh'``);
* operations they do not model (floor, round, ``//``, ``%``, ``where``, ``maximum``, sin, integer
  round trips), which must be kept as written;
* in-place writes (``add_``, ``mul_``, ``relu_``, ``F.relu(inplace=True)``, ``+=``, ``t[:, 0] = c``,
  ``clamp_``), on temporaries and on the gathered rows, whose result is read or not;

aggregated by sum, mean, max or min. :func:`random_case` draws a model of several such layers
and inputs (duplicate edges, so ties; with some probability NaN, infinities and signed zeros in
the features), and :func:`check` compares ``gnncompile.compile`` with eager: outputs and the
gradients of the features, edge features, edge weights and every parameter, in float64, NaN
where eager has NaN. A mismatch is narrowed down to the layers that cause it.

Eager's own results are the reference, with two exceptions the generator avoids: inputs whose
special values eager treats by position (torch's vectorized kernels and their scalar tail loops
disagree at NaN for elu's gradient, so element counts are multiples of the vector width), and
in-place writes to what the caller owns (``e``, ``w``, the parameters).
"""
from __future__ import annotations

import dataclasses
import random
import textwrap
import warnings
from typing import Dict, List, Optional, Sequence, Tuple

import torch
import torch.nn.functional as Fn

F = 8  # features per node and per edge


# ----------------------------------------------------------------------------- generator
@dataclasses.dataclass
class Value:
    name: str
    kind: str  # 'ef' [E, F] | 'e1' [E, 1] | 'p' [F] | 'num'


def _shape(*kinds: str) -> str:
    ks = set(kinds) - {"num"}
    if "ef" in ks or ("e1" in ks and "p" in ks):
        return "ef"
    if "e1" in ks:
        return "e1"
    return "p" if "p" in ks else "num"


_NUMS = ("0.5", "2.0", "-1.5", "3", "0.0", "1e-3", "-0.0")
_POW = ("2", "3", "0.5", "-1", "1.5", "0", "-0.5", "4", "-2")


class _Writer:
    def __init__(self, rng: random.Random):
        self.rng = rng
        self.lines: List[str] = []
        self.values: List[Value] = [Value("x_i", "ef"), Value("x_j", "ef"), Value("e", "ef"), Value("w", "e1"),
                                    Value("p0", "p"), Value("p1", "p"), Value("p2", "p")]
        self.n = 0
        self.ops: List[str] = []

    def pick(self, kinds=("ef", "e1", "p")) -> Value:
        pool = [v for v in self.values if v.kind in kinds]
        # prefer recent temporaries, so statements chain
        weights = [3.0 if v.name.startswith("t") else 1.0 for v in pool]
        return self.rng.choices(pool, weights)[0]

    def num(self) -> str:
        return self.rng.choice(_NUMS)

    def emit(self, expr: str, kind: str, op: str) -> Value:
        name = f"t{self.n}"
        self.n += 1
        self.lines.append(f"{name} = {expr}")
        v = Value(name, kind)
        self.values.append(v)
        self.ops.append(op)
        return v

    def mutable(self) -> Optional[Value]:
        """A value the message may write in place: a temporary or a gathered row, [E, F]."""
        pool = [v for v in self.values if v.kind == "ef" and (v.name.startswith("t") or v.name in ("x_i", "x_j"))]
        return self.rng.choice(pool) if pool else None

    # one statement
    def step(self) -> None:
        r = self.rng
        kind = r.choices(["binary", "unary", "param", "unmodelled", "inplace", "view"],
                         [6, 6, 4, 0.8, 1.2, 1])[0]
        if kind == "binary":
            a, b = self.pick(), self.pick(("ef", "e1", "p", "num"))
            bn = b.name if b.kind != "num" else self.num()
            bk = b.kind if b.kind != "num" else "num"
            op = r.choice(["+", "-", "*", "/"])
            form = r.random()
            if form < 0.7:
                expr = f"{a.name} {op} {bn}" if r.random() < 0.8 else f"{bn} {op} {a.name}"
            elif op in "+-":
                fn = "torch.add" if op == "+" else "torch.sub"
                expr = f"{fn}({a.name}, {bn}, alpha={r.choice(['1', '2.0', '-0.5'])})"
            elif op == "/":
                expr = f"torch.div({a.name}, {bn}, rounding_mode={r.choice(['None', repr('floor'), repr('trunc')])})"
            else:
                expr = f"torch.mul({a.name}, {bn})"
            self.emit(expr, _shape(a.kind, bk), op)
        elif kind == "unary":
            a = self.pick()
            fn = r.choice(["torch.relu({})", "Fn.relu({})", "torch.sigmoid({})", "torch.tanh({})", "torch.exp({})",
                           "torch.log({})", "torch.sqrt({})", "{}.abs()", "-{}", "Fn.gelu({})", "torch.exp(-{})",
                           "torch.log({}.abs() + 1e-3)", "torch.sqrt({}.abs())"])
            self.emit(fn.format(a.name), a.kind, fn.split("(")[0])
        elif kind == "param":
            a = self.pick()
            choices = [
                f"Fn.leaky_relu({a.name}, {r.choice(['0.01', '0.2', '-0.3'])})",
                f"Fn.elu({a.name}, alpha={r.choice(['1.0', '0.5', '2.0'])})",
                f"Fn.softplus({a.name}, beta={r.choice(['1.0', '2.0', '0.5'])}, threshold={r.choice(['20.0', '1.0'])})",
                f"Fn.gelu({a.name}, approximate={r.choice([repr('none'), repr('tanh')])})",
                f"{a.name}.clamp(min={r.choice(['-1.0', '0.0', 'None'])}, max={r.choice(['1.0', '2.5', 'None'])})"
                .replace("clamp(min=None, max=None)", "clamp(min=-3.0)"),
                f"{a.name}.clamp_min({self.num()})", f"{a.name}.clamp_max({self.num()})",
                f"{a.name} ** {r.choice(_POW)}", f"torch.pow({a.name}, {r.choice(_POW)})",
                f"torch.pow({a.name}.abs() + 0.5, {self.pick(('ef', 'e1', 'p')).name})",
                f"torch.pow({r.choice(['2.0', '0.0', '0.5'])}, {a.name})",
            ]
            expr = r.choice(choices)
            self.emit(expr, _shape(a.kind, *([self.values[-1].kind] if "abs() + 0.5" in expr else [])),
                      expr.split("(")[0])
        elif kind == "unmodelled":
            a, b = self.pick(), self.pick()
            expr = r.choice([f"torch.floor({a.name})", f"torch.round({a.name})", f"torch.trunc({a.name})",
                             f"{a.name} // 0.7", f"{a.name} % 1.3", f"torch.remainder({a.name}, 2.0)",
                             f"torch.where({a.name} > {b.name}, {a.name}, {b.name})",
                             f"torch.maximum({a.name}, {b.name})", f"torch.sin({a.name})",
                             f"{a.name}.int().to({a.name}.dtype)", f"torch.sign({a.name})"])
            kinds = (a.kind, b.kind) if b.name in expr else (a.kind,)
            self.emit(expr, _shape(*kinds), "unmodelled")
        elif kind == "inplace":
            t = self.mutable()
            if t is None:
                return self.step()
            b = self.pick(("ef", "e1", "p", "num"))
            bn = b.name if b.kind != "num" else self.num()
            form = r.choice(["add_", "mul_", "relu_", "F.relu", "+=", "setitem", "clamp_", "sub_", "F.leaky_relu"])
            if form == "add_":
                self.lines.append(f"{t.name}.add_({bn})")
            elif form == "sub_":
                self.lines.append(f"{t.name}.sub_({bn}, alpha=2)")
            elif form == "mul_":
                self.lines.append(f"{t.name}.mul_({self.num()})")
            elif form == "relu_":
                self.lines.append(f"{t.name}.relu_()")
            elif form == "clamp_":
                self.lines.append(f"{t.name}.clamp_(-1.0, 1.0)")
            elif form == "+=":
                self.lines.append(f"{t.name} += {bn}")
            elif form == "setitem":
                self.lines.append(f"{t.name}[:, {r.randrange(F)}] = {self.num()}")
            elif form == "F.relu":
                if r.random() < 0.5:  # the result is read
                    self.emit(f"Fn.relu({t.name}, inplace=True)", "ef", "relu(inplace)")
                    return
                self.lines.append(f"Fn.relu({t.name}, inplace=True)")
            else:
                self.emit(f"Fn.leaky_relu({t.name}, 0.1, inplace=True)", "ef", "leaky_relu(inplace)")
                return
            self.ops.append("inplace")
        else:  # views that keep each edge's values in order
            a = self.pick(("ef",))
            expr = r.choice([f"{a.name}.view(-1, {F}).contiguous()", f"{a.name}.reshape({a.name}.shape[0], {F})",
                             f"{a.name}.unsqueeze(1).squeeze(1)", f"{a.name}.clone()", f"{a.name}.view(-1, 2, {F // 2})"
                             f".flatten(1)"])
            self.emit(expr, "ef", "view")

    def result(self) -> str:
        last = next((v for v in reversed(self.values) if v.kind in ("ef", "e1")), None)
        if last is None or last.name in ("e", "w"):
            last = self.emit("x_j * w", "ef", "*")
        if not self.lines or self.lines[-1].startswith(f"{last.name} ") is False and last.kind == "e1":
            pass
        return last.name


def random_message(rng: random.Random, steps: Tuple[int, int] = (2, 7)) -> Tuple[str, List[str]]:
    """(source of a ``message(self, x_i, x_j, e, w)`` method, the operations it uses)."""
    w = _Writer(rng)
    for _ in range(rng.randint(*steps)):
        w.step()
    out = w.result()
    body = "\n".join(w.lines + [f"return {out}"])
    src = ("def message(self, x_i, x_j, e, w):\n"
           "    p0, p1, p2 = self.p[0], self.p[1], self.p[2]\n" + textwrap.indent(body, "    ") + "\n")
    return src, w.ops


def make_layer(src: str, aggr: str) -> torch.nn.Module:
    """A MessagePassing layer whose message is ``src`` (a node Linear before propagate, so
    the gathered rows need gradients)."""
    from torch_geometric.nn import MessagePassing

    ns: Dict[str, object] = {"torch": torch, "Fn": Fn}
    exec(compile(src, "<fuzzed message>", "exec"), ns)

    def __init__(self, aggr=aggr):
        MessagePassing.__init__(self, aggr=aggr)
        self.lin = torch.nn.Linear(F, F, dtype=torch.float64)
        self.p = torch.nn.ParameterList([torch.nn.Parameter(torch.randn(F, dtype=torch.float64)) for _ in range(3)])

    def forward(self, x, edge_index, e, w):
        return self.propagate(edge_index, x=self.lin(x), e=e, w=w)

    cls = type("FuzzedLayer", (MessagePassing,), {"__init__": __init__, "forward": forward,
                                                  "message": ns["message"], "__module__": __name__})
    cls._fuzz_source = src
    return cls()


class Stack(torch.nn.Module):
    """Several fuzzed layers on the same inputs, their outputs side by side."""

    def __init__(self, layers: Sequence[torch.nn.Module]):
        super().__init__()
        self.layers = torch.nn.ModuleList(layers)

    def forward(self, x, edge_index, e, w):
        return torch.cat([layer(x, edge_index, e, w).reshape(x.shape[0], -1) for layer in self.layers], 1)


AGGRS = ("sum", "mean", "max", "min")


@dataclasses.dataclass
class Case:
    layers: List[Tuple[str, str]]  # (message source, aggr)
    seed: int
    special: bool  # NaN / inf / signed zeros in the inputs


def random_case(seed: int, layers: int = 10) -> Case:
    rng = random.Random(seed)
    return Case([(random_message(rng)[0], rng.choice(AGGRS)) for _ in range(layers)], seed, rng.random() < 0.35)


def inputs(case: Case):
    """(x, edge_index, e, w): float64, duplicate edges, E * F a multiple of the vector width."""
    g = torch.Generator().manual_seed(case.seed)
    n = 24 + case.seed % 17
    E = 64 * (1 + case.seed % 3)
    ei = torch.randint(0, n, (2, E), generator=g)
    ei[1, ei[1] == n - 1] = 0  # the last node has no in-edge
    x = torch.randn(n, F, generator=g, dtype=torch.float64) * 2
    e = torch.randn(E, F, generator=g, dtype=torch.float64)
    w = torch.rand(E, 1, generator=g, dtype=torch.float64) + 0.25
    if case.special:
        vals = torch.tensor([float("nan"), float("inf"), -float("inf"), 0.0, -0.0], dtype=torch.float64)
        for t in (x, e):
            pos = torch.randint(0, t.numel(), (3,), generator=g)
            t.view(-1)[pos] = vals[torch.randint(0, 5, (3,), generator=g)]
    return x, ei, e, w


def build(case: Case) -> torch.nn.Module:
    torch.manual_seed(case.seed)
    return Stack([make_layer(src, aggr) for src, aggr in case.layers])


@dataclasses.dataclass
class Result:
    ok: bool
    skipped: bool = False  # eager itself fails on this case (its forward raises)
    backward: bool = True  # gradients compared (eager's backward runs)
    detail: str = ""
    forward_only: int = 0  # layers whose gradients could not be compared (eager's backward refuses)


def _run(model, args, grad_out, backward: bool):
    leaves = [args[0], args[2], args[3]] + list(model.parameters())
    out = model(*args)
    if not backward:
        return [out]
    gs = torch.autograd.grad(out, leaves, grad_out, allow_unused=True)
    return [out] + [g if g is not None else torch.zeros_like(l) for g, l in zip(gs, leaves)]


def _close(a: torch.Tensor, b: torch.Tensor, rtol=1e-7, atol=1e-9) -> Optional[str]:
    if a.shape != b.shape:
        return f"shape {tuple(a.shape)} != {tuple(b.shape)}"
    try:
        torch.testing.assert_close(a, b, rtol=rtol, atol=atol, equal_nan=True)
    except AssertionError as e:
        return " ".join(str(e).split())[:300]
    return None


def check_model(model, args, inner: str = "aot_eager") -> Result:
    """compiled == eager for one model on ``args`` (x, edge_index, e, w)."""
    import gnncompile

    x, ei, e, w = args
    leaves = [x.clone().requires_grad_(), ei, e.clone().requires_grad_(), w.clone().requires_grad_()]
    g = torch.Generator().manual_seed(7)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        try:
            probe = model(*leaves)
        except Exception as err:  # eager rejects it (an out= under autograd, a bad shape): not a case
            return Result(True, skipped=True, detail=f"eager: {type(err).__name__}: {err}")
        grad_out = torch.randn(probe.shape, generator=g, dtype=probe.dtype)
        backward = True
        try:
            want = _run(model, [t.clone().requires_grad_() if t.is_floating_point() else t for t in leaves],
                        grad_out, True)
        except RuntimeError:  # an in-place write eager's own backward refuses: compare the forward
            backward = False
        with torch.set_grad_enabled(backward):
            if not backward:
                want = _run(model, [t.detach() for t in leaves], grad_out, False)
            torch._dynamo.reset()
            try:
                compiled = gnncompile.compile(model, inner=inner)
                got = _run(compiled, [t.detach().clone().requires_grad_(backward) if t.is_floating_point() else t
                                      for t in leaves], grad_out, backward)
            except Exception as err:
                return Result(False, backward=backward, detail=f"compiled raised {type(err).__name__}: "
                              f"{' '.join(str(err).split())[:300]}")
    names = ["output", "grad x", "grad e", "grad w"] + [f"grad {n}" for n, _ in model.named_parameters()]
    for name, a, b in zip(names, got, want):
        why = _close(a.detach(), b.detach())
        if why is not None:
            return Result(False, backward=backward, detail=f"{name}: {why}")
    return Result(True, backward=backward)


def check(case: Case, inner: str = "aot_eager") -> Tuple[Result, List[int]]:
    """The case's model compiled vs eager; on a mismatch, the layers that mismatch alone. Where
    eager's own backward refuses the stack (an in-place write it saved), each layer is checked
    on its own, so that the others' gradients are still compared."""
    args = inputs(case)
    res = check_model(build(case), args, inner)
    bad: List[int] = []
    if not res.ok or not res.backward:
        forward_only = 0
        for i, (src, aggr) in enumerate(case.layers):
            torch.manual_seed(case.seed + i)
            one = check_model(Stack([make_layer(src, aggr)]), args, inner)
            forward_only += not one.backward
            if not one.ok:
                bad.append(i)
                res = Result(False, backward=one.backward, detail=f"layer {i}: {one.detail}")
        res.forward_only = forward_only
    else:
        res.forward_only = 0
    return res, bad


__all__ = ["F", "random_message", "make_layer", "Stack", "Case", "random_case", "inputs", "build", "check",
           "check_model", "Result", "AGGRS"]
