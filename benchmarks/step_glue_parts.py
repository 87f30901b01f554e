"""Where a compiled molecule step's forward call goes between ``model(batch)`` and the graph's
kernels (issue 24, point 3): one GIN / GINE / GCN forward in grad mode on a prebuilt batch of 128
molecule graphs, each layer of the call path timed by itself, interleaved, medians and fastest of
``CALLS`` calls (the model's guards forced to the compiled, rewritten form after warm-up); and the
structure op ``gnncompile::hoisted`` on a hit, its cache's lookup alone, the identity looks
(state + fingerprint of edge_index and batch) alone, and a call on a new edge_index (the batch's
CSR / CSC built, as for every batch a loader hands out).

    python -m benchmarks.step_glue_parts gin 300

(ad-hoc: not registered in benchmarks/__main__.py; HISTORY section 40.)
"""
import sys, time, statistics, warnings
warnings.simplefilter("ignore")
import gnncompile, torch
from benchmarks import molecules as M
from torch_geometric.loader import DataLoader
from gnncompile.compiler import backend as B
from gnncompile.ops import hoisted as H, vendor as V, identity as I


def main(argv=None) -> int:
    """``argv``: [model kind (gin, gine, gcn), calls]; prints one line per part."""
    argv = sys.argv[1:] if argv is None else list(argv)
    if len(argv) != 2 or argv[0] not in M.MODELS or not argv[1].isdigit():
        raise SystemExit("usage: python -m benchmarks.step_glue_parts {gin,gine,gcn} CALLS")
    kind, calls = argv[0], int(argv[1])
    torch.set_num_threads(2)

    ds = M.make_dataset(1024)
    pre = [b.clone() for b in DataLoader(ds, batch_size=128, shuffle=True, generator=torch.Generator().manual_seed(0))][:8]
    got = []
    bc = B.Backend.__call__
    def spy(self, gm, ex):
        fn = bc(self, gm, ex); got.append((gm, fn)); return fn
    B.Backend.__call__ = spy
    m = M.build_model(kind)
    cm = gnncompile.compile(m, dynamic=True)
    opt = torch.optim.Adam(m.parameters(), lr=1e-3)
    for _ in range(4):
        for b in pre:
            opt.zero_grad(set_to_none=True); M._loss(cm, b).backward(); opt.step()
    B.Backend.__call__ = bc
    gm, sg = got[0]
    g = cm._guard
    g.as_written.clear()
    for r in g._races.values(): r.winner, r.recheck_in = g._forms[0], None
    w = sg._forms[0]
    rec = {}
    for r in sg._races.values(): r.winner = lambda *a: (rec.setdefault("a", a), w(*a))[1]
    b0 = pre[0]
    a0 = (b0.x, b0.edge_index, b0.edge_attr, b0.batch)
    cm(*a0)
    for r in sg._races.values(): r.winner = w
    args = rec["a"]
    key = [n for n in gm.graph.nodes if n.target is torch.ops.gnncompile.hoisted.default][0].args[0]
    roots, sizes = [b0.edge_index, b0.batch], [b0.num_nodes]
    fresh = [b.edge_index.clone() for b in pre]
    def miss():
        ei = b0.edge_index.clone()
        torch.ops.gnncompile.hoisted.default(key, [ei, b0.batch], sizes, False, "cpu")
    def ctxs():
        with B.dynamic_output_shapes(cm._capture), gnncompile.compiler.lean.scope(cm._lean, cm.lean_record):
            pass
    forms = {
        "compiled module fwd (all)": lambda: cm(*a0),
        "ModelGuard -> _run_compiled": lambda: g(*a0),
        "_run_compiled (2 context managers + Dynamo)": lambda: cm._run_compiled(*a0),
        "Dynamo OptimizedModule fwd": lambda: cm._compiled(*a0),
        "SpeedGuard -> graph fwd": lambda: sg(*args),
        "graph fwd direct": lambda: w(*args),
        "2 context managers alone": ctxs,
        "hoisted op, hit": lambda: torch.ops.gnncompile.hoisted.default(key, roots, sizes, False, "cpu"),
        "HoistCache.get, hit": lambda: H.CACHE.get(key, roots, sizes, "cpu"),
        "Looks (edge_index, batch), cpu check": lambda: (I.Look(b0.edge_index, "cpu"), I.Look(b0.batch, "cpu")),
        "hoisted op, new edge_index (structure build)": miss,
        "edge_index clone alone": lambda: b0.edge_index.clone(),
    }
    ts = {k: [] for k in forms}
    for _ in range(calls):
        for k, f in forms.items():
            t = time.perf_counter(); f(); ts[k].append(time.perf_counter() - t)
    for k, v in ts.items():
        print(f"{k:46s} median {statistics.median(v)*1e6:8.1f} us  min {min(v)*1e6:8.1f} us")
    return 0


if __name__ == "__main__":
    sys.exit(main())
