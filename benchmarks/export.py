"""Exported models: ONNX file size and onnxruntime latency next to eager PyTorch.

For each model of tests/export/test_export.py (GCN, GraphSAGE mean / max, GIN, GAT, GATv2, from
torch_geometric.nn.models) and of tests/export/test_export_programs.py (GINE: two GINEConv layers
with edge features, PNA with edge features, EdgeCNN: messages that fuse only as message
programs, exported as one ONNX function per distinct program): export with gnncompile.export on a
small example graph, then run the ONNX file in onnxruntime (CPU) and the eager model on the
*same* benchmark graph (a generated power-law graph of another size), check they agree (1e-4),
and time both (median of repeats, inference, no grad). Also the size of the pt2 program; for the
program models, onnxruntime on the export with ``programs=False`` (the messages as standard
ops) as well.

    python -m benchmarks export [--nodes 5000 --edges 50000 --features 32 --repeats 20] [--models GINE,PNA]

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


D = 8  # edge feature width of the models that read edge features


class _EdgeAttrKw(torch.nn.Module):
    """model(x, edge_index, edge_attr): PyG's PNA takes edge_attr by keyword."""

    def __init__(self, model):
        super().__init__()
        self.model = model

    def forward(self, x, edge_index, edge_attr):
        return self.model(x, edge_index, edge_attr=edge_attr)


class _GINE(torch.nn.Module):
    """Two GINEConv layers with edge features (edge_dim), ReLU between."""

    def __init__(self, F: int, H: int, out: int):
        super().__init__()
        from torch_geometric.nn import GINEConv

        def mlp(a, b):
            return torch.nn.Sequential(torch.nn.Linear(a, b), torch.nn.ReLU(), torch.nn.Linear(b, b))

        self.conv1 = GINEConv(mlp(F, H), edge_dim=D)
        self.conv2 = GINEConv(mlp(H, out), edge_dim=D)

    def forward(self, x, edge_index, edge_attr):
        return self.conv2(self.conv1(x, edge_index, edge_attr).relu(), edge_index, edge_attr)


# the models whose messages fuse only as message programs (and read edge features, but EdgeCNN)
PROGRAM_MODELS = {"GINE": True, "PNA": True, "EdgeCNN": False}


def _models(F: int, deg=None):
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
        "GINE": lambda: _GINE(F, H, 16),
        "PNA": lambda: _EdgeAttrKw(models.PNA(F, H, 2, 16, aggregators=["mean", "min", "max", "std"],
                                              scalers=["identity", "amplification", "attenuation"], deg=deg,
                                              edge_dim=D)),
        "EdgeCNN": lambda: models.EdgeCNN(F, H, 2, 16),
    }


def _time_pair(a, b, repeats: int):
    """Median seconds of ``a`` and ``b``, alternated one call each per round (2 warm-up rounds),
    so that load from other processes on a shared machine hits both alike."""
    ta, tb = [], []
    for r in range(repeats + 2):
        x = _common.timeit(a, 1, warmup=0)["median"]
        y = _common.timeit(b, 1, warmup=0)["median"]
        if r >= 2:
            ta.append(x)
            tb.append(y)
    return statistics.median(ta), statistics.median(tb)


def main(argv=None) -> int:
    import onnxruntime as ort

    from gnncompile.data.synthetic import power_law_graph

    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--nodes", type=int, default=5000)
    p.add_argument("--edges", type=int, default=50000)
    p.add_argument("--features", type=int, default=32)
    p.add_argument("--repeats", type=int, default=20)
    p.add_argument("--models", default="", help="comma-separated subset of the models (default: all)")
    p.add_argument("--out", default=str(_common.RESULTS / "export"))
    a = p.parse_args(argv)

    F = a.features
    g = torch.Generator().manual_seed(0)
    ex_ei = power_law_graph(64, 256, seed=1)
    x = torch.randn(a.nodes, F, generator=g)
    ei = power_law_graph(a.nodes, a.edges, seed=2)
    example = {False: (torch.randn(64, F, generator=g), ex_ei)}
    example[True] = example[False] + (torch.randn(ex_ei.size(1), D, generator=g),)
    bench = {False: (x, ei), True: (x, ei, torch.randn(ei.size(1), D, generator=g))}
    deg = torch.bincount(torch.bincount(ei[1], minlength=a.nodes))  # PNA's in-degree histogram
    so = ort.SessionOptions()
    so.log_severity_level = 3
    so.intra_op_num_threads = torch.get_num_threads()
    rows = []
    tmp = Path(tempfile.mkdtemp())
    chosen = [m for m in a.models.split(",") if m]
    load_before = _common.loadavg()
    for name, make in _models(F, deg).items():
        if chosen and name not in chosen:
            continue
        torch.manual_seed(0)
        model = make().eval()
        edge = PROGRAM_MODELS.get(name, False)
        ex, inputs = example[edge], bench[edge]
        onnx_path, pt2_path = tmp / f"{name}.onnx", tmp / f"{name}.pt2"
        res = gnncompile.export(model, ex, onnx_path)
        gnncompile.export(model, ex, pt2_path, format="pt2")
        sess = ort.InferenceSession(str(onnx_path), so, providers=["CPUExecutionProvider"])
        feed = {i.name: t.numpy() for i, t in zip(sess.get_inputs(), inputs)}
        with torch.no_grad():
            ref = model(*inputs)
        out = torch.from_numpy(sess.run(None, feed)[0])
        err = float((out - ref).abs().max())
        if not torch.allclose(out, ref, rtol=1e-4, atol=1e-4):
            raise SystemExit(f"{name}: onnxruntime and eager disagree (max abs diff {err:.3g})")

        def eager():
            with torch.no_grad():
                model(*inputs)

        t_eager, t_ort = _time_pair(eager, lambda: sess.run(None, feed), a.repeats)
        programs = sorted({f.split("::")[1] for f in res.onnx_functions if f.startswith("gnncompile::message_")})
        row = {
            "model": name, "onnx_bytes": onnx_path.stat().st_size, "pt2_bytes": pt2_path.stat().st_size,
            "onnx_functions": res.onnx_functions, "fused": res.num_fused, "max_abs_diff": err,
            "message_functions": len(programs),
            "fused_layers": sorted({f.layer for f in res.fused if f.kind != "degree"}),
            "eager_ms": t_eager * 1e3, "ort_ms": t_ort * 1e3,
        }
        if name in PROGRAM_MODELS:  # the same model exported without message programs
            plain_path = tmp / f"{name}.plain.onnx"
            gnncompile.export(model, ex, plain_path, programs=False)
            plain = ort.InferenceSession(str(plain_path), so, providers=["CPUExecutionProvider"])
            out = torch.from_numpy(plain.run(None, feed)[0])
            if not torch.allclose(out, ref, rtol=1e-4, atol=1e-4):
                raise SystemExit(f"{name} (programs=False): onnxruntime and eager disagree")
            t_prog, t_plain = _time_pair(lambda: sess.run(None, feed), lambda: plain.run(None, feed), a.repeats)
            row.update(onnx_plain_bytes=plain_path.stat().st_size, ort_ms_alternated_with_plain=t_prog * 1e3,
                       ort_plain_ms=t_plain * 1e3)
        rows.append(row)
        plain_text = (f"  onnxruntime without programs {row['ort_plain_ms']:8.2f} ms "
                      f"(vs {row['ort_ms_alternated_with_plain']:.2f})" if "ort_plain_ms" in row else "")
        print(f"{name:<15} onnx {row['onnx_bytes'] / 1024:7.1f} KiB  pt2 {row['pt2_bytes'] / 1024:7.1f} KiB  "
              f"eager {row['eager_ms']:8.2f} ms  onnxruntime {row['ort_ms']:8.2f} ms  "
              f"(x{row['eager_ms'] / row['ort_ms']:.2f})  max|diff| {err:.1e}{plain_text}", flush=True)

    payload = {"machine": _common.machine(), "onnxruntime": ort.__version__,
               "loadavg_before_after": [load_before, _common.loadavg()],
               "graph": {"nodes": a.nodes, "edges": a.edges, "features": F, "edge_features": D,
                         "generator": "power_law_graph"},
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
        f"features ({g.get('edge_features', 8)} edge features for GINE and PNA; exported on a 64-node example); "
        f"median of {p['repeats']} runs, eager and onnxruntime "
        f"alternating; torch threads = onnxruntime "
        f"intra-op threads = {p['machine']['threads']}; onnxruntime {p['onnxruntime']}, CPU provider.",
        "Outputs agree within 1e-4 before timing. Measured on a shared machine "
        f"({p['machine']['device']}; the load average below says how busy it was)"
        + (f"; {_common.load_text(p['loadavg_before_after'])}." if "loadavg_before_after" in p else "."),
        "",
        "GINE, PNA and EdgeCNN fuse only as message programs: their ONNX files hold one function of the "
        "`gnncompile` domain per distinct program (column *programs*). *without programs*: onnxruntime on the "
        "same model exported with `programs=False` (the messages as the standard ops they are written with), "
        "timed alternating with the file with programs (whose time in that pairing is in parentheses).",
        "",
        "| model | ONNX size | pt2 size | fused ops | programs | eager PyTorch | onnxruntime | eager / ort "
        "| onnxruntime without programs |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for r in p["rows"]:
        plain = (f"{r['ort_plain_ms']:.2f} ms ({r['ort_ms_alternated_with_plain']:.2f} ms)"
                 if "ort_plain_ms" in r else "")
        lines.append(f"| {r['model']} | {r['onnx_bytes'] / 1024:.1f} KiB | {r['pt2_bytes'] / 1024:.1f} KiB | "
                     f"{r['fused']} | {r.get('message_functions', 0)} | {r['eager_ms']:.2f} ms | "
                     f"{r['ort_ms']:.2f} ms | "
                     f"{r['eager_ms'] / r['ort_ms']:.2f} | {plain} |")
    lines += ["", "*fused ops*: fused message-passing chains (spmm, edge softmax, message programs; a reduction "
              "of a message computed beforehand, as EdgeCNN's max over its MLP's output, is a program too but "
              "not counted).", "", f"Command: `{p['command']}`", ""]
    return "\n".join(lines)


if __name__ == "__main__":
    sys.exit(main())
