"""Training step of 2-layer PyG models: gnncompile vs PyG eager vs PyG CSR adjacency vs inductor.

    python -m benchmarks models                 # 10k and 100k nodes (avg degree 10, F=128) + Cora
    python -m benchmarks models --quick         # a small graph, a few seconds per model
    python -m benchmarks models --inners        # also gnncompile with each inner compiler

One step = forward, cross-entropy loss, backward, Adam step. Models: GCN, GraphSAGE, GIN, GAT
from torch_geometric.nn.models, hidden 128, 2 layers (GAT: 4 heads of 32); on request (--models)
also GATv2 (models.GAT(v2=True)) and TransformerE (two TransformerConv layers, 4 heads of 32, with
16 edge features per edge, generated). Graphs: generated
power-law graphs (gnncompile.data.synthetic.power_law_graph) and, when present, Cora from
../shared/data (copied into a temporary root first).

Variants:
  eager        PyG as written, plain edge_index
  csr          PyG with a torch.sparse CSR adjacency (adj_t) passed instead of edge_index, for
               the layers whose message_and_aggregate accepts one (GCN: normalisation done
               once beforehand, as gcn_norm would with cached=True; GraphSAGE: the mean as
               weights 1/in-degree with reduce sum, since the power-law graphs hold duplicate
               edges that a coalesced adjacency merges; GIN). GATConv
               has no fused sparse path: not run.
  inductor     torch.compile(model) (inductor, default settings)
  gnncompile   gnncompile.compile(model) (default inner compiler)
  gnncompile-chain  the same with settings={'choices': {'attention': 'chain'}}: the attention as
               separate fused ops (edge_softmax, spmm) instead of one gnncompile::attention
  gnncompile-4k  gnncompile.compile(model) with settings={'choices': {'huge_pages': 'off'}}:
               torch's CPU allocator left as it is (4 KB pages; gnncompile.hardware.memory)
  gnncompile-reassoc  gnncompile.compile(model, reassociate=True): the opt-in inexact algebra
               (GCN's first layer aggregated before its linear map, (A X) W: gnncompile.passes.order;
               the spmm portfolio may pick a candidate that differs in the last bits)
Every variant runs in two subprocesses: one timed under the default allocator (as a user's process
runs: glibc's mmap threshold grows with the blocks freed, up to 32 MB), one measuring the peak
memory of one step after warm-up with _common.read_peak_rss_delta under
MALLOC_MMAP_THRESHOLD_=65536 (every allocation over 64 KB its own mapping). Until 2026-12-03 one
child did both under that variable, so every large tensor was faulted in again on every timed
step, the more so the more a variant allocates (HISTORY section 22). Its first-step loss and output
are checked against eager in that process before timing; gnncompile variants then step until
their speed guard has decided (the whole model against the model as written, training) and
the form it kept is timed (its decisions are in the JSON). Reports the median step time over
--repeats steps, the ratio to eager / csr / inductor, first-step latency (includes
compilation) and peak step memory. Writes benchmarks/results/models[_quick].{json,md,png}.
Timings on a shared machine are noisy: compare ratios from the same run.
"""
from __future__ import annotations

import argparse
import json
import shutil
import tempfile
import time
import warnings
from pathlib import Path

import gnncompile  # noqa: F401  (the installed package; imported before anything else)

from . import _common

MODELS = ("GCN", "GraphSAGE", "GIN", "GAT")
EXTRA_MODELS = ("GATv2", "TransformerE")  # run when named in --models
EDGE_DIM = 16  # TransformerE's edge features
CORA_RAW = Path(__file__).resolve().parents[2] / "shared" / "data" / "planetoid" / "Cora" / "raw"


# ----------------------------------------------------------------------------- one run (child)
def _load_graph(spec: str, F: int):
    import torch

    from gnncompile.data.synthetic import power_law_graph

    if spec == "cora":
        from torch_geometric.datasets import Planetoid

        root = Path(tempfile.mkdtemp())
        shutil.copytree(CORA_RAW, root / "Cora" / "raw")
        data = Planetoid(str(root), "Cora")[0]
        shutil.rmtree(root, ignore_errors=True)
        return data.x, data.edge_index, data.y, int(data.y.max()) + 1
    N = int(spec)
    ei = power_law_graph(N, 10 * N, seed=0)
    g = torch.Generator().manual_seed(1)
    x = torch.randn(N, F, generator=g)
    y = torch.randint(0, 16, (N,), generator=g)
    return x, ei, y, 16


def _transformer(F: int, C: int, num_edges: int):
    """Two TransformerConv layers (4 heads of 32, then 1 head) reading generated edge features,
    held by the model so that it is called as model(x, edge_index) like the others."""
    import torch
    from torch_geometric.nn import TransformerConv

    class TransformerE(torch.nn.Module):
        def __init__(self):
            super().__init__()
            g = torch.Generator().manual_seed(2)
            self.register_buffer("edge_attr", torch.randn(num_edges, EDGE_DIM, generator=g))
            self.conv1 = TransformerConv(F, 32, heads=4, edge_dim=EDGE_DIM)
            self.conv2 = TransformerConv(128, C, heads=1, edge_dim=EDGE_DIM)

        def forward(self, x, edge_index):
            x = torch.relu(self.conv1(x, edge_index, self.edge_attr))
            return self.conv2(x, edge_index, self.edge_attr)

    return TransformerE()


def _model(name: str, F: int, C: int, num_edges: int = 0):
    from torch_geometric.nn import models

    if name == "GAT":
        return models.GAT(F, 128, 2, C, heads=4)
    if name == "GATv2":
        return models.GAT(F, 128, 2, C, heads=4, v2=True)
    if name == "TransformerE":
        return _transformer(F, C, num_edges)
    return getattr(models, name)(F, 128, 2, C)


def _csr_adj(name: str, ei, N: int):
    """The sparse adjacency PyG's message_and_aggregate consumes (transposed: row = target)."""
    import torch

    if name in ("GAT",) + EXTRA_MODELS:
        return None
    if name == "GCN":
        from torch_geometric.nn.conv.gcn_conv import gcn_norm

        ei2, w = gcn_norm(ei, None, N, add_self_loops=True)
    else:
        ei2, w = ei, torch.ones(ei.size(1), device=ei.device)
        if name == "GraphSAGE":  # mean over edges with multiplicity: weights 1/in-degree, reduce sum
            deg = torch.zeros(N, device=ei.device).index_add_(0, ei[1], w)
            w = w / deg.clamp(min=1)[ei[1]]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        adj = torch.sparse_coo_tensor(ei2.flip(0), w, (N, N)).coalesce().to_sparse_csr()
    return adj


def graph_fingerprint(x, ei, y) -> str:
    """A short digest of a run's inputs (edge_index, features, labels): two processes that
    report the same one trained on the same generated graph."""
    import hashlib

    h = hashlib.blake2b(digest_size=8)
    for t in (ei, x, y):
        h.update(t.contiguous().numpy().tobytes())
    return h.hexdigest()


def train_step(run, model, x, graph_arg, y):
    """One training step (forward, cross-entropy, backward, Adam step) as a closure -> (out, loss)."""
    import torch

    opt = torch.optim.Adam(model.parameters(), lr=1e-3)

    def step():
        opt.zero_grad(set_to_none=True)
        out = run(x, graph_arg)
        loss = torch.nn.functional.cross_entropy(out, y)
        loss.backward()
        opt.step()
        return out, loss

    return step


def child(args) -> dict:
    import torch

    warnings.simplefilter("ignore")
    torch.set_num_threads(args.threads)

    x, ei, y, C = _load_graph(args.graph, args.features)
    N = x.size(0)
    torch.manual_seed(0)
    model = _model(args.model, x.size(1), C, ei.size(1))
    if args.variant == "csr" and args.model in ("GCN", "GraphSAGE"):
        for conv in model.convs:  # normalisation / the mean is folded into the adjacency
            if args.model == "GCN":
                conv.normalize = False
            else:
                conv.aggr = "sum"  # read by SAGEConv.message_and_aggregate only
    ref_model = _model(args.model, x.size(1), C, ei.size(1))
    ref_model.load_state_dict(model.state_dict())
    if args.variant == "csr":
        adj = _csr_adj(args.model, ei, N)
        if adj is None:
            return {"skipped": "layer has no sparse-adjacency path"}
        graph_arg = adj
        run = model
    elif args.variant == "eager":
        graph_arg, run = ei, model
    elif args.variant == "inductor":
        graph_arg, run = ei, torch.compile(model)
    elif args.variant.startswith("gnncompile"):
        inner = args.variant.split(":", 1)[1] if ":" in args.variant else "auto"
        base = args.variant.split(":", 1)[0]
        choices = {"gnncompile-chain": {"attention": "chain"}, "gnncompile-4k": {"huge_pages": "off"}}
        if base not in ("gnncompile", "gnncompile-reassoc") and base not in choices:
            raise ValueError(args.variant)
        graph_arg, run = ei, gnncompile.compile(model, inner=inner, reassociate=base == "gnncompile-reassoc",
                                                settings={"choices": choices[base]} if base in choices else None)
    else:
        raise ValueError(args.variant)
    step = train_step(run, model, x, graph_arg, y)

    # agreement check against eager (same parameters, before any optimizer step)
    with torch.no_grad():
        expect = ref_model(x, ei)
    t0 = time.perf_counter()
    out, loss = step()
    first = time.perf_counter() - t0
    scale = max(expect.abs().max().item(), 1e-12)
    err = (out.detach() - expect).abs().max().item() / scale
    if err > 1e-3:
        raise AssertionError(f"{args.variant} disagrees with eager: relative error {err:.2e}")
    for _ in range(args.warmup):
        step()
    guard_steps = _common.step_past_guard(run, step)  # past the speed guard's races: time the form it kept
    if args.measure == "peak":  # a child of its own, under MALLOC_MMAP_THRESHOLD_=65536
        return {"peak_bytes": _common.read_peak_rss_delta(step), "guard_steps": guard_steps}
    t = _common.timeit(step, args.repeats, warmup=0)
    kept = [str(d) for d in run.guard_decisions()] if hasattr(run, "guard_decisions") else []
    return {"median_s": t["median"], "min_s": t["min"], "first_step_s": first,
            "rel_err": err, "N": N, "E": int(ei.size(1)), "guard_steps": guard_steps,
            "guard": kept, "first_loss": float(loss), "graph": graph_fingerprint(x, ei, y)}


# ----------------------------------------------------------------------------- driver
def run_one(model: str, graph: str, variant: str, opts) -> dict:
    """The variant timed in one child under the default allocator, its peak step memory measured
    in another under MALLOC_MMAP_THRESHOLD_=65536 (read_peak_rss_delta's condition)."""
    cmd = _common.module_command("models") + [
        "--child", "--model", model, "--graph", graph, "--variant", variant, "--repeats", str(opts.repeats),
        "--warmup", str(opts.warmup), "--threads", str(opts.threads), "--features", str(opts.features)]
    out = _common.run_child(cmd + ["--measure", "time"], _common.timing_env(), opts.timeout)
    if "median_s" in out:
        peak = _common.run_child(cmd + ["--measure", "peak"], _common.isolated_env(), opts.timeout)
        if "peak_bytes" in peak:
            out["peak_bytes"] = peak["peak_bytes"]
        else:
            out["peak_error"] = peak.get("error", peak.get("skipped"))
    return out


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--inners", action="store_true", help="also gnncompile with each inner compiler")
    ap.add_argument("--models", default=",".join(MODELS))
    ap.add_argument("--graphs", default=None, help="comma list of node counts and/or 'cora'")
    ap.add_argument("--variants", default=None)
    ap.add_argument("--repeats", type=int, default=None)
    ap.add_argument("--warmup", type=int, default=2)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--features", type=int, default=128)
    ap.add_argument("--timeout", type=int, default=1800)
    ap.add_argument("--out", default=None)
    # child mode
    ap.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--model", help=argparse.SUPPRESS)
    ap.add_argument("--graph", help=argparse.SUPPRESS)
    ap.add_argument("--variant", help=argparse.SUPPRESS)
    ap.add_argument("--measure", choices=("time", "peak"), default="time", help=argparse.SUPPRESS)
    opts = ap.parse_args(argv)
    if opts.child:
        print("RESULT " + json.dumps(child(opts)), flush=True)
        return

    graphs = opts.graphs.split(",") if opts.graphs else (["2000"] if opts.quick else ["10000", "100000", "cora"])
    if "cora" in graphs:
        import importlib.util

        if not CORA_RAW.is_dir() or importlib.util.find_spec("scipy") is None:
            print("skipping cora: raw files or scipy (needed by PyG's Planetoid reader) missing")
            graphs.remove("cora")
    if opts.repeats is None:
        opts.repeats = 3 if opts.quick else 7
    variants = opts.variants.split(",") if opts.variants else ["eager", "csr", "inductor", "gnncompile"]
    if opts.inners:
        variants += ["gnncompile:eager", "gnncompile:aot_eager", "gnncompile:inductor"]
    rows = []
    for graph in graphs:
        for model in opts.models.split(","):
            row = {"graph": graph, "model": model, "results": {}}
            for v in variants:
                r = run_one(model, graph, v, opts)
                row["results"][v] = r
                print(f"{graph:>7} {model:<10} {v:<22} "
                      + (f"{r['median_s'] * 1e3:9.1f} ms  first {r['first_step_s']:.2f} s  "
                         f"peak {r['peak_bytes'] / 2**20:8.1f} MiB" if "median_s" in r else str(r)),
                      flush=True)
            rows.append(row)
    payload = {"machine": _common.machine(), "variants": variants, "repeats": opts.repeats,
               "threads": opts.threads, "features": opts.features, "rows": rows,
               "command": _common.command("models", argv)}
    name = opts.out or ("models_quick" if opts.quick else "models")
    _common.write_results(_common.RESULTS, name, payload, markdown, plot)


def _ms(r):
    return f"{r['median_s'] * 1e3:.1f}" if "median_s" in r else ("n/a" if "skipped" in r else "error")


def markdown(p: dict) -> str:
    vs = p["variants"]
    own = [v for v in vs if v != "gnncompile" and v.startswith("gnncompile")]  # its other forms
    head = ["graph", "model"] + [f"{v} ms" for v in vs] + ["vs eager", "vs csr", "vs inductor"] + [
        f"vs {v}" for v in own] + ["first step s (gnncompile)", "peak MiB eager / gnncompile"]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for row in p["rows"]:
        R = row["results"]
        g = R.get("gnncompile", {})

        def ratio(v):
            r = R.get(v, {})
            if "median_s" in r and "median_s" in g:
                return f"{r['median_s'] / g['median_s']:.2f}x"
            return "n/a"

        peak = (f"{R['eager']['peak_bytes'] / 2**20:.0f} / {g['peak_bytes'] / 2**20:.0f} "
                f"({g['peak_bytes'] / max(R['eager']['peak_bytes'], 1):.2f}x)"
                if "peak_bytes" in R.get("eager", {}) and "peak_bytes" in g else "n/a")
        cells = [row["graph"], row["model"]] + [_ms(R.get(v, {})) for v in vs] + [
            ratio("eager"), ratio("csr"), ratio("inductor")] + [ratio(v) for v in own] + [
            f"{g['first_step_s']:.2f}" if "first_step_s" in g else "n/a", peak]
        lines.append("| " + " | ".join(cells) + " |")
    m = p["machine"]
    lines.append("")
    lines.append(f"Median training-step time over {p['repeats']} steps, {p['threads']} threads, "
                 f"F = {p['features']}, torch {m['torch']}. Ratios: peer time / gnncompile time "
                 f"(> 1 means gnncompile is faster). Command: `{p['command']}`")
    return "\n".join(lines) + "\n"


def plot(p: dict, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    vs = p["variants"]
    labels = [f"{r['model']}\n{r['graph']}" for r in p["rows"]]
    fig, ax = plt.subplots(figsize=(max(6, 1.6 * len(labels)), 4))
    w = 0.8 / len(vs)
    for i, v in enumerate(vs):
        ys = []
        for r in p["rows"]:
            e, x = r["results"].get("eager", {}), r["results"].get(v, {})
            ys.append(e["median_s"] / x["median_s"] if "median_s" in e and "median_s" in x else 0)
        ax.bar([j + i * w for j in range(len(labels))], ys, w, label=v)
    ax.set_xticks([j + 0.4 - w / 2 for j in range(len(labels))])
    ax.set_xticklabels(labels, fontsize=8)
    ax.set_ylabel("speed-up over PyG eager (training step)")
    ax.axhline(1, color="k", lw=0.5)
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=120)


if __name__ == "__main__":
    main()
