"""The opt-in bf16 gathering of the fused spmm (choices['precision'] = 'bf16'): its speed and its effect on accuracy.

    python -m benchmarks bf16                      # nodes {100k, 500k, 1M} x F {64, 128}, Cora, a power-law task
    python -m benchmarks bf16 --nodes 100000 --features 128 --seeds 1

Speed. On power-law graphs of ``--degree`` x nodes edges (gnncompile.data.synthetic), the
spmm sum is called directly on the cached structure (its CSC given, as in a compiled graph),
forward and forward + backward (gradient of x), float32 against bf16 *including the casts*
(``x.to(bfloat16)`` before, ``.to(float32)`` after, as the rewrite inserts them); medians over
``--repeats`` calls, the two variants interleaved. Before timing, the bf16 output is checked to
be within bfloat16's rounding bound of the float32 one (2^-8 of the sum of |x| per element: x
rounded to 8 significant bits; the output is the float32 accumulator), and so is the gradient.
bf16 is ``gnncompile::spmm_bf16`` (what the rewrite inserts: it writes float32, no cast after);
"cast after" is the design it replaced, spmm over bfloat16 then ``.to(float32)``, timed alongside.
The bf16 op alone (features already bfloat16) and the casts alone are timed too. Then one training step (forward, cross
entropy, backward, Adam) of a 2-layer GCN compiled with gnncompile, fp32 against
``choices['precision'] = 'bf16'`` (``--gcn-nodes`` nodes, 10 edges per node, F = ``--gcn-features``;
both with the native spmm and the speed guard off, so that each runs what it was compiled to).

Accuracy. A 2-layer GCN (hidden 16, dropout 0.5, Adam lr 0.01, weight decay 5e-4,
``--epochs`` epochs) on Cora (the Planetoid files of ``--cora-raw``, copied to a temporary folder;
skipped with a message where absent), and a 2-layer GCN (hidden 64) on a power-law node
classification task whose labels come from a fixed random teacher GCN (``--synthetic-nodes``
nodes, half for training); each compiled fp32 and bf16, test accuracy at the last epoch over
``--seeds`` seeds (mean and spread, the same seeds and initial weights for both), and the
largest relative difference of one forward of the untrained model (max |bf16 - fp32| / max
|fp32|, over the output logits).

With ``--profile PROFILE.json`` (a tuning profile, e.g. one ``gnncompile tune --allow-bf16`` wrote)
the accuracy runs use that profile's compile settings (knobs, inner compiler, spmm implementation)
on both sides, fp32 against bf16, instead of the defaults with the eager inner compiler: the check
of a tuned setting's accuracy. ``--model sage`` trains 2-layer GraphSAGE (mean aggregation) in the
accuracy runs instead of GCN (the teacher stays a GCN). ``--name`` is the stem of the result files.

Writes benchmarks/results/bf16.{json,md,png}. The CPU's model and whether it has bfloat16
instructions (avx512_bf16 / amx_bf16) are recorded: without them every conversion is done in
software (shifts and rounding in the kernel, torch's conversion for the casts).
"""
from __future__ import annotations

import argparse
import shutil
import statistics
import subprocess
import sys
import tempfile
import warnings
from pathlib import Path
from typing import Dict, List, Optional

import torch
import torch.nn.functional as Fn

import gnncompile
from gnncompile.data.synthetic import power_law_graph
from gnncompile.ops import structure as S
from gnncompile.ops.schemas import ops

from . import _common

CORA_RAW = Path(__file__).resolve().parents[2] / "shared" / "data" / "planetoid" / "Cora" / "raw"
# bfloat16 rounding (2^-8 relative, to nearest) of x, float32 sums and output: the bound the
# benchmark checks before timing (tests/compiler/test_precision.py asserts the same)
BOUND = 2.0 ** -8 + 2.0 ** -12
SETTINGS = {"fp32": {"choices": {"guard": "off", "spmm_impl": "native"}},
            "bf16": {"choices": {"guard": "off", "spmm_impl": "native", "precision": "bf16"}}}


def cpu_record() -> dict:
    """lscpu's model name, family and model, and the bfloat16 instruction flags of /proc/cpuinfo."""
    rec = {"model_name": _common.cpu_model(), "family": None, "model": None}
    try:
        out = subprocess.run(["lscpu"], capture_output=True, text=True, timeout=10).stdout
        for line in out.splitlines():
            key, _, val = line.partition(":")
            key, val = key.strip(), val.strip()
            if key == "Model name":
                rec["model_name"] = val
            elif key == "CPU family":
                rec["family"] = val
            elif key == "Model":
                rec["model"] = val
    except (OSError, subprocess.SubprocessError):
        pass
    flags = set()
    try:
        for line in open("/proc/cpuinfo"):
            if line.startswith("flags"):
                flags = set(line.split(":", 1)[1].split())
                break
    except OSError:
        pass
    rec["bf16_flags"] = sorted(flags & {"avx512_bf16", "amx_bf16", "avx_ne_convert"})
    rec["avx2"], rec["avx512f"] = "avx2" in flags, "avx512f" in flags
    return rec


# ----------------------------------------------------------------------------- speed: the op
def op_point(N: int, F: int, degree: int, repeats: int) -> dict:
    E = N * degree
    ei = power_law_graph(N, E, seed=0)
    s = S.structure(ei, N)
    csr, csc = (s.rowptr, s.col, s.perm), tuple(s.transposed(N))
    g = torch.Generator().manual_seed(1)
    x = torch.randn(N, F, generator=g)
    go = torch.randn(N, F, generator=g)
    xb = x.to(torch.bfloat16)

    def spmm(v):
        return ops.spmm(*csr, None, v, "sum", [], *csc)[0]

    with torch.no_grad():
        y32, ybf = spmm(x), ops.spmm_bf16(*csr, None, x, x.to(torch.bfloat16), "sum", [], *csc)
        scale = spmm(x.abs())
        over = ((ybf - y32).abs() - BOUND * scale).max().item()
        rel = ((ybf - y32).abs() / scale.clamp(min=1e-30)).max().item()
    assert over <= 1e-6, f"bf16 outside the rounding bound at N={N} F={F}: {over}"
    xr = x.clone().requires_grad_()

    def bf16(v):  # what the rewrite inserts: the cast, then spmm_bf16 (float32 out)
        return ops.spmm_bf16(*csr, None, v, v.to(torch.bfloat16), "sum", [], *csc)

    def cast_after(v):  # the alternative measured against it: spmm over bfloat16, output cast
        return spmm(v.to(torch.bfloat16)).to(torch.float32)

    variants = {"fp32": spmm, "bf16": bf16, "cast": cast_after}

    def fwd_bwd(f):
        def run():
            xr.grad = None
            f(xr).backward(go)
            return xr.grad
        return run

    gb = fwd_bwd(bf16)().clone()  # bf16's backward is the transposed spmm_bf16: in the same bound
    g32 = fwd_bwd(spmm)().clone()
    with torch.no_grad():
        gscale = ops.spmm(*csc, None, go.abs(), "sum", [], *csr)[0]
    assert ((gb - g32).abs() - BOUND * gscale).max().item() <= 1e-6, f"bf16 gradient outside the bound at N={N} F={F}"
    out_bf = spmm(xb)
    fns = {}
    for k, f in variants.items():
        fns[f"fwd_{k}"] = (lambda f=f: f(x))
        fns[f"fb_{k}"] = fwd_bwd(f)
    fns.update({"op_bf16": lambda: ops.spmm_bf16(*csr, None, x, xb, "sum", [], *csc),
                "cast_in": lambda: x.to(torch.bfloat16), "cast_out": lambda: out_bf.to(torch.float32)})
    times: Dict[str, List[float]] = {k: [] for k in fns}
    for k, fn in fns.items():  # warm-up
        if k.startswith("fb"):
            fn()
        else:
            with torch.no_grad():
                fn()
    for _ in range(repeats):  # interleaved, so that a change of load hits every variant
        for k, fn in fns.items():
            if k.startswith("fb"):
                times[k].append(_common.timeit(fn, 1, warmup=0)["median"])
            else:
                with torch.no_grad():
                    times[k].append(_common.timeit(fn, 1, warmup=0)["median"])
    med = {k: statistics.median(v) for k, v in times.items()}
    return {"N": N, "E": E, "F": F, "max_rel_err_vs_abs_sum": rel, **{f"{k}_s": v for k, v in med.items()},
            "fwd_speedup": med["fwd_fp32"] / med["fwd_bf16"], "fb_speedup": med["fb_fp32"] / med["fb_bf16"],
            "fwd_speedup_cast_after": med["fwd_fp32"] / med["fwd_cast"],
            "fb_speedup_cast_after": med["fb_fp32"] / med["fb_cast"]}


# ----------------------------------------------------------------------------- models
class GCN(torch.nn.Module):
    def __init__(self, F: int, hidden: int, C: int, dropout: float = 0.5):
        super().__init__()
        from torch_geometric.nn import GCNConv

        self.c1, self.c2, self.dropout = GCNConv(F, hidden), GCNConv(hidden, C), dropout

    def forward(self, x, ei):
        x = Fn.dropout(x, self.dropout, self.training)
        x = self.c1(x, ei).relu()
        x = Fn.dropout(x, self.dropout, self.training)
        return self.c2(x, ei)


class SAGE(torch.nn.Module):
    """2-layer GraphSAGE (mean aggregation), as GCN above."""

    def __init__(self, F: int, hidden: int, C: int, dropout: float = 0.5):
        super().__init__()
        from torch_geometric.nn import SAGEConv

        self.c1, self.c2, self.dropout = SAGEConv(F, hidden), SAGEConv(hidden, C), dropout

    def forward(self, x, ei):
        x = Fn.dropout(x, self.dropout, self.training)
        x = self.c1(x, ei).relu()
        x = Fn.dropout(x, self.dropout, self.training)
        return self.c2(x, ei)


MODELS = {"gcn": GCN, "sage": SAGE}


def profile_settings(path: Path) -> dict:
    """The compile settings of a tuning profile that the accuracy runs apply on both sides: its
    knobs, inner compiler and spmm implementation, and the precision it chose (recorded only:
    each side sets its own)."""
    from gnncompile import profiles

    doc = profiles.read(path)
    st = doc.get("settings") if isinstance(doc, dict) else None
    if not isinstance(st, dict):
        raise ValueError(f"{path}: not a profile (no settings)")
    return {"path": str(path), "knobs": st.get("knobs"), "inner": st.get("inner"),
            "spmm_impl": st.get("spmm_impl"), "precision": st.get("precision"),
            "precision_rule": doc.get("precision_rule"), "workload": doc.get("workload")}


def settings_for(precision: str, inner: str = "auto", tuned: Optional[dict] = None) -> dict:
    """gnncompile.compile's settings: SETTINGS[precision], with a profile's knobs, inner compiler
    and spmm implementation where ``tuned`` (profile_settings) is given, else ``inner``."""
    s = {"choices": dict(SETTINGS[precision]["choices"])}
    if tuned is not None:
        inner = tuned.get("inner") or "auto"
        if tuned.get("spmm_impl"):
            s["choices"]["spmm_impl"] = tuned["spmm_impl"]
        if tuned.get("knobs") is not None:
            s["knobs"] = {"cpu": list(tuned["knobs"])}
    if inner != "auto":
        s["inner"] = inner
    return s


def _compile(model, precision: str, inner: str = "auto", tuned: Optional[dict] = None):
    torch._dynamo.reset()
    return gnncompile.compile(model, profile=None, settings=settings_for(precision, inner, tuned))


def _explain_gathers(compiled, *args) -> int:
    """How many spmm lines of explain() say they gather bf16 (the opt-in took effect)."""
    from gnncompile.passes.precision import GATHERS

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        rep = gnncompile.explain(compiled, *args)
    return sum(1 for f in rep.fused if f.precision == GATHERS)


def gcn_step(N: int, F: int, C: int, repeats: int, inner: str) -> dict:
    ei = power_law_graph(N, 10 * N, seed=0)
    g = torch.Generator().manual_seed(1)
    x = torch.randn(N, F, generator=g)
    y = torch.randint(0, C, (N,), generator=g)
    runs = {}
    for p in ("fp32", "bf16"):
        torch.manual_seed(0)
        model = GCN(F, F, C, dropout=0.0)
        compiled = _compile(model, p, inner)
        opt = torch.optim.Adam(model.parameters(), lr=0.01)

        def step(compiled=compiled, opt=opt):
            opt.zero_grad()
            loss = Fn.cross_entropy(compiled(x, ei), y)
            loss.backward()
            opt.step()
            return loss

        runs[p] = {"step": step, "first_loss": float(step().detach())}  # the first call compiles
        for _ in range(3):  # warm-up: allocator, caches
            step()
        runs[p]["gathers_bf16"] = _explain_gathers(compiled, x, ei) if p == "bf16" else 0
    assert abs(runs["fp32"]["first_loss"] - runs["bf16"]["first_loss"]) < 1e-2 * abs(runs["fp32"]["first_loss"]), runs
    times = {p: [] for p in runs}
    for _ in range(repeats):
        for p, r in runs.items():
            times[p].append(_common.timeit(r["step"], 1, warmup=0)["median"])
    med = {p: statistics.median(t) for p, t in times.items()}
    return {"N": N, "E": 10 * N, "F": F, "classes": C, "inner": inner, "fp32_s": med["fp32"], "bf16_s": med["bf16"],
            "speedup": med["fp32"] / med["bf16"], "gathers_bf16": runs["bf16"]["gathers_bf16"],
            "first_loss": {p: r["first_loss"] for p, r in runs.items()}}


# ----------------------------------------------------------------------------- accuracy
def load_cora(raw: Path):
    """Cora's (x, edge_index, y, train, test), normalised features; None (with why) when absent."""
    if not (raw / "ind.cora.x").exists():
        return None, f"Cora's raw files are not at {raw}: Cora skipped"
    try:
        import torch_geometric.transforms as T
        from torch_geometric.datasets import Planetoid
    except ImportError as e:
        return None, f"Cora skipped: {e}"
    root = Path(tempfile.mkdtemp(prefix="bf16_cora_"))
    try:
        shutil.copytree(raw, root / "Cora" / "raw")
        d = Planetoid(str(root), "Cora", transform=T.NormalizeFeatures())[0]
    except Exception as e:  # scipy missing, unreadable files
        return None, f"Cora skipped: {type(e).__name__}: {e}"
    finally:
        shutil.rmtree(root, ignore_errors=True)
    return (d.x, d.edge_index, d.y, d.train_mask, d.test_mask), ""


def teacher_task(N: int, F: int = 64, C: int = 8, seed: int = 123):
    """A power-law graph whose labels are the argmax of a fixed random 2-layer GCN (the teacher)
    over random features; half of the nodes train, the other half test."""
    ei = power_law_graph(N, 10 * N, seed=seed)
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(N, F, generator=g)
    torch.manual_seed(seed)
    teacher = GCN(F, 64, C, dropout=0.0).eval()
    with torch.no_grad():
        y = teacher(x, ei).argmax(1)
    train = torch.zeros(N, dtype=torch.bool)
    train[torch.randperm(N, generator=g)[: N // 2]] = True
    return x, ei, y, train, ~train


def train_eval(data, hidden: int, precision: str, seed: int, epochs: int, model_name: str = "gcn",
               tuned: Optional[dict] = None) -> dict:
    x, ei, y, train, test = data
    C = int(y.max()) + 1
    torch.manual_seed(seed)
    model = MODELS[model_name](x.shape[1], hidden, C)
    compiled = _compile(model, precision, inner="eager", tuned=tuned)
    opt = torch.optim.Adam(model.parameters(), lr=0.01, weight_decay=5e-4)
    for _ in range(epochs):
        model.train()
        opt.zero_grad()
        Fn.cross_entropy(compiled(x, ei)[train], y[train]).backward()
        opt.step()
    model.eval()
    with torch.no_grad():
        pred = compiled(x, ei).argmax(1)
    return {"test_acc": float((pred[test] == y[test]).float().mean()),
            "gathers_bf16": _explain_gathers(compiled, x, ei) if precision == "bf16" else 0}


def forward_diff(data, hidden: int, model_name: str = "gcn", tuned: Optional[dict] = None) -> dict:
    x, ei = data[0], data[1]
    C = int(data[2].max()) + 1
    torch.manual_seed(0)
    model = MODELS[model_name](x.shape[1], hidden, C).eval()
    outs = {}
    with torch.no_grad():
        for p in ("fp32", "bf16"):
            outs[p] = _compile(model, p, inner="eager", tuned=tuned)(x, ei)
    d = (outs["bf16"] - outs["fp32"]).abs()
    return {"max_abs_diff_over_max_abs": float(d.max() / outs["fp32"].abs().max()),
            "rel_norm_diff": float(d.norm() / outs["fp32"].norm()),
            "bitwise_equal": bool(torch.equal(outs["bf16"], outs["fp32"]))}


def accuracy(name: str, data, hidden: int, seeds: int, epochs: int, model_name: str = "gcn",
             tuned: Optional[dict] = None) -> dict:
    res = {"task": name, "nodes": int(data[0].shape[0]), "edges": int(data[1].shape[1]), "hidden": hidden,
           "epochs": epochs, "seeds": list(range(seeds)), "model": model_name}
    for p in ("fp32", "bf16"):
        runs = [train_eval(data, hidden, p, s, epochs, model_name, tuned) for s in range(seeds)]
        accs = [r["test_acc"] for r in runs]
        res[p] = {"acc": accs, "mean": statistics.mean(accs), "spread": max(accs) - min(accs),
                  "stdev": statistics.stdev(accs) if len(accs) > 1 else 0.0}
        if p == "bf16":
            res["gathers_bf16"] = runs[0]["gathers_bf16"]
        print(f"{name} {p}: test accuracy {[f'{a:.3f}' for a in accs]}", flush=True)
    res["forward"] = forward_diff(data, hidden, model_name, tuned)
    return res


# ----------------------------------------------------------------------------- report
def _cpu_line(c: dict) -> str:
    isa = ("bfloat16 instructions: " + ", ".join(c["bf16_flags"])) if c["bf16_flags"] else \
        "no bfloat16 instructions (no avx512_bf16 / amx_bf16): every conversion is done in software"
    return (f"CPU: {c['model_name']} (family {c['family']}, model {c['model']}; "
            f"{'AVX2' if c['avx2'] else 'no AVX2'}{', AVX-512' if c['avx512f'] else ', no AVX-512'}; {isa})")


def table(p: dict) -> str:
    m = p["machine"]
    lines = [_cpu_line(p["cpu"]) + f", {m['threads']} threads, torch {m['torch']}. "
             f"{_common.load_text(p['loadavg_before_after'])}.",
             f"Command: `{p['command']}`.", ""]
    if p["ops"]:
        lines += [f"### spmm sum on power-law graphs ({p['degree']} edges per node): ms, medians of {p['repeats']}",
                  "",
                  "bf16 = `x.to(bfloat16)` + `gnncompile::spmm_bf16` (fp32 accumulation, float32 out), as the "
                  "rewrite inserts them; speedups = fp32 time / bf16 time, and in brackets the design it "
                  "replaced (spmm over bfloat16, then `.to(float32)`). op only: spmm_bf16 on features "
                  "already bfloat16; casts: x to bfloat16 / a bfloat16 output to float32. "
                  "Max rel. error: |bf16 - fp32| / (sum of |x|) per element (bound 2^-8 = 0.0039).", "",
                  "| nodes | edges | F | fwd fp32 | fwd bf16 | fwd speedup (cast after) | fwd+bwd fp32 | "
                  "fwd+bwd bf16 | fwd+bwd speedup (cast after) | op only (bf16) | casts in / out | max rel. error |",
                  "|---|---|---|---|---|---|---|---|---|---|---|---|"]
        for r in p["ops"]:
            lines.append(f"| {r['N']:,} | {r['E']:,} | {r['F']} | {r['fwd_fp32_s'] * 1e3:.1f} | "
                         f"{r['fwd_bf16_s'] * 1e3:.1f} | {r['fwd_speedup']:.2f}x ({r['fwd_speedup_cast_after']:.2f}x) | "
                         f"{r['fb_fp32_s'] * 1e3:.1f} | {r['fb_bf16_s'] * 1e3:.1f} | {r['fb_speedup']:.2f}x "
                         f"({r['fb_speedup_cast_after']:.2f}x) | {r['op_bf16_s'] * 1e3:.1f} | "
                         f"{r['cast_in_s'] * 1e3:.1f} / {r['cast_out_s'] * 1e3:.1f} | {r['max_rel_err_vs_abs_sum']:.4f} |")
        lines.append("")
    gs = p.get("gcn_step")
    if gs:
        lines += [f"### One compiled GCN training step ({gs['N']:,} nodes, {gs['E']:,} edges, F = {gs['F']}, "
                  f"inner {gs['inner']}): ms, medians of {p['repeats']}", "",
                  "| fp32 | bf16 (opt-in) | speedup | spmm gathering bf16 (explain) |", "|---|---|---|---|",
                  f"| {gs['fp32_s'] * 1e3:.1f} | {gs['bf16_s'] * 1e3:.1f} | {gs['speedup']:.2f}x | {gs['gathers_bf16']} |",
                  ""]
    tuned = p.get("tuned")
    if p["accuracy"] or p["skipped"]:
        model = {"gcn": "GCN", "sage": "GraphSAGE"}.get(p.get("model", "gcn"), p.get("model"))
        lines += [f"### Accuracy: 2-layer {model}, test accuracy at the last epoch (mean [min, max] over seeds)", ""]
        if tuned:
            lines += [f"Both sides compiled with the tuned profile `{tuned['path']}`'s settings (knobs "
                      f"{tuned['knobs']}, inner {tuned['inner'] or 'auto'}, spmm_impl {tuned['spmm_impl'] or 'auto'}; "
                      f"its precision: {tuned['precision'] or 'fp32'}), fp32 against bf16.", ""]
    if p["accuracy"]:
        lines += ["| task | nodes | edges | epochs | seeds | fp32 | bf16 | bf16 - fp32 (mean) | "
                  "forward: max diff / max abs | forward: rel. norm diff |", "|---|---|---|---|---|---|---|---|---|---|"]
        for a in p["accuracy"]:
            f32, b16 = a["fp32"], a["bf16"]
            lines.append(f"| {a['task']} | {a['nodes']:,} | {a['edges']:,} | {a['epochs']} | {len(a['seeds'])} | "
                         f"{f32['mean']:.3f} [{min(f32['acc']):.3f}, {max(f32['acc']):.3f}] | "
                         f"{b16['mean']:.3f} [{min(b16['acc']):.3f}, {max(b16['acc']):.3f}] | "
                         f"{b16['mean'] - f32['mean']:+.3f} | {a['forward']['max_abs_diff_over_max_abs']:.2e} | "
                         f"{a['forward']['rel_norm_diff']:.2e} |")
    for s in p["skipped"]:
        lines.append(f"\n{s}")
    return "\n".join(lines) + "\n"


def plot(p: dict, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4))
    labels = [f"{r['N'] // 1000}k\nF={r['F']}" for r in p["ops"]]
    xs = range(len(labels))
    ax.bar([i - 0.2 for i in xs], [r["fwd_speedup"] for r in p["ops"]], 0.4, label="forward")
    ax.bar([i + 0.2 for i in xs], [r["fb_speedup"] for r in p["ops"]], 0.4, label="forward + backward")
    ax.axhline(1.0, color="k", lw=0.8)
    ax.set_xticks(list(xs), labels)
    ax.set_ylabel("fp32 time / bf16 time (casts included)")
    ax.set_title(f"spmm sum, bf16 gathering: {p['cpu']['model_name']}", fontsize=9)
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def main(argv: Optional[List[str]] = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--nodes", type=int, nargs="*", default=[100_000, 500_000, 1_000_000])
    ap.add_argument("--features", type=int, nargs="+", default=[64, 128])
    ap.add_argument("--degree", type=int, default=10, help="edges per node (default 10)")
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--gcn-nodes", type=int, default=100_000, help="the training step's graph (0: skip)")
    ap.add_argument("--gcn-features", type=int, default=128)
    ap.add_argument("--gcn-inner", default="auto", help="the training step's inner compiler (default auto)")
    ap.add_argument("--epochs", type=int, default=200)
    ap.add_argument("--seeds", type=int, default=3)
    ap.add_argument("--cora-raw", type=Path, default=CORA_RAW)
    ap.add_argument("--synthetic-nodes", type=int, default=10_000, help="the teacher task's graph (0: skip)")
    ap.add_argument("--profile", type=Path, default=None,
                    help="the accuracy runs use this tuning profile's knobs, inner compiler and spmm implementation")
    ap.add_argument("--model", choices=sorted(MODELS), default="gcn", help="the accuracy runs' model (default gcn)")
    ap.add_argument("--name", default="bf16", help="stem of the result files (default bf16)")
    ap.add_argument("--out", type=Path, default=_common.RESULTS)
    args = ap.parse_args(argv)
    try:
        tuned = profile_settings(args.profile) if args.profile is not None else None
    except (ValueError, OSError) as e:  # ProfileError is a ValueError
        ap.error(f"--profile: {e}")
    if not gnncompile.info()["native"]:
        print("the native kernels are not loaded: nothing to measure", file=sys.stderr)
        return 2
    before = _common.loadavg()
    ops_res = []
    for N in args.nodes:
        for F in args.features:
            r = op_point(N, F, args.degree, args.repeats)
            print(f"N={N:,} F={F}: fwd {r['fwd_fp32_s'] * 1e3:.1f} / {r['fwd_bf16_s'] * 1e3:.1f} ms "
                  f"({r['fwd_speedup']:.2f}x), fwd+bwd {r['fb_fp32_s'] * 1e3:.1f} / {r['fb_bf16_s'] * 1e3:.1f} ms "
                  f"({r['fb_speedup']:.2f}x)", flush=True)
            ops_res.append(r)
    gs = None
    if args.gcn_nodes:
        gs = gcn_step(args.gcn_nodes, args.gcn_features, 16, args.repeats, args.gcn_inner)
        print(f"GCN step: fp32 {gs['fp32_s'] * 1e3:.1f} ms, bf16 {gs['bf16_s'] * 1e3:.1f} ms ({gs['speedup']:.2f}x)",
              flush=True)
    acc, skipped = [], []
    cora, why = load_cora(args.cora_raw)
    if cora is None:
        print(why)
        skipped.append(why)
    else:
        acc.append(accuracy("Cora", cora, 16, args.seeds, args.epochs, args.model, tuned))
    if args.synthetic_nodes:
        acc.append(accuracy("power-law teacher", teacher_task(args.synthetic_nodes), 64, args.seeds, args.epochs,
                            args.model, tuned))
    payload = {"machine": _common.machine(), "cpu": cpu_record(), "command": _common.command("bf16", argv),
               "repeats": args.repeats, "degree": args.degree, "loadavg_before_after": [before, _common.loadavg()],
               "ops": ops_res, "gcn_step": gs, "accuracy": acc, "skipped": skipped,
               "model": args.model, "tuned": tuned}
    _common.write_results(args.out, args.name, payload, table, plot if ops_res else None)
    return 0


if __name__ == "__main__":
    sys.exit(main())
