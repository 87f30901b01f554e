"""``gnncompile demo``, the main job of `make demo`: on a graph gnncompile generates itself, a
short tuning run, then training a PyG model eagerly and compiled (same losses, the speedup,
the explain report), then an ONNX export checked in onnxruntime.

    gnncompile demo [--nodes 20000] [--degree 10] [--features 64] [--steps 10]
"""
from __future__ import annotations

import statistics
import sys
import time
import warnings


def _train(model, run, x, edge_index, y, steps: int):
    import torch

    opt = torch.optim.Adam(model.parameters(), lr=0.01)
    losses, times = [], []
    for _ in range(steps):
        t0 = time.perf_counter()
        opt.zero_grad()
        loss = torch.nn.functional.cross_entropy(run(x, edge_index), y)
        loss.backward()
        opt.step()
        times.append(time.perf_counter() - t0)
        losses.append(loss.item())
    return losses, times


def add_parser(sub) -> None:
    p = sub.add_parser("demo", help="train a model eagerly and compiled on a generated graph, then export it",
                       description=__doc__.split("\n\n")[0])
    p.add_argument("--nodes", type=int, default=20_000)
    p.add_argument("--degree", type=int, default=10, help="average in-degree")
    p.add_argument("--features", type=int, default=64)
    p.add_argument("--classes", type=int, default=8)
    p.add_argument("--steps", type=int, default=10)
    p.add_argument("--model", choices=("GCN", "GraphSAGE", "GIN", "GAT"), default="GraphSAGE")
    p.add_argument("--out", default="demo_output", help="folder for the profile and the exported model")
    p.add_argument("--no-tune", dest="tune", action="store_false", help="skip the short tuning run")


def _workload(args):
    """(x, edge_index, y) of the generated graph, after printing what runs on what."""
    import torch

    import gnncompile
    from gnncompile.data.synthetic import power_law_graph

    info = gnncompile.info()
    print(f"gnncompile {info['version']}, torch {info['torch']}, native kernels: {info['native']}, "
          f"CUDA kernels: {info['cuda_kernels']}")
    print(f"device: {info['device']}")
    N, E, F, C = args.nodes, args.nodes * args.degree, args.features, args.classes
    edge_index = power_law_graph(N, E, seed=0)
    g = torch.Generator().manual_seed(0)
    x = torch.randn(N, F, generator=g)
    y = torch.randint(0, C, (N,), generator=g)
    print(f"workload: 2-layer {args.model}, hidden 64, on a generated power-law graph of "
          f"{N:,} nodes and {E:,} edges, {F} features, {args.steps} training steps\n")
    return x, edge_index, y


def run(args) -> int:
    import torch

    import gnncompile

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        from torch_geometric.nn import models

    x, edge_index, y = _workload(args)

    def make():
        torch.manual_seed(0)
        F, C = args.features, args.classes
        if args.model == "GAT":
            return models.GAT(F, 64, 2, C, heads=4)
        return getattr(models, args.model)(F, 64, 2, C)

    profile = _tune(args) if args.tune else None
    eager_model = make()
    eager_losses, eager_times = _train(eager_model, eager_model, x, edge_index, y, args.steps)
    model = make()
    compiled = gnncompile.compile(model, profile=profile)
    losses, times = _train(model, compiled, x, edge_index, y, args.steps)

    worst = max(abs(a - b) / max(abs(a), 1e-6) for a, b in zip(eager_losses, losses))
    print(f"loss eager    {eager_losses[0]:.4f} -> {eager_losses[-1]:.4f}")
    print(f"loss compiled {losses[0]:.4f} -> {losses[-1]:.4f}   (largest relative difference "
          f"over all steps: {worst:.1e})")
    if worst > 1e-3:
        print("ERROR: compiled and eager training disagree")
        return 1
    # Medians over the steps after the first (which includes compilation for gnncompile).
    te = statistics.median(eager_times[1:])
    tc = statistics.median(times[1:])
    print(f"\nmedian step: eager {te * 1e3:.1f} ms, gnncompile {tc * 1e3:.1f} ms  ->  "
          f"speedup {te / tc:.2f}x   (first compiled step, with compilation: {times[0]:.2f} s)\n")
    # the compiled model's own settings (the profile's knobs), run once more to report
    print(gnncompile.explain(compiled, x, edge_index))
    return _export_and_check(model, x, edge_index, args.out)


def _tune(args):
    """A short tuning run (well under a minute) of this workload on this device; returns the
    path of the profile it wrote, which compile() then applies. The tuner is optional: without
    optuna this step is skipped."""
    import json
    import os
    import subprocess

    from gnncompile import profiles

    try:
        import optuna  # noqa: F401
    except ImportError:
        print("(optuna not installed: tuning step skipped, compile uses the device defaults)\n")
        return None
    out = os.path.join(args.out, "profiles")
    os.makedirs(out, exist_ok=True)
    cmd = [sys.executable, "-m", "gnncompile.cli", "tune", "--workload", "fullgraph",
           "--model", {"GraphSAGE": "sage"}.get(args.model, args.model.lower()),
           "--trials", "4", "--timeout", "45", "--num-nodes", str(args.nodes // 4),
           "--num-edges", str(args.nodes // 4 * args.degree), "--num-features", str(args.features),
           "--steps", "5", "--warmup", "2", "--confirm-top", "1", "--no-progress", "--out", out,
           "--storage", "sqlite:///" + os.path.abspath(os.path.join(out, "demo_study.db"))]
    print("tuning: " + " ".join(cmd[1:]))
    r = subprocess.run(cmd, capture_output=True, text=True)
    if r.returncode != 0:
        print(f"tuning failed (exit {r.returncode}); compile uses the device defaults\n{r.stderr[-2000:]}")
        return None
    summary = json.loads(r.stdout[r.stdout.index("{"):])
    path = summary["profile"]
    try:
        doc = profiles.read(path)
    except profiles.ProfileError as e:
        print(f"tuning wrote an unusable profile ({e}); compile uses the device defaults\n")
        return None
    print(f"profile written: {path}")
    print(f"  settings: {doc['settings']}")
    print(f"  chosen: {doc.get('study', {}).get('chosen')}; measured {doc.get('throughput')}\n")
    return path


def _export_and_check(model, x, edge_index, out_dir: str) -> int:
    """Exports the trained model to ONNX (fused ops as functions) and checks it in onnxruntime
    on a graph of another size than the export example."""
    import os

    import torch

    import gnncompile
    from gnncompile.data.synthetic import power_law_graph

    try:
        import onnxruntime as ort
    except ImportError:
        print("\n(onnxruntime not installed: export step skipped)")
        return 0
    os.makedirs(out_dir, exist_ok=True)
    path = os.path.join(out_dir, "demo_model.onnx")
    n_ex = 2000
    ex_ei = power_law_graph(n_ex, n_ex * 5, seed=1)
    gnncompile.export(model, (x[:n_ex], ex_ei), path, format="onnx")
    model.eval()
    n_run = 3000  # another size than the example, with some isolated nodes
    ei = power_law_graph(n_run - 100, (n_run - 100) * 4, seed=2)
    xr = x[:n_run]
    with torch.no_grad():
        expected = model(xr, ei)
    sess = ort.InferenceSession(path, providers=["CPUExecutionProvider"])
    names = [i.name for i in sess.get_inputs()]
    got = sess.run(None, dict(zip(names, (xr.numpy(), ei.numpy()))))[0]
    err = (torch.from_numpy(got) - expected).abs().max().item()
    import onnx

    funcs = sorted({f"{f.domain}::{f.name}" for f in onnx.load(path).functions})
    print(f"\nexported the trained model to {path} ({os.path.getsize(path) / 1024:.1f} KiB); "
          f"ONNX functions: {', '.join(funcs)}")
    print(f"onnxruntime on a {n_run:,}-node graph (export example: {n_ex:,} nodes): "
          f"max |onnxruntime - eager| = {err:.2e}")
    if err > 1e-4:
        print("ERROR: the exported model disagrees with eager")
        return 1
    return 0
