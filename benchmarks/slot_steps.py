"""GINE training steps with the edge features read in CSR slot order from the copy cached with the structure, against reading them through perm, interleaved in one process (issue 25).

    python -m benchmarks slot_steps                 # 100k nodes / 1M edges, F = 128, D = 16, 2 threads
    python -m benchmarks slot_steps --nodes 10000   # 100k edges

The GINE workload of benchmarks/messages.py (2 x GINEConv(MLP, edge_dim=D), ReLU, Linear) on its
power-law graph; one step = forward, cross-entropy, backward, Adam. Variants, each its own deep
copy of one model (the same parameters) and optimizer, compiled with the speed guard off:

  slots   gnncompile.compile (default settings): the edge features go through
          gnncompile::cached_slot_rows (gnncompile/ops/slots.py), the kernels read them in order
          (side enc_slot), forward and backward; the copy made at the first step, reused after
  perm    settings slot_order=False: the features read through perm per edge, as before
  eager   PyG as written (with --eager; one step per round)

The first step's outputs and losses of slots and perm are compared bit for bit, then --rounds
rounds, each running every variant once in turn (order rotated); medians, the median of the
rounds' paired ratios and a 95% interval of the median by bootstrap. Writes
benchmarks/results/slot_steps.{json,md} (--out NAME).
"""
from __future__ import annotations

import argparse
import copy
import random
import statistics
import time

import torch

import gnncompile
from gnncompile.ops import slots as S

from . import _common
from . import messages as MS


def _interval(xs, reps=2000, seed=0):
    rng = random.Random(seed)
    meds = sorted(statistics.median(rng.choices(xs, k=len(xs))) for _ in range(reps))
    return meds[int(0.025 * reps)], meds[int(0.975 * reps) - 1]


def run(N: int, F: int, D: int, rounds: int, warmup: int, eager: bool) -> dict:
    torch.manual_seed(0)
    x, ei, ea, y, C = MS.node_graph(N, F, D)
    base = MS.build_model("GINE", F, C, D, ei, N)
    variants = {"slots": {"choices": {"guard": "off"}},
                "perm": {"choices": {"guard": "off"}, "slot_order": False}}
    steps, firsts = {}, {}
    for name, settings in variants.items():
        model = copy.deepcopy(base)
        run = gnncompile.compile(model, settings=settings)
        opt = torch.optim.Adam(model.parameters(), lr=1e-3)

        def step(run=run, opt=opt):
            opt.zero_grad(set_to_none=True)
            out = run(x, ei, edge_attr=ea)
            loss = torch.nn.functional.cross_entropy(out, y)
            loss.backward()
            opt.step()
            return out.detach(), loss.detach()

        before = S.info()["copies"]
        t0 = time.perf_counter()
        firsts[name] = step() + (time.perf_counter() - t0, S.info()["copies"] - before)
        steps[name] = step
    same = (torch.equal(firsts["slots"][0], firsts["perm"][0]) and torch.equal(firsts["slots"][1], firsts["perm"][1]))
    if not same:
        raise RuntimeError("slot_steps: slots and perm differ in their first step")
    if firsts["slots"][3] < 1 or firsts["perm"][3] != 0:
        raise RuntimeError(f"slot_steps: copies made {firsts['slots'][3]} / {firsts['perm'][3]} (expected >= 1 / 0)")
    if eager:
        model = copy.deepcopy(base)
        opt = torch.optim.Adam(model.parameters(), lr=1e-3)

        def eager_step(model=model, opt=opt):
            opt.zero_grad(set_to_none=True)
            loss = torch.nn.functional.cross_entropy(model(x, ei, edge_attr=ea), y)
            loss.backward()
            opt.step()

        steps["eager"] = eager_step
    for _ in range(warmup):
        for f in steps.values():
            f()
    times = {k: [] for k in steps}
    names = list(steps)
    hits0 = S.info()["hits"]
    for r in range(rounds):
        order = names[r % len(names):] + names[:r % len(names)]
        for k in order:
            t0 = time.perf_counter()
            steps[k]()
            times[k].append(time.perf_counter() - t0)
    ratios = [p / s for p, s in zip(times["perm"], times["slots"])]
    out = {"N": N, "E": int(ei.size(1)), "F": F, "D": D, "first_step_bitwise_equal": same,
           "first_step_s": {k: v[2] for k, v in firsts.items()}, "copies_first_step": firsts["slots"][3],
           "cache_hits_timed": S.info()["hits"] - hits0,
           "median_ms": {k: 1e3 * statistics.median(v) for k, v in times.items()},
           "min_ms": {k: 1e3 * min(v) for k, v in times.items()},
           "perm_over_slots": statistics.median(ratios), "perm_over_slots_ci95": _interval(ratios),
           "times_s": times}
    if eager:
        out["eager_over_slots"] = statistics.median(e / s for e, s in zip(times["eager"], times["slots"]))
        out["eager_over_perm"] = statistics.median(e / s for e, s in zip(times["eager"], times["perm"]))
    return out


def markdown(p: dict) -> str:
    r = p["result"]
    lo, hi = r["perm_over_slots_ci95"]
    lines = [f"# GINE training steps, edge features in CSR slot order vs through perm (`{p['command']}`)", "",
             f"CPU: {p['cpu']}, {p['threads']} threads; {r['N']:,} nodes / {r['E']:,} edges power-law, F = {r['F']}, "
             f"D = {r['D']}, float32. {_common.load_text(p['loadavg_before_after'])}.", "",
             f"First step bit for bit equal (slots vs perm): {r['first_step_bitwise_equal']}; copies made by the first "
             f"step: {r['copies_first_step']}; cache hits in the timed steps: {r['cache_hits_timed']}.", "",
             "| variant | median ms | min ms | first step s |", "|---|---|---|---|"]
    for k, v in r["median_ms"].items():
        first = r["first_step_s"].get(k)
        lines.append(f"| {k} | {v:.1f} | {r['min_ms'][k]:.1f} | " + (f"{first:.2f} |" if first is not None else "- |"))
    lines += ["", f"perm / slots (median of the rounds' paired ratios): {r['perm_over_slots']:.3f}x "
                  f"[{lo:.3f}, {hi:.3f}] (95% bootstrap interval of the median)."]
    if "eager_over_slots" in r:
        lines.append(f"eager / slots {r['eager_over_slots']:.2f}x, eager / perm {r['eager_over_perm']:.2f}x.")
    lines.append("")
    return "\n".join(lines)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--nodes", type=int, default=100_000, help="N (10 N edges)")
    ap.add_argument("--features", type=int, default=128)
    ap.add_argument("--edge-dim", type=int, default=16)
    ap.add_argument("--rounds", type=int, default=9)
    ap.add_argument("--warmup", type=int, default=1)
    ap.add_argument("--eager", action="store_true", help="also time PyG eager, one step per round")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--out", default="slot_steps")
    args = ap.parse_args(argv)
    torch.set_num_threads(args.threads)
    load0 = _common.loadavg()
    res = run(args.nodes, args.features, args.edge_dim, args.rounds, args.warmup, args.eager)
    payload = {"command": _common.command("slot_steps", argv), "cpu": _common.cpu_model(), "threads": args.threads,
               "machine": _common.machine(), "result": res, "loadavg_before_after": [load0, _common.loadavg()]}
    _common.write_results(_common.RESULTS, args.out, payload, markdown)
    print(markdown(payload))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
