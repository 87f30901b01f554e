"""The neighbor workload's SAGE step with its last layer transformed first, by hand (issue 28).

    python -m benchmarks neighbor_order --rounds 12 --out neighbor_order_zen4_s59

The tuner's ``neighbor`` workload (GraphSAGE 16 -> 64 -> 2 on a generated power-law graph,
:class:`gnncompile.data.NeighborLoader` batches of ``--batch-size`` seeds) trained in one
process, three arms interleaved (``--steps`` steps each per round, the order reversed every
other round):

* ``base``: the model as PyG writes it, compiled with the tuner's defaults
  (:func:`gnncompile.tuner.workloads.default_settings`): the last SAGEConv aggregates its 64-wide
  input, then maps it to 2 columns (``lin_l(mean_j h_j) + lin_r(h)``);
* ``transform_first``: the same parameters, the last layer written as
  ``mean_j (h W_l^T)_j + b_l + h W_r^T``: the aggregation (and its backward) runs over 2 columns
  instead of 64, compiled the same way;
* ``eager``: the PyG model uncompiled.

The two forms are equal in exact arithmetic, not in float32 (the products are added in another
order): gnncompile does not rewrite one into the other (its opt-in ``reassociate`` only moves a
linear map of a graph input *before* a sum, :mod:`gnncompile.passes.order`). This measures what
such an opt-in rule, for a layer that narrows, would give on this workload. Each arm's median
seeds/s and its ratio to ``base`` with the 95% interval of the paired rounds
(:func:`gnncompile.tuner.noise.ratio_interval`); the largest difference of the two forms' outputs
on one batch.

Writes benchmarks/results/neighbor_order.{json,md} (``--out`` for another stem).
"""
from __future__ import annotations

import argparse
import statistics
import time
from typing import Any, Dict, Optional, Sequence

from . import _common

ARMS = ("base", "transform_first", "eager")


def _transform_first(sage):
    """``sage`` (PyG's GraphSAGE, two layers) with its last layer as mean(h W_l^T) + b_l + h W_r^T
    (the same parameter tensors)."""
    import torch
    import torch.nn.functional as F
    from torch_geometric.nn import MessagePassing

    class _Last(MessagePassing):
        def __init__(self, conv):
            super().__init__(aggr="mean")
            self.conv = conv

        def forward(self, h, edge_index):
            c = self.conv
            return (self.propagate(edge_index, x=F.linear(h, c.lin_l.weight)) + c.lin_l.bias
                    + F.linear(h, c.lin_r.weight))

        def message(self, x_j):
            return x_j

    class _Model(torch.nn.Module):
        def __init__(self, m):
            super().__init__()
            self.first, self.last = m.convs[0], _Last(m.convs[1])

        def forward(self, x, edge_index):
            return self.last(self.first(x, edge_index).relu(), edge_index)

    if len(sage.convs) != 2:
        raise ValueError("neighbor_order: the hand-written form has two layers (--fanout with two hops)")
    return _Model(sage)


def run(args) -> Dict[str, Any]:
    import torch
    import torch.nn.functional as F

    from gnncompile.tuner import noise, workloads as W

    w = W.Workload(kind="neighbor", model="sage", hidden=args.hidden, layers=len(args.fanout),
                   num_features=args.num_features, num_nodes=args.num_nodes, num_edges=args.num_edges,
                   fanout=list(args.fanout), seed=0)
    dev = torch.device("cpu")
    s = W.default_settings(w, batch_size=args.batch_size)
    built, loaders = {}, []
    for kind in ARMS:
        torch.manual_seed(w.seed)
        m = W.build_model(w)
        model = _transform_first(m) if kind == "transform_first" else m
        fwd = model if kind == "eager" else W._compile_with(model, s, dev)
        opt = torch.optim.Adam(m.parameters(), lr=1e-3)
        loader = W._neighbor_loader(w, s, dev)
        loaders.append(loader)
        built[kind] = (W._inputs(w, loader, dev), fwd, opt, m)

    def step(kind, inp):
        _, fwd, opt, _ = built[kind]
        x, ei, _, y, k = inp
        opt.zero_grad(set_to_none=True)
        F.cross_entropy(fwd(x, ei)[:k], y).backward()
        opt.step()

    try:
        # the two forms on one batch, the same parameters (before any step changed them)
        _, inp = next(built["base"][0])
        with torch.no_grad():
            a = built["base"][1](inp[0], inp[1])
            b = built["transform_first"][1](inp[0], inp[1])
        diff = float((a - b).abs().max())
        scale = float(a.abs().max())
        for kind in ARMS:
            for _ in range(max(args.warmup, 2)):
                step(kind, next(built[kind][0])[1])
        runs = {k: [] for k in ARMS}
        for r in range(args.rounds):
            for kind in (ARMS if r % 2 == 0 else ARMS[::-1]):
                it = built[kind][0]
                units, t0 = 0, time.perf_counter()
                for _ in range(args.steps):
                    n, inp = next(it)
                    step(kind, inp)
                    units += n
                runs[kind].append(units / (time.perf_counter() - t0))
    finally:
        for kind, loader in zip(ARMS, loaders):
            W._close(built[kind][0], loader)
    arms = {k: {"median": statistics.median(v), "runs": v,
                "ratio": None if k == "base" else noise.ratio_interval(v, runs["base"])} for k, v in runs.items()}
    return {"workload": w.signature_dict(), "batch_size": args.batch_size, "threads": torch.get_num_threads(),
            "rounds": args.rounds, "steps": args.steps, "arms": arms,
            "max_abs_diff": diff, "max_abs_output": scale}


def markdown(r: Dict[str, Any]) -> str:
    w = r["workload"]
    lines = [
        "# The neighbor SAGE step with its last layer transformed first (by hand)",
        "",
        f"Machine: {r['cpu']}, torch {r['machine']['torch']}, {r['threads']} threads. "
        f"{_common.load_text(r['loadavg_before_after'])}.",
        "",
        f"Command: `{r['command']}`",
        "",
        f"Workload: SAGE {w['num_features']} -> {w['hidden']} -> {w['num_classes']}, {w['num_nodes']} nodes / "
        f"{w['num_edges']} edges, fanout {w['fanout']}, batch {r['batch_size']} seeds. {r['rounds']} rounds of "
        f"{r['steps']} steps per arm in one process, the order reversed every other round. `base` and "
        "`transform_first` compiled with the tuner's defaults; `eager`: PyG's model uncompiled.",
        "",
        "| arm | seeds/s (median) | ratio to base | 95% interval |",
        "|---|---|---|---|",
    ]
    for k, a in r["arms"].items():
        q = a["ratio"]
        lines.append(f"| {k} | {a['median']:.4g} | " + ("1 | |" if q is None else
                     f"{q['ratio']:.3f}x | [{q['low']:.3f}, {q['high']:.3f}] |"))
    lines += ["", f"Largest |base - transform_first| over one batch's outputs (same parameters): "
              f"{r['max_abs_diff']:.3g} (largest |output| {r['max_abs_output']:.3g}): equal up to rounding, not bit for bit."]
    return "\n".join(lines) + "\n"


def main(argv: Optional[Sequence[str]] = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m benchmarks neighbor_order", description=__doc__.split("\n\n")[0])
    _common.add_neighbor_workload(ap)
    ap.add_argument("--rounds", type=int, default=12)
    ap.add_argument("--steps", type=int, default=80, help="steps per arm and round")
    ap.add_argument("--warmup", type=int, default=5)
    ap.add_argument("--out", default="neighbor_order", help="stem of the result files")
    ap.add_argument("--folder", default=str(_common.RESULTS))
    args = ap.parse_args(argv)
    if args.rounds < 1 or args.steps < 1 or args.batch_size < 1 or len(args.fanout) != 2:
        ap.error("--rounds, --steps and --batch-size must be >= 1, --fanout two hops")
    before = _common.loadavg()
    r = run(args)
    _common.record_and_write(args.folder, "neighbor_order", args.out, argv, r, markdown, before)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
