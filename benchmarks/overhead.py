"""Per-call overhead of a compiled model on a tiny graph: what a call costs beyond its kernels.

    python -m benchmarks overhead                     # GCN and GAT, 2 threads, all inners
    python -m benchmarks overhead --models GCN --inners inductor

A 2-layer GCN / GAT (F = 16) on a 64-node / 256-edge graph, forward only under
torch.no_grad() (a training step adds the same fixed costs in backward). Timed with
torch.utils.benchmark (blocked_autorange, median), in one process:

  eager           PyG as written
  compiled        gnncompile.compile(model, inner=...) called as a user calls it
  inner graph     the callable the gnncompile backend returned for the (single) graph piece,
                  called with the same inputs: AOTAutograd's runtime wrappers + the generated
                  code + the ops it calls. compiled - inner graph = Dynamo's frame entry and
                  guards + the CompiledModule wrapper (the dynamic-shape flag it sets)
  hoisted op      gnncompile::hoisted alone: the cache lookup (fingerprint of edge_index) and,
                  with inductor, the copies it hands out
  structure op    gnncompile::cached_csr on a fresh tensor equal to the cached edge_index: the
                  content comparison a lookup costs when identity misses (what every call
                  paid before the hoisting pass, once per layer for GCN's self-looped index)

Writes benchmarks/results/overhead.{json,md,png}.
"""
from __future__ import annotations

import argparse
import json
from pathlib import Path

import gnncompile

import torch
from torch.utils import benchmark as tbench

from . import _common

INNERS = ("eager", "aot_eager", "inductor")


def _us(fn, min_run_time: float) -> float:
    return tbench.Timer(stmt="fn()", globals={"fn": fn}).blocked_autorange(min_run_time=min_run_time).median * 1e6


def _graph(N: int, E: int, F: int):
    g = torch.Generator().manual_seed(0)
    ei = torch.randint(0, N, (2, E), generator=g)
    return torch.randn(N, F, generator=g), ei


def _model(name: str, F: int):
    from torch_geometric.nn import models

    torch.manual_seed(0)
    if name == "GAT":
        return models.GAT(F, F, 2, 4, heads=2).eval()
    return getattr(models, name)(F, F, 2, 4).eval()


class _Recorder:
    """Records what the gnncompile backend returns, and the graph it compiled."""

    def __init__(self):
        self.pieces = []

    def __enter__(self):
        from gnncompile.compiler import backend as be

        self._orig = be.Backend.__call__
        rec = self

        def call(self_, gm, example_inputs):
            fn = rec._orig(self_, gm, example_inputs)
            rec.pieces.append((gm, list(example_inputs), fn))
            return fn

        be.Backend.__call__ = call
        return self

    def __exit__(self, *exc):
        from gnncompile.compiler import backend as be

        be.Backend.__call__ = self._orig
        return False


def measure(name: str, inner: str, x, ei, min_run_time: float) -> dict:
    from gnncompile.ops import targets

    torch._dynamo.reset()
    model = _model(name, x.shape[1])
    with torch.no_grad():
        ref = model(x, ei)
        with _Recorder() as rec:
            c = gnncompile.compile(model, inner=inner)
            out = c(x, ei)
        torch.testing.assert_close(out, ref, rtol=1e-4, atol=1e-5)
        r = {"model": name, "inner": inner, "pieces": len(rec.pieces)}
        r["eager_us"] = _us(lambda: model(x, ei), min_run_time)
        r["compiled_us"] = _us(lambda: c(x, ei), min_run_time)
        if len(rec.pieces) == 1:
            gm, args, fn = rec.pieces[0]
            r["inner_graph_us"] = _us(lambda: fn(*args), min_run_time)
            r["dynamo_and_wrapper_us"] = r["compiled_us"] - r["inner_graph_us"]
            calls = [n for n in gm.graph.nodes if n.target is getattr(targets, "HOISTED", None)]
            if calls:
                n = calls[0]
                env = {p: a for p, a in zip([p for p in gm.graph.nodes if p.op == "placeholder"], args)}
                roots = [env[a] for a in n.args[1]]
                sizes = [env[a] if isinstance(a, torch.fx.Node) else a for a in n.args[2]]
                r["hoisted_us"] = _us(lambda: targets.HOISTED(n.args[0], roots, sizes, n.args[3]), min_run_time)
                r["hoisted_outputs"] = len([u for u in n.users])
        csr_args = (ei.clone(), x.shape[0], inner == "inductor")
        targets.CACHED_CSR(ei, x.shape[0], False)  # cached by content from here on
        r["structure_content_lookup_us"] = _us(lambda: targets.CACHED_CSR(csr_args[0].clone(), *csr_args[1:]),
                                               min_run_time)
        r["clone_edge_index_us"] = _us(lambda: csr_args[0].clone(), min_run_time)
    return r


def markdown(p: dict) -> str:
    head = ("| model | inner | graph pieces | eager us | compiled us | inner graph us | Dynamo + wrapper us "
            "| hoisted op us | structure lookup by content us |")
    lines = [head, "|---" * (head.count("|") - 1) + "|"]
    for r in p["results"]:
        def f(k):
            v = r.get(k)
            return f"{v:.1f}" if isinstance(v, float) else "-"
        lines.append(f"| {r['model']} | {r['inner']} | {r['pieces']} | {f('eager_us')} | {f('compiled_us')} | "
                     f"{f('inner_graph_us')} | {f('dynamo_and_wrapper_us')} | {f('hoisted_us')} | "
                     f"{f('structure_content_lookup_us')} |")
    lines.append("")
    lines.append(f"Forward under no_grad, {p['nodes']} nodes / {p['edges']} edges, F = {p['features']}, "
                 f"{p['threads']} thread(s), torch {p['torch']}; median of torch.utils.benchmark "
                 "blocked_autorange. The structure lookup by content is what each layer's "
                 "self-looped edge_index cost per call before hoisting (minus the clone it includes: "
                 f"{p['results'][0]['clone_edge_index_us']:.1f} us). Command: `{p['command']}`")
    return "\n".join(lines) + "\n"


def plot(p: dict, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rs = p["results"]
    labels = [f"{r['model']}\n{r['inner']}" for r in rs]
    fig, ax = plt.subplots(figsize=(max(6, 1.3 * len(rs)), 4))
    xs = range(len(rs))
    inner = [r.get("inner_graph_us", r["compiled_us"]) for r in rs]
    rest = [r["compiled_us"] - i for r, i in zip(rs, inner)]
    ax.bar(xs, inner, label="inner graph (AOT wrappers, code, ops)")
    ax.bar(xs, rest, bottom=inner, label="Dynamo guards + wrapper")
    ax.scatter(xs, [r["eager_us"] for r in rs], color="k", marker="_", s=400, label="PyG eager", zorder=3)
    ax.set_xticks(list(xs), labels)
    ax.set_ylabel("microseconds per forward call")
    ax.set_title(f"Per-call cost on a tiny graph ({p['nodes']} nodes, {p['edges']} edges)")
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def main(argv=None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--models", default="GCN,GAT")
    ap.add_argument("--inners", default=",".join(INNERS))
    ap.add_argument("--nodes", type=int, default=64)
    ap.add_argument("--edges", type=int, default=256)
    ap.add_argument("--features", type=int, default=16)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--min-run-time", type=float, default=0.5)
    ap.add_argument("--out", default="overhead")
    ap.add_argument("--results-dir", default=str(_common.RESULTS))
    a = ap.parse_args(argv)
    torch.set_num_threads(a.threads)
    x, ei = _graph(a.nodes, a.edges, a.features)
    results = []
    for name in a.models.split(","):
        for inner in a.inners.split(","):
            r = measure(name, inner, x, ei, a.min_run_time)
            results.append(r)
            print(json.dumps(r), flush=True)
    p = {"machine": _common.machine(), "nodes": a.nodes, "edges": a.edges, "features": a.features,
         "threads": a.threads, "torch": torch.__version__, "command": _common.command("overhead", argv),
         "results": results}
    _common.write_results(Path(a.results_dir), a.out, p, markdown, plot)
    return p


if __name__ == "__main__":
    main()
