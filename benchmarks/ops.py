"""Fused spmm vs. what PyG runs eagerly vs. torch.sparse on a prebuilt CSR adjacency.

    python -m benchmarks ops                      # 100k nodes, 1M edges, F in {32, 128, 256}
    python -m benchmarks ops --quick              # small graph, for the demo
    python -m benchmarks ops --memory             # also peak memory vs E x F (subprocesses)

Peers, each checked against gnncompile before it is timed:
  eager   x.index_select(0, src) [* w] -> zeros.scatter_add_(0, dst, .)   (PyG's eager path)
  sparse  torch.sparse.mm(A, x) with A a CSR tensor built before timing    (PyG's SparseTensor/CSR path)
Times are medians over --repeats calls after a warm-up; the graph structure of gnncompile is
built once before timing (as across training steps); its build time is reported separately.
Writes benchmarks/results/ops.{json,md,png} (--quick: ops_quick.*).
"""
from __future__ import annotations

import argparse
import subprocess
import sys
from pathlib import Path

import torch

import gnncompile
from gnncompile.data.synthetic import power_law_graph

from . import _common


def make_inputs(N: int, E: int, F: int, seed: int = 0):
    ei = power_law_graph(N, E, seed=seed)
    g = torch.Generator().manual_seed(seed + 1)
    x = torch.randn(N, F, generator=g)
    w = torch.rand(E, generator=g)
    return ei, x, w


def eager_spmm(ei, x, w=None):
    msg = x.index_select(0, ei[0])
    if w is not None:
        msg = msg * w.view(-1, 1)
    out = torch.zeros(x.size(0), x.size(1), dtype=x.dtype)
    return out.scatter_add_(0, ei[1].view(-1, 1).expand_as(msg), msg)


def sparse_adj(ei, N, w=None):
    vals = w if w is not None else torch.ones(ei.size(1))
    import warnings

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return torch.sparse_coo_tensor(ei.flip(0), vals, (N, N)).coalesce().to_sparse_csr()


def agree(a: torch.Tensor, b: torch.Tensor, rtol: float = 1e-4) -> float:
    """Largest difference relative to the largest magnitude; asserts it is below rtol."""
    scale = max(a.abs().max().item(), 1e-12)
    err = (a - b).abs().max().item() / scale
    if err > rtol:
        raise AssertionError(f"implementations disagree: relative error {err:.2e} > {rtol}")
    return err


def bench_features(N: int, E: int, F: int, repeats: int) -> dict:
    ei, x, w = make_inputs(N, E, F)
    res: dict = {"N": N, "E": E, "F": F}
    res["build_s"] = _common.timeit(lambda: gnncompile.ops.structure.build(ei, N), repeats)["median"]
    gnncompile.ops.structure.structure(ei, N)  # cached for the timed calls
    A = sparse_adj(ei, N)

    # ---- forward, unweighted sum
    ref = eager_spmm(ei, x)
    res["fwd_agree"] = {
        "eager": agree(gnncompile.ops.spmm(ei, x), ref),
        "sparse": agree(torch.sparse.mm(A, x), ref),
    }
    fwd = {
        "gnncompile": _common.timeit(lambda: gnncompile.ops.spmm(ei, x), repeats),
        "eager": _common.timeit(lambda: eager_spmm(ei, x), repeats),
        "sparse": _common.timeit(lambda: torch.sparse.mm(A, x), repeats),
    }
    res["fwd"] = fwd

    # ---- forward + backward, weighted sum, grads of x and edge_weight
    go = torch.randn(N, F, generator=torch.Generator().manual_seed(7))

    def gnn_step():
        xr = x.detach().requires_grad_()
        wr = w.detach().requires_grad_()
        gnncompile.ops.spmm(ei, xr, wr).backward(go)
        return xr.grad, wr.grad

    def eager_step():
        xr = x.detach().requires_grad_()
        wr = w.detach().requires_grad_()
        eager_spmm(ei, xr, wr).backward(go)
        return xr.grad, wr.grad

    Aw = sparse_adj(ei, N, w)

    def sparse_step():  # grad of x only: torch.sparse.mm has no grad for CSR values here
        xr = x.detach().requires_grad_()
        torch.sparse.mm(Aw, xr).backward(go)
        return xr.grad

    gx, gw = gnn_step()
    ex, ew = eager_step()
    res["bwd_agree"] = {"x": agree(gx, ex), "edge_weight": agree(gw, ew), "sparse_x": agree(sparse_step(), ex)}
    res["fwdbwd"] = {
        "gnncompile": _common.timeit(gnn_step, repeats),
        "eager": _common.timeit(eager_step, max(3, repeats // 2)),
        "sparse_xgrad_only": _common.timeit(sparse_step, repeats),
    }
    # Bytes an ideal kernel moves: every gathered source row, plus reading x-sized and writing
    # out-sized arrays once.
    nbytes = E * F * 4 + 2 * N * F * 4
    res["fwd_gbs"] = {k: nbytes / v["median"] / 1e9 for k, v in fwd.items()}
    return res


# --------------------------------------------------------------------------- peak memory
MEM_IMPLS = ("gnncompile", "eager")


def memory_case(impl: str, N: int, E: int, F: int) -> int:
    ei, x, w = make_inputs(N, E, F)
    go = torch.randn(N, F)
    xr = x.clone().requires_grad_()
    wr = w.clone().requires_grad_()
    if impl == "gnncompile":
        gnncompile.ops.structure.structure(ei, N).transposed(N)  # structure as it is across steps

        def step():
            gnncompile.ops.spmm(ei, xr, wr).backward(go)
    else:
        def step():
            eager_spmm(ei, xr, wr).backward(go)
    step()  # warm-up: first-call allocations, lazily created pools
    xr.grad = None
    wr.grad = None
    return _common.read_peak_rss_delta(step)


def memory_sweep(N: int, edges, features) -> list:
    rows = []
    for E in edges:
        for F in features:
            row = {"N": N, "E": E, "F": F, "ExF_bytes": E * F * 4}
            for impl in MEM_IMPLS:
                out = subprocess.run(
                    _common.module_command("ops") + ["--memory-case", impl, str(N), str(E), str(F)],
                    capture_output=True, text=True, env=_common.isolated_env(), check=True, cwd=_common.ROOT)
                row[impl] = int(out.stdout.strip().splitlines()[-1])
            rows.append(row)
            print(f"  memory E={E:>9,} F={F:>4}: gnncompile {row['gnncompile'] / 2**20:8.1f} MiB"
                  f"   eager {row['eager'] / 2**20:8.1f} MiB   E*F*4 {row['ExF_bytes'] / 2**20:8.1f} MiB",
                  flush=True)
    return rows


# --------------------------------------------------------------------------- reporting
def table(results: list, copy_gbs: float) -> str:
    lines = [
        f"Machine copy bandwidth (read + write): {copy_gbs:.1f} GB/s. Times in ms, medians.",
        "",
        "| F | fwd gnncompile | fwd eager | fwd sparse CSR | x eager | x sparse | GB/s (gnncompile) "
        "| fwd+bwd gnncompile | fwd+bwd eager | x eager | structure build |",
        "|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in results:
        f, b = r["fwd"], r["fwdbwd"]
        g = f["gnncompile"]["median"]
        gb = b["gnncompile"]["median"]
        lines.append(
            f"| {r['F']} | {g * 1e3:.1f} | {f['eager']['median'] * 1e3:.1f} | {f['sparse']['median'] * 1e3:.1f} "
            f"| {f['eager']['median'] / g:.2f} | {f['sparse']['median'] / g:.2f} | {r['fwd_gbs']['gnncompile']:.1f} "
            f"| {gb * 1e3:.1f} | {b['eager']['median'] * 1e3:.1f} | {b['eager']['median'] / gb:.2f} "
            f"| {r['build_s'] * 1e3:.1f} |")
    return "\n".join(lines)


def memory_table(rows: list) -> str:
    lines = ["| E | F | E*F*4 (MiB) | peak gnncompile (MiB) | peak eager (MiB) | gnncompile / E*F*4 |",
             "|---|---|---|---|---|---|"]
    for r in rows:
        lines.append(f"| {r['E']:,} | {r['F']} | {r['ExF_bytes'] / 2**20:.0f} | {r['gnncompile'] / 2**20:.1f} "
                     f"| {r['eager'] / 2**20:.1f} | {r['gnncompile'] / r['ExF_bytes']:.3f} |")
    return "\n".join(lines)


def plot(results: list, path: Path) -> None:
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print("(matplotlib not installed: no plot)")
        return
    fig, axes = plt.subplots(1, 2, figsize=(10, 4))
    for ax, key, title, impls in (
        (axes[0], "fwd", "spmm sum forward", ("gnncompile", "eager", "sparse")),
        (axes[1], "fwdbwd", "weighted spmm forward + backward", ("gnncompile", "eager", "sparse_xgrad_only")),
    ):
        width = 0.8 / len(impls)
        for i, impl in enumerate(impls):
            xs = [j + i * width for j in range(len(results))]
            ax.bar(xs, [r[key][impl]["median"] * 1e3 for r in results], width, label=impl)
        ax.set_xticks([j + width * (len(impls) - 1) / 2 for j in range(len(results))])
        ax.set_xticklabels([f"F={r['F']}" for r in results])
        ax.set_ylabel("ms (median, lower is better)")
        ax.set_title(title)
        ax.legend()
    r0 = results[0]
    fig.suptitle(f"{r0['N']:,} nodes, {r0['E']:,} edges, {torch.get_num_threads()} threads")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--nodes", type=int, default=100_000)
    p.add_argument("--edges", type=int, default=1_000_000)
    p.add_argument("--features", type=int, nargs="+", default=[32, 128, 256])
    p.add_argument("--repeats", type=int, default=10)
    p.add_argument("--threads", type=int, default=None, help="torch.set_num_threads (default: torch's)")
    p.add_argument("--quick", action="store_true", help="20k nodes, 200k edges, F=64: seconds")
    p.add_argument("--memory", action="store_true", help="also measure peak memory vs E x F")
    p.add_argument("--out", type=Path, default=_common.RESULTS, help="folder for ops.{json,md,png}")
    p.add_argument("--memory-case", nargs=4, metavar=("IMPL", "N", "E", "F"), help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    if args.memory_case:
        impl, N, E, F = args.memory_case
        print(memory_case(impl, int(N), int(E), int(F)))
        return 0
    if args.quick:
        args.nodes, args.edges, args.features, args.repeats = 20_000, 200_000, [64], 5

    if not gnncompile.info()["native"]:
        print("WARNING: gnncompile's native kernels are not loaded: timing the pure-torch fallback", flush=True)
    copy_gbs = _common.copy_bandwidth_gbs()
    print(f"{_common.machine()['device']}; copy bandwidth {copy_gbs:.1f} GB/s", flush=True)
    results = []
    for F in args.features:
        print(f"F={F}: {args.nodes:,} nodes, {args.edges:,} edges ...", flush=True)
        results.append(bench_features(args.nodes, args.edges, F, args.repeats))
    text = table(results, copy_gbs)
    payload = {"machine": _common.machine(), "copy_gbs": copy_gbs, "results": results}
    if args.memory:
        print("peak memory of weighted spmm forward + backward (fresh process per case):", flush=True)
        N = min(args.nodes, 100_000)
        edges = [args.edges // 4, args.edges // 2, args.edges] if not args.quick else [50_000, 200_000]
        mem = memory_sweep(N, edges, [32, 128, 256] if not args.quick else [64])
        payload["memory"] = mem
        text += "\n\nPeak resident memory added by one weighted forward + backward (after warm-up):\n\n" + memory_table(mem)
    print()
    name = "ops_quick" if args.quick else "ops"
    _common.write_results(args.out, name, payload, lambda p: text + "\n", lambda p, path: plot(results, path))
    print(f"wrote {args.out / name}.{{json,md,png}}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
