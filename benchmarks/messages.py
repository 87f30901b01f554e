"""Training steps of layers with edge features or non-trivial messages: gnncompile vs PyG eager vs inductor.

    python -m benchmarks messages                        # 100k nodes / 1M edges + molecule batches
    python -m benchmarks messages --quick                # tiny sizes, a few seconds per variant, in-process
    python -m benchmarks messages --models EdgeCNN --graphs 20000   # a smaller graph for EdgeCNN

Workloads (``--models``):
  GINE       node classification, 2 x GINEConv(nn=Sequential(Linear(c, h), ReLU(), Linear(h, h)),
             edge_dim=D), ReLU after each layer, then Linear(h, classes)
  PNA        torch_geometric.nn.models.PNA(F, h, 2, classes, aggregators mean/min/max/std,
             scalers identity/amplification/attenuation, deg = the in-degree histogram of the
             graph, edge_dim=D, towers=1)
  EdgeCNN    torch_geometric.nn.models.EdgeCNN(F, 64, 2, classes); no edge features. Its messages
             are an MLP on [x_i, x_j - x_i]: E x 2F floats per layer, 1 GiB per such tensor at the
             default 1M edges (``--graphs`` picks smaller graphs)
  GEN        2 x GENConv(c, h, aggr='softmax', learn_t=True, edge_dim=D) (softmax aggregation with a
             learnable temperature), ReLU after each layer, then Linear(h, classes)
  GATE       2 x GATConv(c, h / 4, heads=4, edge_dim=D), ReLU after each layer, then Linear(h, classes)
  TCONV      2 x TransformerConv(c, h / 4, heads=4, edge_dim=D), ReLU after each layer, then
             Linear(h, classes)
  molecules  graph classification: 3 x GINEConv (32 -> 64, edge_dim=D), global_add_pool, Linear(64, 2)
             over a fixed list of --molecule-batches pre-built batches (Batch.from_data_list) of
             --batch-size graphs of 10-40 nodes (gin_batches.make_dataset: a random spanning tree
             plus random extra edges, both directions), node features 32
The node-level workloads run on generated power-law graphs (models._load_graph:
gnncompile.data.synthetic.power_law_graph with --graphs N nodes and 10 N edges, features N(0, 1)
of width --features, 16 classes), hidden 128. Edge features (width --edge-dim, default 16) are
N(0, 1) from their own seeded generator.

One step = forward, cross-entropy loss, backward, Adam step (lr 1e-3).

Variants:
  eager        PyG as written
  inductor     torch.compile(model) (default settings)
  gnncompile   gnncompile.compile(model) (default settings)
  gnncompile_outside   the same with edge encoders computed as written, outside the message
               kernels (GNNCOMPILE_EDGE_ENCODER=outside; not run unless named in --variants)
  gnncompile_perm      the same with edge inputs read through perm, not from the copy in CSR slot
               order cached with the structure (GNNCOMPILE_SLOT_ORDER=0; ops/slots.py; only if named)
Every variant runs in two subprocesses (``torch.set_num_threads(--threads)``): one timed under the
default allocator, as a user's process runs, and one measuring the peak step memory under
MALLOC_MMAP_THRESHOLD_ as _common.isolated_env sets it (until 2026-12-03 one child did both under
that variable, which faults every large tensor in again on every timed step; HISTORY section 22). ``--in-process`` (implied by
``--quick``, as in gin_batches.py) runs them one after another in the calling process instead,
``torch._dynamo.reset()`` between them: no interpreter start per variant, but peak memory there is
only indicative (the allocator keeps memory that earlier variants freed).
The model is built under torch.manual_seed(0) and deep-copied as the eager reference; the first
step's output and loss are checked against the reference on the same input before any optimizer
step (output: max error relative to max |output| <= 1e-3; loss: relative 1e-4). A failure (an
error while compiling, a disagreement, a crash or a timeout) is recorded as that variant's
``error`` and the other variants still run.
Node-level: --warmup steps after the first, then (gnncompile) steps until the speed guard has
decided, peak step memory (_common.read_peak_rss_delta over one step), then the median over
--repeats timed steps. molecules: one warm-up pass over all batches
(compilation and the recompilation for symbolic sizes happen there), peak memory over one
epoch, then --repeats timed epochs, every step timed: the median step and the median epoch.
Reported per workload: median step ms per variant, eager / gnncompile and inductor / gnncompile,
first-step latency (includes compilation), peak MiB, Dynamo graphs / graph breaks and the fused
message-passing ops gnncompile found. Writes benchmarks/results/messages[_quick].{json,md,png}.
Timings on a shared machine are noisy: compare ratios from the same run.
"""
from __future__ import annotations

import argparse
import copy
import json
import statistics
import time
import traceback
import warnings
from pathlib import Path

import gnncompile  # (the installed package; imported before anything else)
import torch

from . import _common

NODE_WORKLOADS = ("GINE", "PNA", "EdgeCNN", "GEN", "GATE", "TCONV")
WORKLOADS = NODE_WORKLOADS + ("molecules",)
#: what a run without --models measures (GEN, GATE and TCONV on request)
DEFAULT_WORKLOADS = ("GINE", "PNA", "EdgeCNN", "molecules")
VARIANTS = ("eager", "inductor", "gnncompile", "gnncompile_outside", "gnncompile_perm")
HIDDEN = 128
MOL_F, MOL_HIDDEN, MOL_LAYERS, MOL_C = 32, 64, 3, 2
OUT_TOL, LOSS_TOL = 1e-3, 1e-4


# ----------------------------------------------------------------------------- data
def edge_features(E: int, D: int, seed: int = 2):
    """[E, D] N(0, 1) edge features from their own generator (the graph's draws stay as models.py's)."""
    return torch.randn(E, D, generator=torch.Generator().manual_seed(seed))


def node_graph(N: int, F: int, D: int):
    """x, edge_index, edge_attr, y, classes for the node-level workloads."""
    from . import models

    x, ei, y, C = models._load_graph(str(N), F)
    return x, ei, edge_features(ei.size(1), D), y, C


def in_degree_histogram(edge_index, N: int):
    """deg[k] = number of nodes with in-degree k: PNA's scalers are normalised by its mean."""
    from torch_geometric.utils import degree

    return torch.bincount(degree(edge_index[1], num_nodes=N, dtype=torch.long))


def molecule_batches(num_batches: int, batch_size: int, D: int, seed: int = 0) -> list:
    """``num_batches`` Batch objects of ``batch_size`` generated molecule-sized graphs each, with
    [E, D] edge features (see gin_batches.make_dataset for the graphs)."""
    from torch_geometric.data import Batch

    from . import gin_batches

    graphs = gin_batches.make_dataset(num_batches * batch_size, seed=seed)
    g = torch.Generator().manual_seed(seed + 2)
    for d in graphs:
        d.edge_attr = torch.randn(d.edge_index.size(1), D, generator=g)
    return [Batch.from_data_list(graphs[i:i + batch_size]) for i in range(0, len(graphs), batch_size)]


# ----------------------------------------------------------------------------- models
def _gine_convs(in_ch: int, hidden: int, layers: int, edge_dim: int):
    from torch_geometric.nn import GINEConv

    lin, relu = torch.nn.Linear, torch.nn.ReLU
    return torch.nn.ModuleList(
        GINEConv(torch.nn.Sequential(lin(in_ch if i == 0 else hidden, hidden), relu(), lin(hidden, hidden)),
                 edge_dim=edge_dim)
        for i in range(layers))


class GINENet(torch.nn.Module):
    """Edge-feature conv layers (GINEConv unless ``convs`` is given) with ReLU after each, then a
    Linear to the classes (per node)."""

    def __init__(self, in_ch: int, hidden: int, layers: int, out: int, edge_dim: int, convs=None) -> None:
        super().__init__()
        self.convs = convs if convs is not None else _gine_convs(in_ch, hidden, layers, edge_dim)
        self.head = torch.nn.Linear(hidden, out)

    def forward(self, x, edge_index, edge_attr):
        for conv in self.convs:
            x = conv(x, edge_index, edge_attr).relu()
        return self.head(x)


class MolGINE(torch.nn.Module):
    """GINEConv layers with ReLU after each, global_add_pool, a Linear to the classes (per graph).
    The graph count is passed in, so the pool needs no data-dependent batch.max()."""

    def __init__(self, edge_dim: int) -> None:
        super().__init__()
        self.convs = _gine_convs(MOL_F, MOL_HIDDEN, MOL_LAYERS, edge_dim)
        self.head = torch.nn.Linear(MOL_HIDDEN, MOL_C)

    def forward(self, x, edge_index, edge_attr, batch, num_graphs: int):
        from torch_geometric.nn import global_add_pool

        for conv in self.convs:
            x = conv(x, edge_index, edge_attr).relu()
        return self.head(global_add_pool(x, batch, num_graphs))


def build_model(workload: str, F: int, C: int, D: int, edge_index=None, N: int = 0):
    """The workload's model under torch.manual_seed(0) (the same weights in every process)."""
    from torch_geometric.nn import models

    torch.manual_seed(0)
    if workload == "GINE":
        return GINENet(F, HIDDEN, 2, C, D)
    if workload == "PNA":
        return models.PNA(F, HIDDEN, 2, C, aggregators=["mean", "min", "max", "std"],
                          scalers=["identity", "amplification", "attenuation"],
                          deg=in_degree_histogram(edge_index, N), edge_dim=D, towers=1)
    if workload == "EdgeCNN":
        return models.EdgeCNN(F, 64, 2, C)
    if workload == "GEN":
        from torch_geometric.nn import GENConv

        convs = torch.nn.ModuleList(GENConv(F if i == 0 else HIDDEN, HIDDEN, aggr="softmax", learn_t=True, edge_dim=D)
                                    for i in range(2))
        return GINENet(F, HIDDEN, 2, C, D, convs)
    if workload == "GATE":
        from torch_geometric.nn import GATConv

        convs = torch.nn.ModuleList(GATConv(F if i == 0 else HIDDEN, HIDDEN // 4, heads=4, edge_dim=D) for i in range(2))
        return GINENet(F, HIDDEN, 2, C, D, convs)
    if workload == "TCONV":
        from torch_geometric.nn import TransformerConv

        convs = torch.nn.ModuleList(TransformerConv(F if i == 0 else HIDDEN, HIDDEN // 4, heads=4, edge_dim=D)
                                    for i in range(2))
        return GINENet(F, HIDDEN, 2, C, D, convs)
    if workload == "molecules":
        return MolGINE(D)
    raise ValueError(f"unknown workload {workload!r}")


def wrap(model, variant: str):
    if variant == "eager":
        return model
    if variant == "inductor":
        return torch.compile(model)
    if variant == "gnncompile":
        return gnncompile.compile(model)
    if variant == "gnncompile_outside":  # edge encoders computed as written (the A/B of their move inside)
        from gnncompile import config

        with config.override(edge_encoder="outside"):
            return gnncompile.compile(model)
    if variant == "gnncompile_perm":  # edge features read through perm, no copy in CSR slot order (before s57)
        from gnncompile import config

        with config.override(slot_order=False):
            return gnncompile.compile(model)
    raise ValueError(f"unknown variant {variant!r}")


# ----------------------------------------------------------------------------- one run (child)
def _check(variant: str, out, loss, expect, expect_loss) -> dict:
    """Relative output / loss errors against eager; raises on a disagreement."""
    scale = max(expect.abs().max().item(), 1e-12)
    err = (out.detach() - expect).abs().max().item() / scale
    loss_v, expect_v = float(loss), float(expect_loss)
    loss_err = abs(loss_v - expect_v) / max(abs(expect_v), 1e-12)
    if not (err <= OUT_TOL and loss_err <= LOSS_TOL):  # also catches NaN
        raise AssertionError(f"{variant} disagrees with eager: output relative error {err:.2e}, "
                             f"loss {loss_v:.6f} vs {expect_v:.6f}")
    return {"rel_err": err, "loss": loss_v, "loss_eager": expect_v, "loss_rel_err": loss_err, "agreed": True}


def _compile_counts(variant: str, run, counters, stats0: dict) -> dict:
    """Dynamo's graphs and graph breaks; for gnncompile also the graph pieces its backend compiled,
    the message-passing ops it fused and the device profile it applied."""
    from gnncompile.compiler import STATS

    if variant == "eager":
        return {}
    r = {"graphs_compiled": counters["stats"]["unique_graphs"],
         "graph_breaks": sum(counters["graph_break"].values())}
    if variant.startswith("gnncompile"):
        r["backend_graphs"] = STATS["graphs"] - stats0["graphs"]
        r["fused_ops"] = STATS["fused"] - stats0["fused"]
        prof = getattr(run, "gnncompile_profile", None)
        r["profile"] = prof.summary() if prof is not None else None
    return r


def _node_run(args, counters, stats0) -> dict:
    x, ei, ea, y, C = node_graph(args.nodes, args.features, args.edge_dim)
    N = x.size(0)
    model = build_model(args.workload, x.size(1), C, args.edge_dim, ei, N)
    ref = copy.deepcopy(model)
    # by keyword: PyG's BasicGNN models take edge_weight third, edge_attr after it
    kwargs = {} if args.workload == "EdgeCNN" else {"edge_attr": ea}
    run = wrap(model, args.variant)
    opt = torch.optim.Adam(model.parameters(), lr=1e-3)

    def step():
        opt.zero_grad(set_to_none=True)
        out = run(x, ei, **kwargs)
        loss = torch.nn.functional.cross_entropy(out, y)
        loss.backward()
        opt.step()
        return out, loss

    with torch.no_grad():  # the eager reference, same parameters, before any optimizer step
        expect = ref(x, ei, **kwargs)
        expect_loss = torch.nn.functional.cross_entropy(expect, y)
    del ref
    t0 = time.perf_counter()
    out, loss = step()
    first = time.perf_counter() - t0
    res = _check(args.variant, out, loss, expect, expect_loss)
    del out, loss, expect
    for _ in range(args.warmup):
        step()
    guard_steps = _common.step_past_guard(run, step)  # past the speed guard's races: time the form it kept
    peak = _common.read_peak_rss_delta(step) if args.measure in ("peak", "both") else None
    if args.measure == "peak":
        return {"peak_bytes": peak}
    t = _common.timeit(step, args.repeats, warmup=0)
    res.update({"median_s": t["median"], "min_s": t["min"], "max_s": t["max"], "first_step_s": first,
                "peak_bytes": peak, "N": N, "E": int(ei.size(1)), "guard_steps": guard_steps,
                "guard": [str(d) for d in run.guard_decisions()] if hasattr(run, "guard_decisions") else [],
                "edge_dim": 0 if args.workload == "EdgeCNN" else args.edge_dim})
    res.update(_compile_counts(args.variant, run, counters, stats0))
    return res


def _molecule_run(args, counters, stats0) -> dict:
    batches = molecule_batches(args.molecule_batches, args.batch_size, args.edge_dim)
    model = build_model("molecules", MOL_F, MOL_C, args.edge_dim)
    ref = copy.deepcopy(model)
    run = wrap(model, args.variant)
    opt = torch.optim.Adam(model.parameters(), lr=1e-3)

    def fwd(m, b):
        out = m(b.x, b.edge_index, b.edge_attr, b.batch, b.num_graphs)
        return out, torch.nn.functional.cross_entropy(out, b.y)

    def step(b):
        opt.zero_grad(set_to_none=True)
        out, loss = fwd(run, b)
        loss.backward()
        opt.step()
        return out, loss

    with torch.no_grad():
        expect, expect_loss = fwd(ref, batches[0])
    del ref
    t0 = time.perf_counter()
    out, loss = step(batches[0])
    first = time.perf_counter() - t0
    res = _check(args.variant, out, loss, expect, expect_loss)
    for b in batches[1:]:  # the rest of the warm-up pass: recompilation for other sizes happens here
        step(b)
    warmup_s = time.perf_counter() - t0
    graphs_after_warmup = counters["stats"]["unique_graphs"]

    def epoch():
        for b in batches:
            step(b)

    peak = _common.read_peak_rss_delta(epoch) if args.measure in ("peak", "both") else None
    if args.measure == "peak":
        return {"peak_bytes": peak}
    step_times, epoch_times = [], []
    for _ in range(args.repeats):
        t0 = time.perf_counter()
        for b in batches:
            t1 = time.perf_counter()
            step(b)
            step_times.append(time.perf_counter() - t1)
        epoch_times.append(time.perf_counter() - t0)
    nodes = [b.num_nodes for b in batches]
    edges = [b.num_edges for b in batches]
    res.update({"median_s": statistics.median(step_times), "min_s": min(step_times), "max_s": max(step_times),
                "epoch_s": statistics.median(epoch_times), "epoch_times_s": epoch_times,
                "first_step_s": first, "warmup_s": warmup_s, "peak_bytes": peak,
                "batches": len(batches), "graphs_per_batch": args.batch_size,
                "nodes_per_batch_mean": sum(nodes) / len(nodes), "edges_per_batch_mean": sum(edges) / len(edges),
                "edge_dim": args.edge_dim})
    res.update(_compile_counts(args.variant, run, counters, stats0))
    if args.variant != "eager":
        res["recompiles_in_epochs"] = counters["stats"]["unique_graphs"] - graphs_after_warmup
    return res


def child(args) -> dict:
    """One workload / variant in this process: its result, or {"error": ...} for a Python error.
    Leaves the process as it found it (thread count; Dynamo reset afterwards)."""
    from torch._dynamo.utils import counters

    from gnncompile.compiler import STATS

    threads = torch.get_num_threads()
    torch.set_num_threads(args.threads)
    counters.clear()
    stats0 = dict(STATS)
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            res = (_molecule_run if args.workload == "molecules" else _node_run)(args, counters, stats0)
        res["threads"] = torch.get_num_threads()
        return res
    except Exception as e:  # reported in the results; the driver goes on with the next variant
        tb = traceback.format_exc().strip().splitlines()
        return {"error": f"{type(e).__name__}: {e}".splitlines()[0][:500], "traceback_tail": tb[-6:]}
    finally:
        torch._dynamo.reset()
        torch.set_num_threads(threads)


# ----------------------------------------------------------------------------- driver
def run_one(workload: str, graph: str, variant: str, opts) -> dict:
    """``variant`` of ``workload`` in a fresh process (or in this one with --in-process)."""
    if opts.in_process:
        return child(argparse.Namespace(**{**vars(opts), "workload": workload, "variant": variant, "measure": "both",
                                           "nodes": None if workload == "molecules" else int(graph)}))
    cmd = _common.module_command("messages") + ["--child", "--workload", workload, "--variant", variant,
           "--repeats", str(opts.repeats), "--warmup", str(opts.warmup), "--threads", str(opts.threads),
           "--features", str(opts.features), "--edge-dim", str(opts.edge_dim),
           "--molecule-batches", str(opts.molecule_batches), "--batch-size", str(opts.batch_size)]
    if workload != "molecules":
        cmd += ["--nodes", graph]
    out = _common.run_child(cmd + ["--measure", "time"], _common.timing_env(opts.threads), opts.timeout)
    if "median_s" in out:  # the peak in a child of its own, under read_peak_rss_delta's condition
        peak = _common.run_child(cmd + ["--measure", "peak"], _common.isolated_env(opts.threads), opts.timeout)
        out["peak_bytes"] = peak.get("peak_bytes")
        if "peak_bytes" not in peak:
            out["peak_error"] = peak.get("error", "no peak")
    return out


def _ratio(R: dict, num: str, den: str = "gnncompile"):
    a, b = R.get(num, {}), R.get(den, {})
    return a["median_s"] / b["median_s"] if "median_s" in a and "median_s" in b else None


def _mib(b, digits: int = 1) -> str:
    """A peak in MiB ('n/a' where its measurement failed)."""
    return "n/a" if b is None else f"{max(b, 0) / 2**20:.{digits}f}"


def _line(r: dict) -> str:
    if "median_s" not in r:
        return "error: " + r.get("error", "?")
    s = (f"{r['median_s'] * 1e3:9.1f} ms  first {r['first_step_s']:.2f} s  "
         f"peak {_mib(r.get('peak_bytes')):>8} MiB  rel err {r['rel_err']:.1e}")
    if "fused_ops" in r:
        s += f"  fused {r['fused_ops']}"
    if "graph_breaks" in r:
        s += f"  breaks {r['graph_breaks']}"
    return s


def main(argv=None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true",
                    help="tiny sizes: 1000 nodes, 4 batches of 32 graphs, 3 repeats; in-process")
    ap.add_argument("--models", default=",".join(DEFAULT_WORKLOADS),
                    help=f"comma list of {', '.join(WORKLOADS)} (default {','.join(DEFAULT_WORKLOADS)})")
    ap.add_argument("--graphs", default=None,
                    help="comma list of node counts for the node-level workloads, edges = 10 N (default 100000, quick 1000)")
    ap.add_argument("--variants", default=",".join(VARIANTS[:3]), help="comma list of " + ", ".join(VARIANTS))
    ap.add_argument("--repeats", type=int, default=None,
                    help="timed steps (node level) and timed epochs (molecules); default 7, quick 3")
    ap.add_argument("--warmup", type=int, default=2, help="node level: untimed steps after the first")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--features", type=int, default=128, help="node features (node level)")
    ap.add_argument("--edge-dim", type=int, default=16, help="edge feature width (all but EdgeCNN)")
    ap.add_argument("--molecule-batches", type=int, default=None, help="batches per epoch (default 20, quick 4)")
    ap.add_argument("--batch-size", type=int, default=None, help="graphs per batch (default 128, quick 32)")
    ap.add_argument("--in-process", action="store_true",
                    help="all variants in this process, one after another (implied by --quick)")
    ap.add_argument("--timeout", type=int, default=1800, help="seconds per variant process")
    ap.add_argument("--out", default=None, help="results name (default messages, quick messages_quick)")
    ap.add_argument("--results-dir", default=str(_common.RESULTS))
    # child mode
    ap.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--workload", help=argparse.SUPPRESS)
    ap.add_argument("--variant", help=argparse.SUPPRESS)
    ap.add_argument("--nodes", type=int, help=argparse.SUPPRESS)
    ap.add_argument("--measure", choices=("time", "peak", "both"), default="both", help=argparse.SUPPRESS)
    opts = ap.parse_args(argv)
    if opts.repeats is None:
        opts.repeats = 3 if opts.quick else 7
    if opts.molecule_batches is None:
        opts.molecule_batches = 4 if opts.quick else 20
    if opts.batch_size is None:
        opts.batch_size = 32 if opts.quick else 128
    opts.in_process = opts.in_process or opts.quick
    if opts.child:
        out = child(opts)
        print("RESULT " + json.dumps(out), flush=True)
        return out

    workloads = [w.strip() for w in opts.models.split(",") if w.strip()]
    variants = [v.strip() for v in opts.variants.split(",") if v.strip()]
    bad = [w for w in workloads if w not in WORKLOADS] + [v for v in variants if v not in VARIANTS]
    if bad:
        ap.error(f"unknown workloads / variants {bad}; known: {', '.join(WORKLOADS)} / {', '.join(VARIANTS)}")
    graphs = [g.strip() for g in (opts.graphs or ("1000" if opts.quick else "100000")).split(",") if g.strip()]
    if any(not g.isdigit() or int(g) <= 0 for g in graphs):
        ap.error(f"--graphs takes positive node counts, got {opts.graphs!r}")
    from gnncompile import config as _cfg
    from gnncompile.compiler import backend as _be

    load_before = _common.loadavg()
    rows = []
    for w in workloads:
        for graph in (graphs if w in NODE_WORKLOADS else [f"{opts.molecule_batches}x{opts.batch_size}"]):
            row = {"workload": w, "graph": graph, "results": {}}
            for v in variants:
                r = run_one(w, graph, v, opts)
                row["results"][v] = r
                print(f"{w:<10} {graph:>8} {v:<11} {_line(r)}", flush=True)
            row["eager_over_gnncompile"] = _ratio(row["results"], "eager")
            row["inductor_over_gnncompile"] = _ratio(row["results"], "inductor")
            rows.append(row)
    payload = {"machine": _common.machine(), "loadavg_before_after": [load_before, _common.loadavg()],
               "variants": variants, "workloads": workloads, "repeats": opts.repeats, "warmup": opts.warmup,
               "threads": opts.threads, "in_process": opts.in_process, "features": opts.features, "hidden": HIDDEN, "edge_dim": opts.edge_dim,
               "molecules": {"batches": opts.molecule_batches, "batch_size": opts.batch_size,
                             "features": MOL_F, "hidden": MOL_HIDDEN, "layers": MOL_LAYERS, "classes": MOL_C},
               "tolerances": {"output": OUT_TOL, "loss": LOSS_TOL},
               "inner": (_cfg.current().inner or
                         f"auto (the device profile's inner where it names one, else eager below "
                         f"{_be.AUTO_INDUCTOR_MIN_SIZE} nodes + edges, inductor above)"),
               "rows": rows,
               "command": _common.command("messages", argv)}
    name = opts.out or ("messages_quick" if opts.quick else "messages")
    _common.write_results(Path(opts.results_dir), name, payload, markdown, plot)
    return payload


# ----------------------------------------------------------------------------- report
def _ms(r: dict) -> str:
    return f"{r['median_s'] * 1e3:.1f}" if "median_s" in r else "error"


def _graph_label(row: dict, p: dict) -> str:
    if row["workload"] == "molecules":
        return f"{p['molecules']['batches']} batches x {p['molecules']['batch_size']} graphs"
    return f"{int(row['graph']):,} / {10 * int(row['graph']):,}".replace(",", " ")


def markdown(p: dict) -> str:
    vs = p["variants"]
    head = (["workload", "nodes / edges"] + [f"{v} ms" for v in vs]
            + ["eager / gnncompile", "inductor / gnncompile", "first step s (" + " / ".join(vs) + ")",
               "peak MiB (" + " / ".join(vs) + ")", "fused ops (gnncompile)"])
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    notes = []
    for row in p["rows"]:
        R = row["results"]

        def each(key, fmt):
            return " / ".join(fmt(R[v][key]) if key in R.get(v, {}) else "-" for v in vs)

        ratio = [f"{x:.2f}x" if x is not None else "n/a"
                 for x in (row.get("eager_over_gnncompile"), row.get("inductor_over_gnncompile"))]
        g = R.get("gnncompile", {})
        cells = ([row["workload"], _graph_label(row, p)] + [_ms(R.get(v, {})) for v in vs] + ratio
                 + [each("first_step_s", lambda s: f"{s:.2f}"), each("peak_bytes", lambda b: _mib(b, 0)),
                    str(g["fused_ops"]) if "fused_ops" in g else "n/a"])
        lines.append("| " + " | ".join(cells) + " |")
        for v in vs:
            r = R.get(v, {})
            if "error" in r:
                notes.append(f"- {row['workload']} ({row['graph']}), {v}: {r['error']}")
        if row["workload"] == "molecules":
            e = next((r for r in R.values() if "nodes_per_batch_mean" in r), None)
            if e is not None:
                notes.append(f"- molecules: {e['nodes_per_batch_mean']:.0f} nodes / {e['edges_per_batch_mean']:.0f} "
                             f"directed edges per batch (mean)")
            notes.append(f"- molecules: median epoch s ({' / '.join(vs)}): {each('epoch_s', lambda s: f'{s:.2f}')}; "
                         f"warm-up pass s: {each('warmup_s', lambda s: f'{s:.2f}')}; recompiles in timed epochs: "
                         f"{each('recompiles_in_epochs', str)}")
    m, mol = p["machine"], p["molecules"]
    lines += ["", f"Median training-step time (forward, cross-entropy, backward, Adam) over {p['repeats']} "
              f"steps (node level; molecules: every step of {p['repeats']} epochs), {p['threads']} threads, "
              f"torch {m['torch']}. Node level: power-law graphs, F = {p['features']}, hidden {p['hidden']}, "
              f"edge features {p['edge_dim']} (none for EdgeCNN). molecules: {mol['layers']} x GINEConv "
              f"({mol['features']} -> {mol['hidden']}) + global_add_pool + Linear, {mol['batches']} batches of "
              f"{mol['batch_size']} graphs of 10-40 nodes. Ratios: peer time / gnncompile time (> 1 means "
              f"gnncompile is faster). First step includes compilation. Every variant's first-step output and "
              f"loss agreed with eager (relative {p['tolerances']['output']:g} / {p['tolerances']['loss']:g}) "
              f"unless an error is noted. gnncompile inner compiler: {p['inner']}. "
              f"{'One process (peak memory indicative only)' if p['in_process'] else 'A process per variant'}. "
              f"{_common.load_text(p['loadavg_before_after'])}. "
              f"Command: `{p['command']}`"]
    if notes:
        lines += [""] + notes
    return "\n".join(lines) + "\n"


def plot(p: dict, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    vs = p["variants"]
    labels = [f"{r['workload']}\n{_graph_label(r, p)}" for r in p["rows"]]
    fig, ax = plt.subplots(figsize=(max(6, 1.9 * len(labels)), 4))
    w = 0.8 / len(vs)
    for i, v in enumerate(vs):
        ys = [(_ratio(r["results"], "eager", v) or 0) for r in p["rows"]]
        xs = [j + i * w for j in range(len(labels))]
        ax.bar(xs, ys, w, label=v)
        for x, y in zip(xs, ys):
            ax.text(x, y, f"{y:.2f}" if y else "err", ha="center", va="bottom", fontsize=7)
    ax.set_xticks([j + 0.4 - w / 2 for j in range(len(labels))])
    ax.set_xticklabels(labels, fontsize=8)
    ax.set_ylabel("speed-up over PyG eager (training step)")
    ax.axhline(1, color="k", lw=0.5)
    ax.legend(fontsize=8)
    ax.set_title(f"Edge features / non-trivial messages, {p['threads']} threads", fontsize=9)
    fig.tight_layout()
    fig.savefig(path, dpi=120)


if __name__ == "__main__":
    main()
