"""Exported models: ONNX file size and onnxruntime latency next to eager PyTorch.

For each model of tests/export/test_export.py (GCN, GraphSAGE mean / max, GIN, GAT, GATv2, from
torch_geometric.nn.models): export with gnncompile.export on a small example graph, then run the
ONNX file in onnxruntime (CPU) and the eager model on the *same* benchmark graph (a generated
power-law graph of another size), check they agree (1e-4), and time both (median of repeats,
inference, no grad). Also the size of the pt2 program.

    python -m benchmarks export [--nodes 5000 --edges 50000 --features 32 --repeats 20]

Writes benchmarks/results/export.{json,md}.
"""
from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import warnings
from pathlib import Path

import gnncompile

import torch

from . import _common


def _models(F: int):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        from torch_geometric.nn import models

    H = 64
    return {
        "GCN": lambda: models.GCN(F, H, 2, 16),
        "GraphSAGE-mean": lambda: models.GraphSAGE(F, H, 2, 16),
        "GraphSAGE-max": lambda: models.GraphSAGE(F, H, 2, 16, aggr="max"),
        "GIN": lambda: models.GIN(F, H, 2, 16),
        "GAT": lambda: models.GAT(F, H // 4, 2, 16, heads=4),
        "GATv2": lambda: models.GAT(F, H // 4, 2, 16, heads=4, v2=True),
    }


def main(argv=None) -> int:
    import onnxruntime as ort

    from gnncompile.data.synthetic import power_law_graph

    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--nodes", type=int, default=5000)
    p.add_argument("--edges", type=int, default=50000)
    p.add_argument("--features", type=int, default=32)
    p.add_argument("--repeats", type=int, default=20)
    p.add_argument("--out", default=str(_common.RESULTS / "export"))
    a = p.parse_args(argv)

    F = a.features
    g = torch.Generator().manual_seed(0)
    example = (torch.randn(64, F, generator=g), power_law_graph(64, 256, seed=1))
    x = torch.randn(a.nodes, F, generator=g)
    ei = power_law_graph(a.nodes, a.edges, seed=2)
    so = ort.SessionOptions()
    so.log_severity_level = 3
    so.intra_op_num_threads = torch.get_num_threads()
    rows = []
    tmp = Path(tempfile.mkdtemp())
    for name, make in _models(F).items():
        torch.manual_seed(0)
        model = make().eval()
        onnx_path, pt2_path = tmp / f"{name}.onnx", tmp / f"{name}.pt2"
        res = gnncompile.export(model, example, onnx_path)
        gnncompile.export(model, example, pt2_path, format="pt2")
        sess = ort.InferenceSession(str(onnx_path), so, providers=["CPUExecutionProvider"])
        feed = {sess.get_inputs()[0].name: x.numpy(), sess.get_inputs()[1].name: ei.numpy()}
        with torch.no_grad():
            ref = model(x, ei)
        out = torch.from_numpy(sess.run(None, feed)[0])
        err = float((out - ref).abs().max())
        if not torch.allclose(out, ref, rtol=1e-4, atol=1e-4):
            raise SystemExit(f"{name}: onnxruntime and eager disagree (max abs diff {err:.3g})")

        def eager():
            with torch.no_grad():
                model(x, ei)

        # alternate the two, one call each per round, so that load from other processes on a
        # shared machine hits both alike
        t_eager, t_ort = {"median": []}, {"median": []}
        for r in range(a.repeats + 2):
            te = _common.timeit(eager, 1, warmup=0)["median"]
            to = _common.timeit(lambda: sess.run(None, feed), 1, warmup=0)["median"]
            if r >= 2:  # warm-up rounds
                t_eager["median"].append(te)
                t_ort["median"].append(to)
        t_eager["median"] = statistics.median(t_eager["median"])
        t_ort["median"] = statistics.median(t_ort["median"])
        row = {
            "model": name, "onnx_bytes": onnx_path.stat().st_size, "pt2_bytes": pt2_path.stat().st_size,
            "onnx_functions": res.onnx_functions, "fused": res.num_fused, "max_abs_diff": err,
            "eager_ms": t_eager["median"] * 1e3, "ort_ms": t_ort["median"] * 1e3,
        }
        rows.append(row)
        print(f"{name:<15} onnx {row['onnx_bytes'] / 1024:7.1f} KiB  pt2 {row['pt2_bytes'] / 1024:7.1f} KiB  "
              f"eager {row['eager_ms']:8.2f} ms  onnxruntime {row['ort_ms']:8.2f} ms  "
              f"(x{row['eager_ms'] / row['ort_ms']:.2f})  max|diff| {err:.1e}", flush=True)

    payload = {"machine": _common.machine(), "onnxruntime": ort.__version__,
               "graph": {"nodes": a.nodes, "edges": a.edges, "features": F, "generator": "power_law_graph"},
               "example": {"nodes": 64, "edges": 256}, "repeats": a.repeats, "rows": rows,
               "command": _common.command("export", argv)}
    out = Path(a.out)
    _common.write_results(out.parent, out.stem, payload, markdown)
    print(f"wrote {out.with_suffix('.md')}")
    return 0


def markdown(p: dict) -> str:
    g = p["graph"]
    lines = [
        "# Exported models: file size and latency",
        "",
        f"Inference on a generated power-law graph of {g['nodes']} nodes, {g['edges']} edges, {g['features']} "
        f"features (exported on a 64-node example); median of {p['repeats']} runs, eager and onnxruntime "
        f"alternating; torch threads = onnxruntime "
        f"intra-op threads = {p['machine']['threads']}; onnxruntime {p['onnxruntime']}, CPU provider.",
        "Outputs agree within 1e-4 before timing.",
        "",
        "| model | ONNX size | pt2 size | fused ops | eager PyTorch | onnxruntime | eager / ort |",
        "|---|---:|---:|---:|---:|---:|---:|",
    ]
    for r in p["rows"]:
        lines.append(f"| {r['model']} | {r['onnx_bytes'] / 1024:.1f} KiB | {r['pt2_bytes'] / 1024:.1f} KiB | "
                     f"{r['fused']} | {r['eager_ms']:.2f} ms | {r['ort_ms']:.2f} ms | "
                     f"{r['eager_ms'] / r['ort_ms']:.2f} |")
    lines += ["", f"Command: `{p['command']}`", ""]
    return "\n".join(lines)


if __name__ == "__main__":
    sys.exit(main())
