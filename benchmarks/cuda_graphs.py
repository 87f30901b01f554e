"""GPU benchmark of training steps replayed as CUDA graphs (GraphedStep) on padded batches.

    python -m benchmarks cuda_graphs --out OUTDIR [--graphs 1280 --batch-size 128 --budget 30]

Molecule-sized graph classification (gnncompile.data.synthetic.graph_dataset: 10-40 nodes,
average degree 2.2, 32 features, 3 classes), batches of --batch-size graphs, PyG GIN and GINE
(edge_dim 8) with 3 layers of width 64, global_add_pool (size given), cross-entropy, Adam
(capturable=True for every variant, so all run the same optimizer math). Per model, three
variants, each on its own copy of the same initial model, interleaved epoch by epoch:

  * plain          the usual step on the unpadded batches;
  * plain-padded   the usual step on the batches padded by PooledLoader(pad_to_buckets=3);
  * graphed        gnncompile.cuda_graphs.GraphedStep on the padded batches (one capture per
                   bucket, in its first epoch, not timed).

The batches are built once and kept on the GPU (the loader is not timed). A time is one epoch
of steps launched back to back, then one synchronize, divided by the steps (ms per step); the
median over the epochs the --budget allows (at least 3). Checked before timing: the first
epoch's losses of plain-padded and graphed agree (max relative difference reported) and the
first loss of plain and plain-padded agree. Writes cuda_graphs.json and cuda_graphs.txt to
OUTDIR. Needs a CUDA device (``--device cpu`` runs the same code with GraphedStep's plain step:
a check of the script, not a measurement of CUDA graphs).
"""
from __future__ import annotations

import argparse
import copy
import json
import os
import statistics
import time
import warnings

import torch
import torch.nn.functional as F


def _models(edge_dim: int, classes: int = 3):
    """Three GIN (``edge_dim`` 0) or GINE layers 32 -> 64, ReLU, sum pool, a linear head (also benchmarks.padding's)."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        from torch_geometric.nn import GINConv, GINEConv, global_add_pool

    class Net(torch.nn.Module):
        def __init__(self):
            super().__init__()
            mlp = lambda i, o: torch.nn.Sequential(torch.nn.Linear(i, o), torch.nn.ReLU(), torch.nn.Linear(o, o))
            dims = [32, 64, 64, 64]
            self.convs = torch.nn.ModuleList(
                [GINEConv(mlp(a, b), edge_dim=edge_dim) if edge_dim else GINConv(mlp(a, b))
                 for a, b in zip(dims, dims[1:])])
            self.head = torch.nn.Linear(64, classes)

        def forward(self, b):
            h = b.x
            for c in self.convs:
                h = (c(h, b.edge_index, b.edge_attr) if edge_dim else c(h, b.edge_index)).relu()
            return self.head(global_add_pool(h, b.batch, size=b.num_graphs))

    return Net()


def _loss(m, b):
    return F.cross_entropy(m(b), b.y, ignore_index=-100)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", required=True)
    ap.add_argument("--graphs", type=int, default=1280)
    ap.add_argument("--batch-size", type=int, default=128)
    ap.add_argument("--buckets", type=int, default=3)
    ap.add_argument("--budget", type=float, default=30.0, help="seconds for the timed epochs, all models")
    ap.add_argument("--device", default="cuda", choices=["cuda", "cpu"])
    args = ap.parse_args(argv)
    if args.device == "cuda" and not torch.cuda.is_available():
        print("cuda_graphs: needs a CUDA device")
        return 2
    from gnncompile.cuda_graphs import GraphedStep
    from gnncompile.data import PooledLoader, graph_dataset

    os.makedirs(args.out, exist_ok=True)
    dev = torch.device(args.device)
    sync = torch.cuda.synchronize if dev.type == "cuda" else (lambda: None)
    t_start = time.monotonic()
    results = {"device": torch.cuda.get_device_name(0) if dev.type == "cuda" else "cpu (script check)", "torch": torch.__version__, "graphs": args.graphs,
               "batch_size": args.batch_size, "models": {}}
    lines = [f"CUDA graphs (GraphedStep) vs plain steps, {results['device']}: {args.graphs} graphs of 10-40 nodes, "
             f"batches of {args.batch_size}, 3 layers of 64, Adam(capturable); ms per step, median of epochs"]
    models = ["GIN", "GINE"]
    for mi, name in enumerate(models):
        edge_dim = 8 if name == "GINE" else 0
        ds = graph_dataset(args.graphs, 10, 40, num_features=32, num_classes=3, avg_degree=2.2, seed=0)
        if edge_dim:
            g = torch.Generator().manual_seed(1)
            for d in ds:
                d.edge_attr = torch.randn(d.edge_index.size(1), edge_dim, generator=g)
        padded_loader = PooledLoader(ds, batch_size=args.batch_size, pad_to_buckets=args.buckets)
        padded = [b.clone().to(dev) for b in padded_loader]
        plain = [b.clone().to(dev) for b in PooledLoader(ds, batch_size=args.batch_size)]
        stats = padded_loader.padding_stats()
        torch.manual_seed(0)
        base = _models(edge_dim).to(dev)
        variants = {}
        for v in ("plain", "plain-padded", "graphed"):
            m = copy.deepcopy(base)
            opt = torch.optim.Adam(m.parameters(), lr=1e-3, capturable=dev.type == "cuda")
            if v == "graphed":
                fn = GraphedStep(m, opt, _loss)
            else:
                def fn(b, m=m, opt=opt):
                    opt.zero_grad(set_to_none=True)
                    loss = _loss(m, b)
                    loss.backward()
                    opt.step()
                    return loss.detach()
            variants[v] = (fn, plain if v == "plain" else padded)
        # first epoch: checks (and the captures)
        first = {v: torch.stack([fn(b) for b in bs]) for v, (fn, bs) in variants.items()}
        sync()
        rel = float(((first["graphed"] - first["plain-padded"]).abs() / first["plain-padded"].abs()).max())
        rel0 = float(abs(first["plain"][0] - first["plain-padded"][0]) / abs(first["plain"][0]))
        times = {v: [] for v in variants}
        share = args.budget / len(models)
        t_model = time.monotonic()
        while True:
            for v, (fn, bs) in variants.items():
                sync()
                t0 = time.perf_counter()
                for b in bs:
                    fn(b)
                sync()
                times[v].append((time.perf_counter() - t0) * 1e3 / len(bs))
            n = len(times["plain"])
            if n >= 3 and (time.monotonic() - t_model > share or n >= 50):
                break
        med = {v: statistics.median(t) for v, t in times.items()}
        results["models"][name] = {
            "ms_per_step": med, "times": times, "epochs": len(times["plain"]),
            "steps_per_epoch": len(plain), "captures": variants["graphed"][0].captures,
            "first_epoch_loss_max_rel_diff_graphed_vs_plain_padded": rel,
            "first_loss_rel_diff_padded_vs_unpadded": rel0, "padding": stats}
        lines.append(f"{name:5s} plain {med['plain']:.3f}  plain-padded {med['plain-padded']:.3f}  graphed "
                     f"{med['graphed']:.3f}  (x{med['plain'] / med['graphed']:.2f} vs plain); "
                     f"{results['models'][name]['captures']} graphs, {len(times['plain'])} epochs; "
                     f"loss rel diff graphed/padded {rel:.1e}, padded/unpadded {rel0:.1e}; padding overhead "
                     f"nodes {stats['node_overhead']:.1%} edges {stats['edge_overhead']:.1%}")
    results["seconds"] = time.monotonic() - t_start
    with open(os.path.join(args.out, "cuda_graphs.json"), "w") as f:
        json.dump(results, f, indent=1)
    with open(os.path.join(args.out, "cuda_graphs.txt"), "w") as f:
        f.write("\n".join(lines) + "\n")
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
