"""Opt-in lower precision: fused spmm calls that gather bfloat16 features
(``Settings.choices['precision'] == 'bf16'``, ``$GNNCOMPILE_PRECISION``).

With the default ('fp32') this pass changes nothing: every graph is as the rewrite left it.
With 'bf16', each ``gnncompile::spmm`` left in the graph after the portfolio
(:mod:`.portfolio`) whose reduce is sum or mean (weighted or not) and whose features are float32
on the CPU becomes::

    xb = x.to(torch.bfloat16)            # once, before the op (the weight too, when there is one)
    y = gnncompile::spmm_bf16(..., wb, x, xb, ...)   # gathers 2-byte rows of xb, float32 out

``gnncompile::spmm_bf16``'s CPU kernel (native/cpu/spmm.cpp) reads the bfloat16 rows, accumulates
in float32 and writes float32: the output is not rounded again, and no cast follows the op
(benchmarks/bf16.py measured that cast, ``.to(float32)`` of a bfloat16 output, at 20-45% of the
bf16 op's forward on this project's CPU). Each output element carries the rounding of its inputs
to bfloat16 (8 significant bits, rounded to nearest: a relative error up to 2^-8; the edge
weight's too): at most 2^-8 (2 x 2^-8 weighted) of the sum of the |terms| it adds. The op is
differentiated with respect to float32 ``x``: x's gradient is the transposed ``spmm_bf16`` of the
output gradient (cast to bfloat16, gathered, float32 out), so it comes out float32 with no cast;
an edge weight's is ``edge_dot`` of float32 x and the gradient. Without the native module the op
runs spmm over ``xb`` and casts its output (one rounding more).

Left in float32, each with its reason in the chain's report line (:attr:`.report.Fused.precision`,
printed by :func:`gnncompile.explain`): float64 (or already 16-bit) features, a device other than
the CPU, max / min (their records and ties are compared in the input precision), calls that the
portfolio gave the vendor implementation, and every other fused op kind (edge softmax, attention,
message programs). A call whose input's dtype or device is not known at rewrite time is left as
it is too.
"""
from __future__ import annotations

import operator
from typing import Dict, List

import torch
from torch.fx import Node

from ..ops import targets
from ..settings import Settings
from .portfolio import _meta
from .report import Fused

#: the report line of a call that gathers bfloat16
GATHERS = "gathers bf16 (opt-in choices['precision']='bf16': fp32 accumulation, float32 output)"
COVERED_REDUCES = ("sum", "mean")


def _fp32(why: str) -> str:
    return f"stays fp32: {why}"


def _why_not(n: Node) -> str:
    """'' when spmm call ``n`` can gather bfloat16, else why not."""
    reduce = n.args[5]
    if reduce not in COVERED_REDUCES:
        return _fp32(f"reduce '{reduce}' is not covered (bf16 covers sum and mean)")
    xv = _meta(n.args[4])
    w = n.args[3]
    if xv is None or (w is not None and _meta(w) is None):
        return _fp32("its input's dtype is not known at rewrite time")
    _, dtype, device = xv
    if dtype != torch.float32:
        return _fp32(f"its input is {str(dtype).replace('torch.', '')} (bf16 gathers float32 features only)")
    if getattr(device, "type", device) != "cpu":
        return _fp32(f"on {getattr(device, 'type', device)} (bf16 gathering is CPU-only)")
    if w is not None and _meta(w)[1] != torch.float32:
        return _fp32(f"its edge weight is {str(_meta(w)[1]).replace('torch.', '')}")
    if not all(u.op == "call_function" and u.target is operator.getitem and u.args[1] == 0 for u in n.users):
        return _fp32("the call's second output is read")
    if len(n.args) > 10 and n.args[10]:
        return _fp32("its input is marked as a relu's output (relu_input)")
    return ""


def _cast(graph, value: Node, dtype: torch.dtype) -> Node:
    return graph.call_method("to", (value, dtype))


def gather_bf16(graph, lines: Dict[Node, Fused], settings: Settings, fused: List[Fused]) -> int:
    """Applies ``settings.precision`` to the spmm calls of ``graph`` (``lines``: the report line
    of each fused call, ``fused``: every line of the report); returns how many now gather
    bfloat16. With 'fp32' nothing is touched."""
    if settings.precision != "bf16":
        return 0
    done = 0
    for n in [n for n in graph.nodes if n.op == "call_function"
              and n.target in (targets.SPMM, targets.SPMM_SPARSE)]:
        line = lines.get(n)
        if n.target is targets.SPMM_SPARSE:
            why = _fp32("it runs torch_sparse (the portfolio's choice; choices['spmm_impl']='native' "
                        "lets it gather bf16)")
        else:
            why = _why_not(n)
        if why:
            if line is not None:
                line.precision = why
            continue
        x, w = n.args[4], n.args[3]
        t = tuple(n.args[7:10])
        with graph.inserting_before(n):
            xb = _cast(graph, x, torch.bfloat16)
            wb = _cast(graph, w, torch.bfloat16) if w is not None else None
            new = graph.call_function(targets.SPMM_BF16, (n.args[0], n.args[1], n.args[2], wb, x, xb,
                                                          n.args[5], n.args[6], *t))
        for u in list(n.users):  # getitem(n, 0): the float32 output, now the new call's
            if "val" in u.meta:
                new.meta["val"] = u.meta["val"]
            u.replace_all_uses_with(new)
            graph.erase_node(u)
        graph.erase_node(n)
        if line is not None:
            lines[new] = line
        if line is not None:
            line.precision = GATHERS
        done += 1
    covered = {id(line) for line in lines.values()}
    for line in fused:  # the op kinds the pass does not cover
        if line.kind not in ("spmm", "degree") and not line.precision:
            line.precision = _fp32(f"{line.kind} is not covered (bf16 covers the fused spmm's sum and mean)")
        elif line.kind == "spmm" and not line.precision and id(line) not in covered:
            line.precision = _fp32("its call was not found in the rewritten graph")
    return done


__all__ = ["gather_bf16", "GATHERS", "COVERED_REDUCES"]
