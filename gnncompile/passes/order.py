"""Aggregate first (opt-in, ``reassociate=True``): ``A (x W) -> (A x) W`` for a fused sum whose
features are a linear map of a graph input that needs no gradient.

A sum over the edges is linear in the features, so ``spmm_sum(linear(x, W)) = linear(spmm_sum(x), W)``
(with an edge weight too): GCNConv's first layer, ``Â (X W)`` as PyG writes it, becomes
``(Â X) W``. Where ``x`` needs no gradient (the node features of a training step), the backward
of the model's order runs an spmm over the output-wide gradient (``Â^T G``) only to reach ``W``'s
gradient; aggregated first, ``W``'s gradient is ``(Â x)^T G`` and no spmm runs in the backward.
The forward spmm reads ``x``'s width instead of the output's, so the rule fires only where
``in_features <= out_features`` (it is then never wider).

Not exact: the products are added in another order, so results differ in rounding (relative
differences about 1e-7 in float32). The compiler never changes what a model computes unless the
user opts in, so this runs only with ``Settings.reassociate`` (``gnncompile.compile(model,
reassociate=True)``); without it the graph is left as it is and ``explain()`` notes where the
rule would have fired.

Conditions, all read at trace time from the fake tensors Dynamo recorded (Dynamo guards every
tensor input on ``requires_grad``, so a call whose ``x`` requires grad compiles a graph of its
own, where the rule does not fire):

* the spmm is a native ``gnncompile::spmm`` with reduce 'sum' (weighted or not), whose features
  are (a ``contiguous`` of) ``linear(x, W)`` without a bias, or ``x @ W`` / ``mm(x, W)``, read by
  nothing else; a bias inside the sum would be aggregated too (``Â 1 b``), so ``linear`` with a
  bias is left as written (GCNConv adds its bias after the aggregation, outside the rule);
* ``x`` is a graph input (a placeholder) that is neither a parameter nor requires grad, 2-D;
* nothing in the graph writes ``x`` or ``W`` in place;
* ``in_features <= out_features``.

It runs after the fusions, before the portfolio (:mod:`.portfolio`) and bf16 gathering
(:mod:`.precision`), so that their decisions see the width the spmm now reads.
"""
from __future__ import annotations

import operator
from typing import Any, Dict, List, Optional, Tuple

import torch
from torch.fx import Node

from ..ops import targets
from .canonical import argument, fake_tensor, layer_of, opname
from .report import Fused
from .semantics import Writes


def _linear_map(h: Node) -> Optional[Tuple[Node, Node, str]]:
    """(x, W, form) for ``linear(x, W)`` without bias ('linear') or ``x @ W`` / ``mm(x, W)`` ('mm')."""
    name = opname(h)
    if name == "linear":
        if len(h.args) > 3 or set(h.kwargs) - {"input", "weight", "bias"}:
            return None
        x, w, b = argument(h, 0, "input"), argument(h, 1, "weight"), argument(h, 2, "bias")
        if b is not None:
            return None
        form = "linear"
    elif (name in ("mm", "matmul") or h.op == "call_function" and h.target is operator.matmul) \
            and len(h.args) == 2 and not h.kwargs:
        x, w = h.args
        form = "mm"
    else:
        return None
    if not isinstance(x, Node) or not isinstance(w, Node):
        return None
    wv = fake_tensor(w)
    if wv is None or wv.dim() != 2:
        return None
    return x, w, form


def _widths(x: Node, h: Node) -> Optional[Tuple[int, int]]:
    xv, hv = fake_tensor(x), fake_tensor(h)
    if xv is None or hv is None or xv.dim() != 2 or hv.dim() != 2:
        return None
    fin, fout = xv.shape[-1], hv.shape[-1]
    if not isinstance(fin, int) or not isinstance(fout, int):
        return None
    return fin, fout


def _needs_no_grad(x: Node) -> Optional[str]:
    """Why ``x`` may need a gradient (None: it is a graph input that needs none)."""
    xv = fake_tensor(x)
    if x.op != "placeholder" or xv is None:
        return f"'{x.name}' is not a graph input"
    if isinstance(xv, torch.nn.Parameter) or getattr(xv, "_is_param", False):
        return f"'{x.name}' is a parameter"
    if xv.requires_grad:
        return f"'{x.name}' requires grad"
    return None


def _input_name(x: Node) -> str:
    """'x' for Dynamo's placeholder 'L_x_' (the name the user's code gave the input)."""
    t = str(x.target)
    return t[2:-1] if t.startswith("L_") and t.endswith("_") and len(t) > 3 else x.name


def _candidate(n: Node) -> Optional[Tuple[Node, Node, Node, Node, str]]:
    """(features node read by the spmm, linear node, x, W, form) where ``n`` is a native sum
    spmm over a linear map read by nothing else; None otherwise."""
    if n.op != "call_function" or n.target is not targets.SPMM or len(n.args) > 10:
        return None
    if n.args[5] != "sum" or n.kwargs:
        return None
    if not all(u.op == "call_function" and u.target is operator.getitem and u.args[1] == 0 for u in n.users):
        return None
    feat = n.args[4]
    h = feat
    if isinstance(feat, Node) and feat.op == "call_method" and feat.target == "contiguous" and len(feat.args) == 1:
        if len(feat.users) != 1:
            return None
        h = feat.args[0]
    if not isinstance(h, Node) or len(h.users) != 1:
        return None
    lm = _linear_map(h)
    if lm is None:
        return None
    x, w, form = lm
    return feat, h, x, w, form


def aggregate_first(graph, lines: Dict[Node, Fused], reassociate: bool, notes: List[str]) -> int:
    """Rewrites every fused ``spmm_sum(linear(x, W))`` that the module docstring admits as
    ``linear(spmm_sum(x), W)`` when ``reassociate`` (else only notes where it would);
    ``lines``: the report line of each fused call (moved to the new call, with a note);
    returns how many were rewritten."""
    writes = None
    done = 0
    for n in [n for n in graph.nodes if n.op == "call_function" and n.target is targets.SPMM]:
        c = _candidate(n)
        if c is None:
            continue
        feat, h, x, w, form = c
        widths = _widths(x, h)
        if widths is None:
            continue
        fin, fout = widths
        line = lines.get(n)
        layer = line.layer if line is not None and line.layer else layer_of(h)
        name = _input_name(x)
        if _needs_no_grad(x) is not None:
            continue  # the model's order is the cheaper one where x needs a gradient
        if fin > fout:
            if reassociate:
                notes.append(f"{layer}: Â (x W) kept in the model's order: aggregating '{name}' first would make the "
                             f"spmm wider ({fin} > {fout} features)")
            continue
        if writes is None:
            writes = Writes.of(graph)
        if writes.clean([x, w]) is not None:
            continue
        if not reassociate:
            notes.append(f"{layer}: Â (x W) kept in the model's order (exact); gnncompile.compile(..., "
                         f"reassociate=True) aggregates '{name}' first, (Â x) W: it needs no gradient, so "
                         f"the backward runs no spmm (rounding differs)")
            continue
        with graph.inserting_before(n):
            xc = graph.call_method("contiguous", (x,))
            call = graph.call_function(targets.SPMM, (*n.args[:4], xc, *n.args[5:]))
            agg = graph.call_function(operator.getitem, (call, 0))
        old = list(n.users)
        with graph.inserting_after(agg):
            if form == "linear":
                out = graph.call_function(torch.nn.functional.linear, (agg, w))
            else:
                out = graph.call_function(torch.mm, (agg, w))
        for k in ("nn_module_stack", "stack_trace", "source_fn_stack"):
            if k in h.meta:
                out.meta[k] = h.meta[k]
        if "example_value" in h.meta:
            out.meta["example_value"] = h.meta["example_value"]  # same shape, dtype and device
        for u in old:
            u.replace_all_uses_with(out)
            graph.erase_node(u)
        graph.erase_node(n)
        if feat is not h and not feat.users:
            graph.erase_node(feat)
        if not h.users:
            graph.erase_node(h)
        line = lines.pop(n, None)
        note = (f"aggregated before its linear map, (Â x) W (reassociate=True): '{name}' needs no "
                f"gradient, so the backward runs no spmm; {fin} <= {fout} features")
        if line is not None:
            line.note = f"{line.note}; {note}" if line.note else note
            lines[call] = line
        notes.append(f"{layer}: {note}")
        done += 1
    return done


__all__ = ["aggregate_first"]
