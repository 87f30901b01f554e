"""PyG's zoo, one training step each: eager vs ``gnncompile.compile(model)`` with its speed guard.

    python -m benchmarks zoo                      # every entry below that constructs here
    python -m benchmarks zoo --only GATConv,HGTConv
    python -m benchmarks zoo --quick              # a handful of entries, fewer steps
    python -m benchmarks zoo --resume             # go on with an interrupted run (same options)
    python -m benchmarks zoo --resume --stop-after 900   # in pieces: stop starting entries after 15 min

Every PyG convolution and ``torch_geometric.nn.models`` model that constructs here with the
arguments of :data:`ENTRIES`, homogeneous and heterogeneous, as a PyG user builds it (the
default arguments, width 32 in and out, 4 heads where a layer has heads), on one generated
graph: ``--nodes`` nodes, ``--degree`` random in-edges per node, node features N(0, 1) of width
32, edge features of width 8, 3-d positions, 8 graphs in the batch vector (heterogeneous
entries: two node types, three edge types, the same sizes per type).

Each entry runs in a process of its own: the model built from seed 0; eager and compiled
outputs compared in eval mode (1e-4; a mismatch is reported and the entry gets no ratio); the
compiled model warmed up until its speed guards have decided (the pieces', then the whole
model's against eager: 25 calls; where the compiled model won that race by less than 2x, on to
its re-check after 150 more calls); then
``--steps`` training steps of each, interleaved (eager, compiled, compiled, eager, ...), a step
being forward, the mean square of every output, backward; medians, and the 95% interval of the
ratio over the pairs of back-to-back steps (:func:`verdict`: faster, slower, or no difference
measured where the interval holds 1). Also recorded: what the
speed guard kept and why, and ``gnncompile.explain``'s counts (fused chains, graph pieces,
graph breaks), checked against the gnncompile ops a compiled forward runs (torch.profiler).
Writes benchmarks/results/zoo[_quick].{json,md,png}. A shared machine is noisy: the ratio is
eager's median step over the compiled one's, from steps interleaved in one process.
"""
from __future__ import annotations

import argparse
import json
import statistics
import time
import warnings
from pathlib import Path
from typing import Callable, Dict, Tuple

import gnncompile  # (the installed package; imported before anything else)
import torch

from . import _common

F, H, EDGE_DIM, GRAPHS = 32, 32, 8, 8
QUICK = ("GCNConv", "GATConv", "GINEConv", "TransformerConv-edge", "HGTConv")


# ----------------------------------------------------------------------------- inputs
class Graph:
    """The generated inputs one entry may read."""

    def __init__(self, nodes: int, degree: int) -> None:
        g = torch.Generator().manual_seed(0)
        n, e = nodes, nodes * degree
        self.n = n
        self.x = torch.randn(n, F, generator=g)
        self.edge_index = torch.stack([torch.randint(0, n, (e,), generator=g),
                                       torch.arange(n).repeat_interleave(degree)])
        self.edge_attr = torch.randn(e, EDGE_DIM, generator=g)
        self.pseudo = torch.rand(e, 3, generator=g)
        self.edge_weight = torch.rand(e, generator=g)
        self.edge_type = torch.randint(0, 3, (e,), generator=g)
        self.node_type = torch.randint(0, 2, (n,), generator=g)
        self.pos = torch.randn(n, 3, generator=g)
        self.z = torch.randint(1, 10, (n,), generator=g)
        self.batch = torch.sort(torch.randint(0, GRAPHS, (n,), generator=g)).values
        self.x_dict = {"a": self.x, "b": torch.randn(n, F, generator=g)}
        self.edge_index_dict = {
            ("a", "to", "b"): self.edge_index,
            ("b", "to", "a"): self.edge_index[:, torch.randperm(e, generator=g)],
            ("b", "near", "b"): torch.stack([torch.randint(0, n, (e,), generator=g), self.edge_index[1]]),
        }
        self.metadata = (["a", "b"], list(self.edge_index_dict))


def _mlp(i: int = F, o: int = H) -> torch.nn.Module:
    return torch.nn.Sequential(torch.nn.Linear(i, o), torch.nn.ReLU(), torch.nn.Linear(o, o))


def _pna_deg(g: Graph) -> torch.Tensor:
    from torch_geometric.utils import degree

    d = degree(g.edge_index[1], g.n, dtype=torch.long)
    return torch.bincount(d)


class RadiusGraph(torch.nn.Module):
    """Every pair of nodes of one graph closer than ``cutoff`` (both directions), with their
    distance: SchNet's interaction graph in plain torch, since PyG's ``radius_graph`` needs
    pyg-lib or torch-cluster, which have no build for this torch (unlike ``radius_graph``, no
    cap on the neighbors per node)."""

    def __init__(self, cutoff: float) -> None:
        super().__init__()
        self.cutoff = cutoff

    def forward(self, pos: torch.Tensor, batch: torch.Tensor):
        d = torch.cdist(pos, pos)
        near = (d < self.cutoff) & (batch[:, None] == batch[None, :])
        near &= ~torch.eye(pos.size(0), dtype=torch.bool, device=pos.device)
        dst, src = near.nonzero().t()
        return torch.stack([src, dst]), d[dst, src]


def _schnet(g: Graph):
    from torch_geometric.nn.models import SchNet

    return SchNet(hidden_channels=H, num_filters=H, num_interactions=2, num_gaussians=16, cutoff=1.5,
                  interaction_graph=RadiusGraph(1.5))


def _to_hetero(g: Graph):
    from torch_geometric.nn import SAGEConv, to_hetero

    class Two(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.c1, self.c2 = SAGEConv((-1, -1), H), SAGEConv((-1, -1), H)

        def forward(self, x, edge_index):
            return self.c2(self.c1(x, edge_index).relu(), edge_index)
    m = to_hetero(Two(), g.metadata, aggr="sum")
    m(g.x_dict, g.edge_index_dict)  # lazy sizes
    return m


#: settings an entry compiles with beyond the guard's (the entry's name says it): GPSConv with
#: capture_dynamic=False, under which to_dense_batch's padded length is read as a value (one graph
#: break) and the attention after it compiles and fuses (gnncompile::dense_attention). Under the
#: default capture that length is a data-dependent size and Dynamo breaks the graph at the
#: attention (HISTORY section 31), after which the compiled module compiles again with scalar
#: reads left to eager (HISTORY section 32): the GPSConv entry fuses the attention too
ENTRY_SETTINGS: Dict[str, dict] = {"GPSConv-static": {"capture_dynamic": False}}


def _entries() -> Dict[str, Tuple[Callable, Callable]]:
    """name -> (build(graph) -> module, inputs(graph) -> args)."""
    import torch_geometric.nn as gnn
    from torch_geometric.nn import models as M

    X = lambda g: (g.x, g.edge_index)  # noqa: E731
    XE = lambda g: (g.x, g.edge_index, g.edge_attr)  # noqa: E731
    XW = lambda g: (g.x, g.edge_index, g.edge_weight)  # noqa: E731
    XT = lambda g: (g.x, g.edge_index, g.edge_type)  # noqa: E731
    XB = lambda g: (g.x, g.edge_index, g.batch)  # noqa: E731
    HET = lambda g: (g.x_dict, g.edge_index_dict)  # noqa: E731
    return {
        "GCNConv": (lambda g: gnn.GCNConv(F, H), X),
        "GCNConv-weighted": (lambda g: gnn.GCNConv(F, H), XW),
        "GraphConv": (lambda g: gnn.GraphConv(F, H), X),
        "SAGEConv": (lambda g: gnn.SAGEConv(F, H), X),
        "SAGEConv-max": (lambda g: gnn.SAGEConv(F, H, aggr="max"), X),
        "GATConv": (lambda g: gnn.GATConv(F, H // 4, heads=4), X),
        "GATConv-edge": (lambda g: gnn.GATConv(F, H // 4, heads=4, edge_dim=EDGE_DIM), XE),
        "GATv2Conv": (lambda g: gnn.GATv2Conv(F, H // 4, heads=4), X),
        "TransformerConv": (lambda g: gnn.TransformerConv(F, H // 4, heads=4), X),
        "TransformerConv-edge": (lambda g: gnn.TransformerConv(F, H // 4, heads=4, edge_dim=EDGE_DIM), XE),
        "SuperGATConv": (lambda g: gnn.SuperGATConv(F, H // 4, heads=4), X),
        "GINConv": (lambda g: gnn.GINConv(_mlp()), X),
        "GINEConv": (lambda g: gnn.GINEConv(_mlp(), edge_dim=EDGE_DIM), XE),
        "ChebConv": (lambda g: gnn.ChebConv(F, H, K=3), X),
        "ResGatedGraphConv": (lambda g: gnn.ResGatedGraphConv(F, H), X),
        "LEConv": (lambda g: gnn.LEConv(F, H), X),
        "TAGConv": (lambda g: gnn.TAGConv(F, H), X),
        "SGConv": (lambda g: gnn.SGConv(F, H, K=2), X),
        "SSGConv": (lambda g: gnn.SSGConv(F, H, alpha=0.1, K=2), X),
        "APPNP": (lambda g: gnn.APPNP(K=5, alpha=0.1), X),
        "ARMAConv": (lambda g: gnn.ARMAConv(F, H), X),
        "GeneralConv": (lambda g: gnn.GeneralConv(F, H), X),
        "ClusterGCNConv": (lambda g: gnn.ClusterGCNConv(F, H), X),
        "FiLMConv": (lambda g: gnn.FiLMConv(F, H), X),
        "MFConv": (lambda g: gnn.MFConv(F, H), X),
        "GENConv": (lambda g: gnn.GENConv(F, H), X),
        "EdgeConv": (lambda g: gnn.EdgeConv(_mlp(2 * F, H)), X),
        "PNAConv": (lambda g: gnn.PNAConv(F, H, ["mean", "min", "max", "std"], ["identity", "amplification"],
                                          deg=_pna_deg(g), edge_dim=EDGE_DIM), XE),
        "CGConv": (lambda g: gnn.CGConv(F, dim=EDGE_DIM), XE),
        "GatedGraphConv": (lambda g: gnn.GatedGraphConv(H, num_layers=2), X),
        "GMMConv": (lambda g: gnn.GMMConv(F, H, dim=3, kernel_size=2), lambda g: (g.x, g.edge_index, g.pseudo)),
        "NNConv": (lambda g: gnn.NNConv(F, H // 4, _mlp(EDGE_DIM, F * H // 4)), XE),
        "FeaStConv": (lambda g: gnn.FeaStConv(F, H, heads=2), X),
        "PointNetConv": (lambda g: gnn.PointNetConv(_mlp(F + 3, H)), lambda g: (g.x, g.pos, g.edge_index)),
        "PointTransformerConv": (lambda g: gnn.PointTransformerConv(F, H), lambda g: (g.x, g.pos, g.edge_index)),
        "PPFConv": (lambda g: gnn.PPFConv(_mlp(F + 4, H)), lambda g: (g.x, g.pos, g.pos, g.edge_index)),
        "LGConv": (lambda g: gnn.LGConv(), X),
        "EGConv": (lambda g: gnn.EGConv(F, H), X),
        "PDNConv": (lambda g: gnn.PDNConv(F, H, edge_dim=EDGE_DIM, hidden_channels=16), XE),
        "AntiSymmetricConv": (lambda g: gnn.AntiSymmetricConv(F), X),
        "GCN2Conv": (lambda g: gnn.GCN2Conv(F, alpha=0.1), lambda g: (g.x, g.x, g.edge_index)),
        "FAConv": (lambda g: gnn.FAConv(F), lambda g: (g.x, g.x, g.edge_index)),
        "WLConvContinuous": (lambda g: gnn.WLConvContinuous(), X),
        "SimpleConv": (lambda g: gnn.SimpleConv(aggr="mean"), X),
        "DirGNNConv": (lambda g: gnn.DirGNNConv(gnn.SAGEConv(F, H)), X),
        "MixHopConv": (lambda g: gnn.MixHopConv(F, H), X),
        "RGCNConv": (lambda g: gnn.RGCNConv(F, H, num_relations=3), XT),
        "FastRGCNConv": (lambda g: gnn.FastRGCNConv(F, H, num_relations=3), XT),
        "RGATConv": (lambda g: gnn.RGATConv(F, H, num_relations=3), XT),
        "HEATConv": (lambda g: gnn.HEATConv(F, H, num_node_types=2, num_edge_types=3, edge_type_emb_dim=4,
                                            edge_dim=EDGE_DIM, edge_attr_emb_dim=4, heads=2),
                     lambda g: (g.x, g.edge_index, g.node_type, g.edge_type, g.edge_attr)),
        "GPSConv": (lambda g: gnn.GPSConv(H, gnn.GINConv(_mlp(H, H)), heads=4), XB),
        "GPSConv-static": (lambda g: gnn.GPSConv(H, gnn.GINConv(_mlp(H, H)), heads=4), XB),
        "GCN": (lambda g: M.GCN(F, H, num_layers=2), X),
        "GraphSAGE": (lambda g: M.GraphSAGE(F, H, num_layers=2), X),
        "GIN": (lambda g: M.GIN(F, H, num_layers=2), X),
        "GAT": (lambda g: M.GAT(F, H, num_layers=2, heads=4), X),
        "GraphSAGE-jk": (lambda g: M.GraphSAGE(F, H, num_layers=3, jk="cat", norm="batch_norm"), X),
        "PNA": (lambda g: M.PNA(F, H, num_layers=2, aggregators=["mean", "max"], scalers=["identity"],
                                deg=_pna_deg(g)), X),
        "EdgeCNN": (lambda g: M.EdgeCNN(F, H, num_layers=2), X),
        "AttentiveFP": (lambda g: M.AttentiveFP(F, H, 4, edge_dim=EDGE_DIM, num_layers=2, num_timesteps=2),
                        lambda g: (g.x, g.edge_index, g.edge_attr, g.batch)),
        "SchNet": (_schnet, lambda g: (g.z, g.pos, g.batch)),
        "HGTConv": (lambda g: gnn.HGTConv(F, H, g.metadata, heads=4), HET),
        "HANConv": (lambda g: gnn.HANConv(F, H, g.metadata, heads=4), HET),
        "HeteroConv": (lambda g: gnn.HeteroConv({et: gnn.SAGEConv((F, F), H) for et in g.edge_index_dict}),
                       HET),
        "to_hetero(SAGE)": (_to_hetero, HET),
    }


# ----------------------------------------------------------------------------- one entry
def _floats(out):
    if isinstance(out, torch.Tensor):
        return [out] if out.is_floating_point() else []
    if isinstance(out, dict):
        out = list(out.values())
    if isinstance(out, (list, tuple)):
        return [t for o in out for t in _floats(o)]
    return []


def _step(run, args, params):
    for p in params:
        p.grad = None
    loss = sum(t.float().square().mean() for t in _floats(run(*args)))
    loss.backward()


def _fused_op_calls(compiled, args) -> int:
    """gnncompile ops a compiled training forward runs once the guards have decided
    (torch.profiler): 0 where they kept the unrewritten form or the model as written."""
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CPU]) as prof:
        compiled(*args)
    return sum(e.count for e in prof.key_averages() if e.key.startswith("gnncompile::"))


def child(name: str, nodes: int, degree: int, steps: int, guard_mode: str = "time") -> dict:
    from gnncompile.compiler import guard

    build, inputs = _entries()[name]
    g = Graph(nodes, degree)
    torch.manual_seed(0)
    model = build(g)
    args = inputs(g)
    params = [p for p in model.parameters() if p.requires_grad]
    if not params:  # a layer without weights (APPNP, LGConv, ...): the gradient of its input
        args = tuple(a.detach().requires_grad_() if isinstance(a, torch.Tensor) and a.is_floating_point() else a
                     for a in args)
        params = [a for a in args if isinstance(a, torch.Tensor) and a.requires_grad]
    out = {"name": name, "nodes": nodes, "edges": nodes * degree, "params": sum(p.numel() for p in params)}
    compiled = gnncompile.compile(model, settings={"choices": {"guard": guard_mode}, **ENTRY_SETTINGS.get(name, {})})
    model.eval()
    with torch.no_grad():
        expect, got = _floats(model(*args)), _floats(compiled(*args))
    err = max(((a - b).abs().max() / (1 + b.abs().max())).item() for a, b in zip(got, expect)) if expect else 0.0
    out["max_rel_err"] = err
    out["agree"] = len(got) == len(expect) and err <= 1e-4
    model.train()
    rep = gnncompile.explain(compiled, *args)
    out.update(fused=rep.num_fused, pieces=rep.num_graphs, breaks=rep.num_graph_breaks,
               unfused=[str(u) for u in rep.unfused][:6])
    t0 = time.perf_counter()
    for _ in range(guard.WARM + 2 + 2 * guard.SAMPLES + 1):  # pieces' races, then the model's
        _step(compiled, args, params)
    # a close win of the compiled model is timed again RECHECK_AFTER calls later: step past it
    out["warmup_steps"] = guard.WARM + 2 + 2 * guard.SAMPLES + 1 + _common.step_past_guard(
        compiled, lambda: _step(compiled, args, params))
    out["warmup_s"] = time.perf_counter() - t0
    out["guard"] = [{"kept": d.kept, "reason": d.reason, "piece": d.piece, "grad": d.grad, "recheck": d.recheck}
                    for d in compiled.guard_decisions()]
    out["fused_op_calls"] = _fused_op_calls(compiled, args)
    _step(model, args, params)
    times = {"eager": [], "gnncompile": []}
    for i in range(steps):
        order = (("eager", model), ("gnncompile", compiled))
        for key, run in (order if i % 2 == 0 else order[::-1]):
            t0 = time.perf_counter()
            _step(run, args, params)
            times[key].append(time.perf_counter() - t0)
    out["eager_ms"] = statistics.median(times["eager"]) * 1e3
    out["gnncompile_ms"] = statistics.median(times["gnncompile"]) * 1e3
    out["speedup"] = out["eager_ms"] / out["gnncompile_ms"]
    # the i-th eager and compiled steps ran back to back: a pair. The interval of their ratio says
    # whether a ratio near 1 is a difference at all on a noisy machine.
    from gnncompile.tuner import noise

    iv = noise.ratio_interval([1 / t for t in times["gnncompile"]], [1 / t for t in times["eager"]])
    out["interval"] = [iv["low"], iv["high"]] if iv and iv["low"] is not None else None
    return out


def verdict(r: dict) -> str:
    """'faster' / 'slower' where the paired steps' 95% interval of eager / gnncompile lies above /
    below 1, else 'no difference measured' (also where there is no interval)."""
    iv = r.get("interval")
    if not iv:
        return "no difference measured"
    return "faster" if iv[0] > 1.0 else "slower" if iv[1] < 1.0 else "no difference measured"


# ----------------------------------------------------------------------------- report
def _kept(r: dict) -> str:
    """'pieces: rewritten; model: compiled' from an entry's training-call decisions."""
    training = [d for d in r.get("guard", []) if d["grad"]]
    model = [d for d in training if d["piece"].startswith("the whole model")]
    pieces = sorted({d["kept"] for d in training if not d["piece"].startswith("the whole model")})
    text = "pieces: " + (" / ".join(pieces) if pieces else "nothing rewritten")
    if not model:
        return text + "; model: undecided"
    again = f" (re-checked; first {model[0]['kept']})" if model[-1].get("recheck") else ""
    return text + f"; model: {model[-1]['kept']}{again}"


def markdown(p: dict) -> str:
    rows = p["rows"]
    ok = [r for r in rows if "speedup" in r and r.get("agree")]
    slower = [r["name"] for r in ok if verdict(r) == "slower"]
    lines = [f"{len(ok)} of {len(rows)} entries measured; gnncompile >= 1.0x eager in "
             f"{sum(r['speedup'] >= 1.0 for r in ok)} of them (median step, steps interleaved in one process; "
             "> 1 is faster). By the paired steps (geometric mean of each pair's ratio, 95% interval): faster in "
             f"{sum(verdict(r) == 'faster' for r in ok)}, no difference measured in "
             f"{sum(verdict(r) == 'no difference measured' for r in ok)}, slower in {len(slower)}"
             + (f" ({', '.join(slower)})." if slower else "."), "",
             "| entry | eager ms | gnncompile ms | vs eager | paired [95% interval] | speed guard kept (training) | "
             "fused chains | pieces | breaks | gnncompile ops / forward |",
             "|---|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        if "error" in r:
            lines.append(f"| {r['name']} | | | not run: {r['error'][:160]} | | | | | | |")
            continue
        if not r.get("agree"):
            lines.append(f"| {r['name']} | | | outputs differ (max rel err {r['max_rel_err']:.2e}) | | | | | | |")
            continue
        iv = r.get("interval")
        # the interval is symmetric in the logarithm around the pairs' geometric mean
        span = f"{(iv[0] * iv[1]) ** 0.5:.2f}x [{iv[0]:.2f}, {iv[1]:.2f}]" if iv else "-"
        lines.append(f"| {r['name']} | {r['eager_ms']:.2f} | {r['gnncompile_ms']:.2f} | {r['speedup']:.2f}x | "
                     f"{span} | {_kept(r)} | {r['fused']} | {r['pieces']} | {r['breaks']} | {r['fused_op_calls']} |")
    kept = [(r["name"], d) for r in rows for d in r.get("guard", [])
            if d["kept"] in ("unrewritten", "eager") and d["grad"]]
    lines += ["", "Where the speed guard kept the unrewritten form of a piece, or the model as written "
              "(training calls), and why:", ""]
    lines += [f"- {n}: {d['piece']}: {d['reason']}" for n, d in kept] or ["- (none)"]
    again = [(r["name"], d) for r in rows for d in r.get("guard", []) if d.get("recheck") and d["grad"]]
    if again:
        lines += ["", "Close wins of the compiled model (under 1 + gnncompile.compiler.guard.RECHECK_BELOW), "
                  "timed again after RECHECK_AFTER calls (training calls):", ""]
        lines += [f"- {n}: kept {d['kept']}: {d['reason']}" for n, d in again]
    m = p["machine"]
    lines += ["", f"Graph: {p['nodes']} nodes, {p['nodes'] * p['degree']} edges (in-degree {p['degree']}), "
              f"F = {F}, edge features {EDGE_DIM}; {p['steps']} steps of each after the guard's warm-up "
              f"(speed guard: {p.get('guard', 'time')}); "
              f"{p['threads']} threads, torch {m['torch']}, CPU {p['cpu']}. "
              f"{_common.load_text(p['loadavg_before_after'])} (a shared machine). Command: `{p['command']}`"]
    if len(p.get("sessions", [])) > 1:
        lines += ["", f"Measured in {len(p['sessions'])} sessions (`--resume` kept the entries measured before):"]
        lines += [f"- `{s['command']}`: load average (1 min) {s['loadavg_before'][0]:.1f} / "
                  f"{s.get('loadavg_after', s['loadavg_before'])[0]:.1f}" for s in p["sessions"]]
    return "\n".join(lines) + "\n"


def plot(p: dict, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows = sorted((r for r in p["rows"] if "speedup" in r and r.get("agree")), key=lambda r: r["speedup"])
    fig, ax = plt.subplots(figsize=(7, max(3, 0.22 * len(rows))))
    colors = ["tab:orange" if "model: eager" in _kept(r) else "tab:blue" for r in rows]
    ax.barh([r["name"] for r in rows], [r["speedup"] for r in rows], color=colors)
    ax.axvline(1.0, color="black", lw=0.8)
    ax.set_xlabel("training step, eager / gnncompile (> 1: faster); orange: the guard kept eager")
    ax.tick_params(axis="y", labelsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def main(argv=None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true", help=f"only {', '.join(QUICK)}; 10 steps")
    ap.add_argument("--only", default=None, help="comma list of entries")
    ap.add_argument("--nodes", type=int, default=2000)
    ap.add_argument("--degree", type=int, default=8)
    ap.add_argument("--steps", type=int, default=None, help="interleaved steps of each (default 60, quick 10)")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--guard", choices=("time", "off"), default="time",
                    help="the speed guard (off: the rewritten form always, the 'before' of the guard)")
    ap.add_argument("--timeout", type=int, default=600, help="seconds per entry")
    ap.add_argument("--out", default=None)
    ap.add_argument("--results-dir", default=str(_common.RESULTS))
    ap.add_argument("--resume", action="store_true",
                    help="keep the entries an interrupted run with the same options already measured "
                         "(<out>.partial.json, written after every entry) and run the rest")
    ap.add_argument("--stop-after", type=float, default=None, metavar="SECONDS",
                    help="start no entry after this many seconds: the run stops with its partial result "
                         "kept for --resume (exit status 3)")
    ap.add_argument("--child", default=None, help=argparse.SUPPRESS)
    opts = ap.parse_args(argv)
    warnings.simplefilter("ignore")
    torch.set_num_threads(opts.threads)
    steps = opts.steps or (10 if opts.quick else 60)
    if opts.child:
        print("RESULT " + json.dumps(child(opts.child, opts.nodes, opts.degree, steps, opts.guard)), flush=True)
        return {}
    names = list(_entries())
    if opts.only:
        wanted = opts.only.split(",")
        unknown = set(wanted) - set(names)
        if unknown:
            raise SystemExit(f"zoo: unknown entries {sorted(unknown)}; known: {', '.join(names)}")
        names = wanted
    elif opts.quick:
        names = list(QUICK)
    name_out = opts.out or ("zoo_quick" if opts.quick else "zoo")
    results = Path(opts.results_dir)
    partial_path = results / f"{name_out}.partial.json"
    options = {"nodes": opts.nodes, "degree": opts.degree, "steps": steps, "threads": opts.threads,
               "guard": opts.guard}
    done, sessions = _resumed(partial_path, options, names) if opts.resume else ({}, [])
    sessions.append({"command": _common.command("zoo", argv), "loadavg_before": _common.loadavg()})
    rows = []
    started = time.monotonic()
    for name in names:
        if opts.stop_after is not None and name not in done and time.monotonic() - started > opts.stop_after:
            left = len(names) - len(rows)
            print(f"zoo: stopped after {opts.stop_after:g} s with {left} of {len(names)} entries left; "
                  f"the {len(rows)} measured are in {partial_path}: rerun with --resume", flush=True)
            raise SystemExit(3)
        if name in done:
            rows.append(done[name])
            print(f"{name}: kept from the interrupted run", flush=True)
            continue
        cmd = _common.module_command("zoo") + ["--child", name, "--nodes", str(opts.nodes), "--degree",
                                               str(opts.degree), "--steps", str(steps), "--threads", str(opts.threads),
                                               "--guard", opts.guard]
        r = _common.run_child(cmd, _common.timing_env(opts.threads), opts.timeout, tail_chars=300)
        r.setdefault("name", name)
        rows.append(r)
        print(f"{name}: " + (r["error"] if "error" in r else
                             f"eager {r['eager_ms']:.2f} ms, gnncompile {r['gnncompile_ms']:.2f} ms "
                             f"({r['speedup']:.2f}x), kept {_kept(r)}, agree {r['agree']}"), flush=True)
        sessions[-1]["loadavg_after"] = _common.loadavg()
        _common.write_json(partial_path, {"options": options, "rows": rows, "sessions": sessions})
    payload = {"machine": _common.machine(), "cpu": _common.cpu_model(), "threads": opts.threads,
               "nodes": opts.nodes, "degree": opts.degree, "steps": steps, "guard": opts.guard, "rows": rows,
               "loadavg_before_after": [sessions[0]["loadavg_before"], _common.loadavg()],
               "command": _common.command("zoo", argv), "sessions": sessions}
    _common.write_results(results, name_out, payload, markdown, plot)
    partial_path.unlink(missing_ok=True)
    return payload


def _resumed(path: Path, options: dict, names) -> Tuple[dict, list]:
    """The rows an interrupted run measured ({name: row}) and its sessions, when ``path`` holds a
    run with the same ``options``; entries that failed run again. Nothing (and a message) when
    the options differ."""
    if not path.exists():
        return {}, []
    try:
        old = json.loads(path.read_text())
        rows, sessions = old["rows"], old["sessions"]
    except (OSError, ValueError, KeyError, TypeError) as e:
        raise SystemExit(f"zoo --resume: {path} is not a partial run ({e}); remove it to start over")
    if old.get("options") != options:
        raise SystemExit(f"zoo --resume: {path} was run with {old.get('options')}, not {options}; "
                         "rerun with those options or remove it")
    done = {r["name"]: r for r in rows if "error" not in r and r.get("name") in names}
    return done, list(sessions)


if __name__ == "__main__":
    main()
