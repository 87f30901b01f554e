"""Graph classification on molecule-sized graphs, end to end: PyG eager vs inductor vs gnncompile.

    python -m benchmarks molecules                       # 4000 graphs, batches of 128, 3 rounds
    python -m benchmarks molecules --quick               # 512 graphs, 1 timed epoch, 1 round
    python -m benchmarks molecules --models gine --variants eager,gnncompile-pooled

Data (generated, no downloads; ``make_dataset``): ``--graphs`` graphs of 10-40 nodes, each a
random spanning tree plus about one extra edge in ten (average degree ~2.2, as in molecules),
made undirected; node features N(0, 1) of width 32, edge features N(0, 1) of width 8, both
directions of an edge sharing one; two classes, which shift the node features' mean (learnable).

Models (as a PyG user writes them; readout ``global_add_pool(h, batch)`` with no graph count):
  gin    3 x GINConv(MLP(F, 64, 64)) + ReLU, global_add_pool, Linear(64, 2)
  gine   3 x GINEConv(MLP(F, 64, 64), edge_dim=8) + ReLU, global_add_pool, Linear(64, 2)
  gcn    3 x GCNConv(F, 64) + ReLU, global_add_pool, Linear(64, 2)
Step: forward, cross-entropy, backward, Adam (lr 1e-3).

Variants (each model x variant in a process of its own; the model is built from seed 0; the
compilers are told that sizes vary from batch to batch, ``dynamic=True``, as the README advises
for mini-batches: one compilation instead of a static one and a dynamic one):
  eager               the model, ``torch_geometric.loader.DataLoader``
  inductor            ``torch.compile(model, dynamic=True)``, DataLoader
  gnncompile          ``gnncompile.compile(model, dynamic=True)``, DataLoader
  gnncompile-pooled   ``gnncompile.compile(model, dynamic=True)``, ``gnncompile.data.PooledLoader`` (same
                      batches in the same order as the DataLoader: same seeded generator)
  gnncompile-breaks   as gnncompile-pooled with ``settings={"capture_dynamic": False}``: the
                      readout breaks the graph as before issue 24 (the "before" of the
                      breakdown)
  gnncompile-pooled-before
                      as gnncompile-pooled with the per-step rules of issue 24 point 3 turned
                      off, as they were before them: ``inner="eager"`` (no AOTAutograd for the
                      small training pieces) and ``choices['programs'] = 'never'`` (the rule
                      before them fused no message program at these sizes); the "before" of the
                      per-step breakdown in the same run
The loader-prepared structures (issue 24 point 2; run only when named in ``--variants``):
  gnncompile-pooled-struct     as gnncompile-pooled, ``structures=True``: each batch's CSR / CSC
                               built at delivery (no workers: in the main thread, before the step)
  gnncompile-pooled-w2         PooledLoader(num_workers=2, structures=False): the step builds them
  gnncompile-pooled-w2-struct  PooledLoader(num_workers=2, structures=True): the workers
                               build them into the slot, the parent adopts them
  gnncompile-prefetch          DataLoader through ``gnncompile.data.prefetch_structures(depth=2)``
The loader's own cost (run only when named in ``--variants``):
  gnncompile-pooled-loader-before
                      as gnncompile-pooled with the PooledLoader's batch assembly as it was before
                      section 39 of HISTORY.md (``LEGACY_LOADER``: ``Batch(_base_cls=...)`` and
                      ``setattr`` per attribute, a few small tensor ops per column for its slices,
                      increments and totals), patched into the child's process; the "before" of
                      the loader's cut in the same run
The custom ops' glue (run only when named in ``--variants``):
  gnncompile-pooled-glue-before
                      as gnncompile-pooled with ``gnncompile::spmm_sparse``'s per-call Python as it
                      was before section 40 of HISTORY.md (``use_legacy_glue``: the kernels that
                      ``torch.library.custom_op`` registers around it), patched into the child's
                      process; the "before" of that cut in the same run
The allocator alone (run only when named in ``--variants``):
  eager-allocator     the model as written, DataLoader, with what ``gnncompile.compile`` turns on
                      process-wide for a CPU model (gnncompile.hardware.memory: huge pages where
                      the kernel's mode is madvise, the block cache of freed allocations): which
                      part of a compiled variant's lead over eager is the allocator's

Per run: epoch 1 timed whole (compilation included); the first step's loss checked against an
eager copy of the model on the same batch (1e-4 relative); ``--epochs`` more epochs timed whole
(loader + steps: "end to end"); as many passes of the loader with no step ("loader alone"); then
the model alone on a list of batches collated beforehand
(``--repeats`` passes, every step timed: "model alone", median); the model alone again with a fresh
copy of each batch's edge_index per step, as a loader hands out ("model alone, fresh edge_index":
the step finds no structure by identity; for the variants that prepare structures they are
prepared for the copy before the timed step); recompiles (Dynamo's
unique_graphs) after epoch 1; graph breaks; and a per-step breakdown over one pass of the
prebuilt batches under torch.profiler (self CPU time by group: the fused ops, matmuls, other
aten ops, the optimizer, Dynamo's cache lookup (its guards), the compiled region's own time (the
wrappers around the compiled graph), AOTAutograd's CompiledFunction / CompiledFunctionBackward
self time (the Python of the forward and backward graphs an aot_eager piece runs), the autograd
engine's nodes; "outside ops" is the step's wall time minus the ops' self time: Python, autograd
glue of custom ops, the model's wrappers; the profiler inflates small ops, so compare the
breakdown's shares, and take times from the other columns).
Writes benchmarks/results/molecules[_quick].{json,md,png}. A shared machine is noisy: compare
ratios from one run.
"""
from __future__ import annotations

import argparse
import copy
import json
import statistics
import time
import warnings
from pathlib import Path

import gnncompile  # (the installed package; imported before anything else)
import torch

from . import _common

F, EDGE_DIM, HIDDEN, LAYERS, C = 32, 8, 64, 3, 2
MODELS = ("gin", "gine", "gcn")
VARIANTS = ("eager", "inductor", "gnncompile", "gnncompile-pooled", "gnncompile-breaks", "gnncompile-pooled-before")
# the loader's structures (issue 24 point 2), A/B; not run unless named in --variants
STRUCT_VARIANTS = ("gnncompile-pooled-struct", "gnncompile-pooled-w2", "gnncompile-pooled-w2-struct",
                   "gnncompile-prefetch")
ALLOCATOR_VARIANTS = ("eager-allocator",)
LOADER_VARIANTS = ("gnncompile-pooled-loader-before",)
GLUE_VARIANTS = ("gnncompile-pooled-glue-before",)
PREPARED = ("gnncompile-pooled-struct", "gnncompile-pooled-w2-struct", "gnncompile-prefetch")
GROUPS = ("gnncompile fused ops", "matmul", "other aten ops", "optimizer", "Dynamo cache lookup (guards)",
          "compiled region (wrappers)", "AOT CompiledFunction (graph code)", "autograd engine", "outside ops")


# ----------------------------------------------------------------------------- data and models
def make_dataset(num_graphs: int, seed: int = 0) -> list:
    """``num_graphs`` molecule-sized graphs (see the module docstring)."""
    from torch_geometric.data import Data
    from torch_geometric.utils import coalesce, remove_self_loops

    g = torch.Generator().manual_seed(seed)
    out = []
    for _ in range(num_graphs):
        n = int(torch.randint(10, 41, (1,), generator=g))
        y = int(torch.randint(0, C, (1,), generator=g))
        src = torch.arange(1, n)
        dst = (torch.rand(n - 1, generator=g) * src).long()  # a random earlier node: a tree
        extra = max(1, n // 10)
        src = torch.cat([src, torch.randint(0, n, (extra,), generator=g)])
        dst = torch.cat([dst, torch.randint(0, n, (extra,), generator=g)])
        attr = torch.randn(src.numel(), EDGE_DIM, generator=g)
        ei = torch.stack([torch.cat([src, dst]), torch.cat([dst, src])])
        ei, ea = remove_self_loops(ei, torch.cat([attr, attr]))
        ei, ea = coalesce(ei, ea, num_nodes=n, reduce="mean")
        x = torch.randn(n, F, generator=g) + 0.25 * y
        out.append(Data(x=x, edge_index=ei, edge_attr=ea, y=torch.tensor([y]), num_nodes=n))
    return out


class Classifier(torch.nn.Module):
    def __init__(self, kind: str) -> None:
        from torch_geometric.nn import GCNConv, GINConv, GINEConv

        super().__init__()
        self.kind = kind
        self.convs = torch.nn.ModuleList()
        for i in range(LAYERS):
            d = F if i == 0 else HIDDEN
            mlp = torch.nn.Sequential(torch.nn.Linear(d, HIDDEN), torch.nn.ReLU(), torch.nn.Linear(HIDDEN, HIDDEN))
            self.convs.append({"gin": lambda: GINConv(mlp), "gine": lambda: GINEConv(mlp, edge_dim=EDGE_DIM),
                               "gcn": lambda: GCNConv(d, HIDDEN)}[kind]())
        self.head = torch.nn.Linear(HIDDEN, C)

    def forward(self, x, edge_index, edge_attr, batch):
        from torch_geometric.nn import global_add_pool

        for conv in self.convs:
            x = (conv(x, edge_index, edge_attr) if self.kind == "gine" else conv(x, edge_index)).relu()
        return self.head(global_add_pool(x, batch))


def build_model(kind: str) -> Classifier:
    torch.manual_seed(0)
    return Classifier(kind)


def wrap(model, variant: str):
    if variant == "eager":
        return model
    if variant == "eager-allocator":
        from gnncompile.hardware import memory

        memory.apply("auto", {"cpu"})
        memory.apply_cache("auto", {"cpu"})
        return model
    if variant == "inductor":
        return torch.compile(model, dynamic=True)
    if variant == "gnncompile-breaks":
        return gnncompile.compile(model, dynamic=True, settings={"capture_dynamic": False})
    if variant == "gnncompile-pooled-before":
        return gnncompile.compile(model, dynamic=True, inner="eager", settings={"choices": {"programs": "never"}})
    return gnncompile.compile(model, dynamic=True)


def make_loader(dataset: list, batch_size: int, variant: str):
    gen = torch.Generator().manual_seed(0)
    if variant in ("gnncompile-pooled", "gnncompile-breaks", "gnncompile-pooled-struct", "gnncompile-pooled-before",
                   "gnncompile-pooled-loader-before", "gnncompile-pooled-glue-before"):
        from gnncompile.data import PooledLoader

        return PooledLoader(dataset, batch_size=batch_size, shuffle=True, generator=gen,
                            structures=variant == "gnncompile-pooled-struct")
    if variant in ("gnncompile-pooled-w2", "gnncompile-pooled-w2-struct"):
        from gnncompile.data import PooledLoader

        return PooledLoader(dataset, batch_size=batch_size, shuffle=True, generator=gen, num_workers=2,
                            persistent_workers=True, structures=variant.endswith("struct"))
    from torch_geometric.loader import DataLoader

    loader = DataLoader(dataset, batch_size=batch_size, shuffle=True, generator=gen)
    if variant == "gnncompile-prefetch":
        from gnncompile.data import prefetch_structures

        class _Prefetched:  # re-iterable, as the loader
            def __iter__(self):
                return prefetch_structures(loader, depth=2)

        return _Prefetched()
    return loader


# ----------------------------------------------------------------------------- the loader before
def _legacy_collate_into(self, idx, bufs, pad=None):
    """``_Store.collate_into`` before section 39 (per column: sizes[idx], sum, int); no
    bucket padding (the benchmark's loaders do not pad)."""
    if pad is not None:
        raise ValueError("the legacy batch assembly does not pad (pad_to_buckets)")
    from gnncompile.data.loader import _ADDABLE, _used
    from gnncompile.ops import collate_rows, segment_ids

    B = idx.numel()
    used = {}
    for c in self.columns:
        sizes = c.sizes[idx]
        total = int(sizes.sum())
        buf = bufs[c.key] if c.cat_dim == 0 else _used(bufs[c.key], c.cat_dim, total)
        incs = c.incs if c.has_inc else None
        native = c.values.is_contiguous() and (incs is None or c.values.dtype in _ADDABLE)
        if native and c.cat_dim == 0:
            collate_rows(c.values, c.starts, c.sizes, idx, buf, incs)
        elif native and c.cat_dim == 1 and c.values.dim() == 2 and c.values.size(0) <= 8:
            for r in range(c.values.size(0)):
                collate_rows(c.values[r], c.starts, c.sizes, idx, buf[r], incs)
        else:
            self._collate_torch(c, idx, sizes, total, buf)
        used[c.key] = total
        if c.key in self.follow_batch:
            segment_ids(c.sizes, idx, bufs[c.key + "_batch"], bufs[c.key + "_ptr"])
            used[c.key + "_batch"] = total
            used[c.key + "_ptr"] = B + 1
    total = int(self.num_nodes[idx].sum())
    segment_ids(self.num_nodes, idx, bufs["batch"], bufs["ptr"])
    used["batch"] = total
    used["ptr"] = B + 1
    used["_num_nodes"] = total
    return used


def _legacy_make_batch(self, idx, bufs, used):
    """``_Store.make_batch`` before section 39 (``Batch(_base_cls=...)``, ``setattr`` per
    attribute, per column a cumsum and a cat for its slices)."""
    from gnncompile.data.loader import _exclusive_cumsum, _used
    from torch_geometric.data import Batch

    out = Batch(_base_cls=self.data_cls)
    B = idx.numel()
    slice_dict, inc_dict = {}, {}
    for c in self.columns:
        v = _used(bufs[c.key], c.cat_dim, used[c.key])
        setattr(out, c.key, v)
        sizes = c.sizes[idx]
        slice_dict[c.key] = torch.cat([sizes.new_zeros(1), torch.cumsum(sizes, 0)])
        inc_dict[c.key] = _exclusive_cumsum(c.incs[idx]) if c.has_inc else torch.zeros(B, dtype=torch.long)
        if c.key in self.follow_batch:
            setattr(out, c.key + "_batch", _used(bufs[c.key + "_batch"], 0, used[c.key + "_batch"]))
            setattr(out, c.key + "_ptr", _used(bufs[c.key + "_ptr"], 0, B + 1))
    if self.has_num_nodes_attr:
        out._num_nodes = self.num_nodes[idx].tolist()
        out.num_nodes = used["_num_nodes"]
    out.batch = _used(bufs["batch"], 0, used["batch"])
    out.ptr = _used(bufs["ptr"], 0, B + 1)
    out._num_graphs = B
    out._slice_dict = slice_dict
    out._inc_dict = inc_dict
    return out


def use_legacy_loader() -> None:
    """Patches the PooledLoader's batch assembly back to the code before section 39 (this
    process only; the variant gnncompile-pooled-loader-before)."""
    from gnncompile.data.loader import _Store

    _Store.collate_into = _legacy_collate_into
    _Store.make_batch = _legacy_make_batch


def _loss(run, b):
    return torch.nn.functional.cross_entropy(run(b.x, b.edge_index, b.edge_attr, b.batch), b.y)


# ----------------------------------------------------------------------------- one run
def _group(name: str) -> str:
    if "gnncompile" in name:
        return "gnncompile fused ops"
    if name in ("aten::mm", "aten::addmm", "aten::bmm", "aten::matmul"):
        return "matmul"
    if name.startswith("Optimizer.") or name.startswith("aten::_foreach"):
        return "optimizer"
    if name.startswith("TorchDynamo"):
        return "Dynamo cache lookup (guards)"
    if name.startswith("Torch-Compiled Region"):
        return "compiled region (wrappers)"
    if "CompiledFunction" in name:  # aot_eager / inductor: the forward and backward graphs' own Python
        return "AOT CompiledFunction (graph code)"
    if name.startswith("autograd::engine") or name.endswith("Backward0") or name.endswith("Backward1") \
            or name.startswith("torch::autograd::"):
        return "autograd engine"
    return "other aten ops"


def breakdown(step, batches) -> dict:
    """ms per step by group (see the module docstring), over one pass of ``batches``."""
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CPU]) as prof:
        t0 = time.perf_counter()
        for b in batches:
            step(b)
        wall = time.perf_counter() - t0
    out = dict.fromkeys(GROUPS, 0.0)
    for e in prof.key_averages():
        out[_group(e.key)] += e.self_cpu_time_total / 1e3  # ms
    out["outside ops"] = max(0.0, wall * 1e3 - sum(out.values()))
    return {k: v / len(batches) for k, v in out.items()}


_LEGACY_LIBS: list = []  # the Library objects holding the patched kernels (kept alive)


def use_legacy_glue() -> None:
    """Puts back the per-call Python that ``torch.library.custom_op`` ran around
    ``gnncompile::spmm_sparse`` before section 40 of HISTORY.md (this process only; the variant
    gnncompile-pooled-glue-before): torch's generated autograd kernel (``make_autograd_impl``:
    defaults refilled at every forward, a dataclass for the dispatch keys) and its backend wrapper
    (Dynamo disabled around the kernel, the aliasing check of the outputs, the warnings silenced at
    every call). The same kernel and formulas, so the same bits."""
    import warnings as _w

    from torch._library import autograd as _la, utils as _lu

    from gnncompile.ops import vendor as V

    op = torch.ops.gnncompile.spmm_sparse.default
    lib = torch.library.Library("gnncompile", "FRAGMENT")
    _LEGACY_LIBS.append(lib)
    lib.impl("spmm_sparse", _la.make_autograd_impl(op, _la.Info(V._backward, V._setup)), "Autograd",
             with_keyset=True)

    @torch._disable_dynamo
    def wrapped(*args, **kwargs):
        with _w.catch_warnings():
            _w.simplefilter("ignore", UserWarning)
            return V._spmm_sparse_impl(*args, **kwargs)

    def backend_impl(*args, **kwargs):
        result = wrapped(*args, **kwargs)
        _lu._c_check_aliasing_constraint("spmm_sparse", args, kwargs, result, lambda: V)
        return result
    lib.impl("spmm_sparse", backend_impl, "CompositeExplicitAutograd")


def measure(kind: str, variant: str, dataset: list, opts) -> dict:
    from torch._dynamo.utils import counters

    torch.set_num_threads(opts.threads)
    counters.clear()
    if variant in LOADER_VARIANTS:
        use_legacy_loader()
    if variant in GLUE_VARIANTS:
        use_legacy_glue()
    model0 = build_model(kind)
    ref, model = copy.deepcopy(model0), copy.deepcopy(model0)
    run = wrap(model, variant)
    opt = torch.optim.Adam(model.parameters(), lr=1e-3)
    loader = make_loader(dataset, opts.batch_size, variant)
    losses = []

    def step(b):
        opt.zero_grad(set_to_none=True)
        loss = _loss(run, b)
        loss.backward()
        opt.step()
        losses.append(float(loss))

    # epoch 1, compile included; the first loss against eager's (not timed)
    t0, ref_s, expect = time.perf_counter(), 0.0, None
    for b in loader:
        if expect is None:
            t1 = time.perf_counter()
            with torch.no_grad():
                expect = float(_loss(ref, b))
            ref_s = time.perf_counter() - t1
        step(b)
    first_epoch = time.perf_counter() - t0 - ref_s
    if abs(losses[0] - expect) > 1e-4 * abs(expect):
        raise AssertionError(f"{kind}/{variant}: first loss {losses[0]} != eager {expect}")
    graphs_after_first = counters["stats"]["unique_graphs"]
    breaks = sum(counters["graph_break"].values())
    epochs = []
    for _ in range(opts.epochs):  # end to end: loader + steps
        t0 = time.perf_counter()
        for b in loader:
            step(b)
        epochs.append(time.perf_counter() - t0)
    loader_alone = []  # the loader without steps: its epoch
    for _ in range(opts.epochs):
        t0 = time.perf_counter()
        for b in loader:
            pass
        loader_alone.append(time.perf_counter() - t0)
    # the model alone, on batches collated beforehand (clones: a pooled batch is a view of a slot)
    pre = [b.clone() for b in make_loader(dataset, opts.batch_size, "eager")]
    for b in pre[:2]:
        step(b)
    steps = []
    for _ in range(opts.repeats):
        for b in pre:
            t0 = time.perf_counter()
            step(b)
            steps.append(time.perf_counter() - t0)
    # the model alone, each step on a fresh copy of the batch's edge_index (as a loader's)
    from gnncompile.ops.structure import prepare_structure

    fresh = []
    for _ in range(opts.repeats):
        for b in pre:
            b.edge_index = b.edge_index.clone()
            if variant in PREPARED:
                prepare_structure(b.edge_index, b.num_nodes)
            t0 = time.perf_counter()
            step(b)
            fresh.append(time.perf_counter() - t0)
    recompiles = counters["stats"]["unique_graphs"] - graphs_after_first
    parts = breakdown(step, pre)
    compiled = variant not in ("eager",) + ALLOCATOR_VARIANTS
    return {"model": kind, "variant": variant, "first_epoch_s": first_epoch, "epoch_s": statistics.median(epochs),
            "epoch_times_s": epochs, "loader_s": statistics.median(loader_alone), "step_s": statistics.median(steps), "step_fresh_s": statistics.median(fresh),
            "batches": len(pre),
            "first_loss": losses[0], "first_loss_eager": expect, "last_loss": losses[-1],
            "graph_breaks": breaks if compiled else 0,
            "graphs_compiled": counters["stats"]["unique_graphs"] if compiled else 0,
            "recompiles_after_first_epoch": recompiles if compiled else 0, "breakdown_ms": parts,
            "guard": [str(d) for d in run.guard_decisions()] if hasattr(run, "guard_decisions") else [],
            "threads": torch.get_num_threads()}


def combine(rounds: list, eager: list) -> dict:
    """One variant's rounds as one result: medians of the times, of the breakdown and of the
    ratios to eager's run of the same round; the largest graph-break and recompile counts."""
    ok = [r for r in rounds if "epoch_s" in r]
    if not ok:
        return rounds[0] if rounds else {"error": "no run"}
    med = statistics.median
    out = dict(ok[0])
    for k in ("first_epoch_s", "epoch_s", "step_s", "step_fresh_s", "loader_s"):
        if all(k in r for r in ok):
            out[k] = med(r[k] for r in ok)
    # each ratio to eager over the rounds' pairs: geometric mean and 95% Student's t interval
    from gnncompile.tuner import noise

    pairs_ok = [(r, e) for r, e in zip(rounds, eager or []) if "epoch_s" in r and "epoch_s" in e]
    for k in ("epoch_s", "step_s"):
        if pairs_ok:  # throughputs: 1 / time
            out[f"eager_over_{k}_interval"] = noise.ratio_interval([1 / r[k] for r, _ in pairs_ok],
                                                                   [1 / e[k] for _, e in pairs_ok])
    for k in ("graph_breaks", "graphs_compiled", "recompiles_after_first_epoch"):
        out[k] = max(r[k] for r in ok)
    out["breakdown_ms"] = {g: med(r["breakdown_ms"][g] for r in ok) for g in GROUPS}
    pairs = [(r, e) for r, e in zip(rounds, eager or []) if "epoch_s" in r and "epoch_s" in e]
    for k in ("first_epoch_s", "epoch_s", "step_s", "step_fresh_s"):
        if pairs:  # eager / variant, round by round (> 1: the variant is faster)
            out[f"eager_over_{k}"] = med(e[k] / r[k] for r, e in pairs)
    out["rounds"] = rounds  # (out["guard"]: the first round's speed-guard decisions)
    return out


def child(kind: str, variant: str, opts) -> dict:
    cmd = _common.module_command("molecules") + [
        "--child", f"{kind}:{variant}", "--graphs", str(opts.graphs), "--batch-size", str(opts.batch_size),
        "--epochs", str(opts.epochs), "--repeats", str(opts.repeats), "--threads", str(opts.threads)]
    return _common.run_child(cmd, _common.timing_env(opts.threads), opts.timeout, tail_chars=2000)


# ----------------------------------------------------------------------------- report
def markdown(p: dict) -> str:
    head = ["model", "variant", "end to end s / epoch", "vs eager", "vs eager, geo. mean [95% interval]",
            "loader alone s / epoch", "model alone ms / step", "vs eager", "vs eager, geo. mean [95% interval]",
            "model alone, fresh edge_index ms / step",
            "first epoch s (compile incl.)", "vs eager's first", "graph breaks", "recompiles after epoch 1",
            "first loss (eager)"]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for kind, runs in p["results"].items():
        for v, r in runs.items():
            if "epoch_s" not in r:
                lines.append(f"| {kind} | {v} | error: {r.get('error', '')[:300]} |" + " |" * (len(head) - 3))
                continue

            def ratio(key):
                return f"{r['eager_over_' + key]:.2f}x" if "eager_over_" + key in r else "n/a"

            def interval(key):
                iv = r.get("eager_over_" + key + "_interval")
                if not iv:
                    return "n/a"
                if iv.get("low") is None:
                    return f"{iv['ratio']:.2f}x"
                return f"{iv['ratio']:.2f}x [{iv['low']:.2f}, {iv['high']:.2f}]"

            first = (f"{1 / r['eager_over_first_epoch_s']:.2f}x" if "eager_over_first_epoch_s" in r else "n/a")
            loader_s = f"{r['loader_s']:.4f}" if "loader_s" in r else "n/a"
            lines.append("| " + " | ".join([
                kind, v, f"{r['epoch_s']:.3f}", ratio("epoch_s"), interval("epoch_s"), loader_s,
                f"{r['step_s'] * 1e3:.2f}", ratio("step_s"), interval("step_s"),
                f"{r['step_fresh_s'] * 1e3:.3f}",
                f"{r['first_epoch_s']:.2f}", first, str(r["graph_breaks"]), str(r["recompiles_after_first_epoch"]),
                f"{r['first_loss']:.6f} ({r['first_loss_eager']:.6f})"]) + " |")
    lines += ["", "Per-step breakdown (ms / step under torch.profiler, prebuilt batches; the profiler adds "
              "its own cost to every op):", "",
              "| model | variant | " + " | ".join(GROUPS) + " |", "|---|---|" + "---|" * len(GROUPS)]
    for kind, runs in p["results"].items():
        for v, r in runs.items():
            if "breakdown_ms" in r:
                lines.append(f"| {kind} | {v} | " + " | ".join(f"{r['breakdown_ms'][g]:.2f}" for g in GROUPS) + " |")
    guarded = [(kind, v, g) for kind, runs in p["results"].items() for v, r in runs.items()
               for g in r.get("guard", []) if "(training)" in g]
    if guarded:
        lines += ["", "What the speed guard kept (first round, training calls):", ""]
        lines += [f"- {kind} / {v}: {g}" for kind, v, g in guarded]
    d, m = p["dataset"], p["machine"]
    lines += ["", f"{d['graphs']} generated graphs ({d['nodes_min']}-{d['nodes_max']} nodes, mean {d['nodes_mean']:.1f} "
              f"nodes and {d['edges_mean']:.1f} directed edges, average degree {d['degree']:.2f}; F = {F}, edge features "
              f"{EDGE_DIM}), batches of {p['batch_size']} shuffled ({p['batches_per_epoch']} a epoch). Models: "
              f"{LAYERS} layers of width {HIDDEN}, global_add_pool(h, batch) with no graph count, Linear, Adam. "
              f"End to end: median of {p['epochs']} epochs after the first (loader + steps); loader alone: "
              f"median of as many passes of the variant's loader with no step. Model alone: median "
              f"step over {p['repeats']} passes of batches collated beforehand. Each model x variant in a process "
              f"of its own, {p['rounds']} rounds in turn; times are medians over the rounds, ratios the median of "
              f"each round's ratio to eager's run of that round (vs eager: eager / variant, > 1 is faster; first "
              f"epoch: variant / eager; geo. mean: of the rounds' paired ratios, with its 95% Student's t "
              f"interval). {p['threads']} threads; CPU: {p['cpu']}; torch {m['torch']}. "
              f"{_common.load_text(p['loadavg_before_after'])} (a shared machine). Model alone, fresh edge_index: "
              f"the same, each step on a new copy of the batch's edge_index (structures prepared for it before the "
              f"timed step in {', '.join(PREPARED)}). Command: `{p['command']}`"]
    return "\n".join(lines) + "\n"


def plot(p: dict, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    kinds = list(p["results"])
    fig, axes = plt.subplots(1, 2, figsize=(11, 3.8))
    for ax, key, title in ((axes[0], "epoch_s", "end to end, eager / variant"),
                           (axes[1], "step_s", "model alone, eager / variant")):
        width = 0.8 / max(1, len(p["variants"]))
        for j, v in enumerate(p["variants"]):
            vals = [p["results"][k].get(v, {}).get("eager_over_" + key, 0.0) for k in kinds]
            ax.bar([i + j * width for i in range(len(kinds))], vals, width, label=v)
        ax.axhline(1.0, color="gray", lw=0.8)
        ax.set_xticks([i + 0.4 - width / 2 for i in range(len(kinds))], kinds)
        ax.set_title(title, fontsize=9)
    axes[0].legend(fontsize=7)
    fig.suptitle(f"molecule batches ({p['dataset']['graphs']} graphs, batch {p['batch_size']}, "
                 f"{p['threads']} threads): higher is faster", fontsize=9)
    fig.tight_layout()
    fig.savefig(path, dpi=120)


def main(argv=None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true", help="512 graphs, 1 timed epoch, 1 pass")
    ap.add_argument("--graphs", type=int, default=None, help="default 4000 (quick 512)")
    ap.add_argument("--batch-size", type=int, default=128)
    ap.add_argument("--epochs", type=int, default=None, help="timed epochs after the first (default 3, quick 1)")
    ap.add_argument("--repeats", type=int, default=None, help="passes over the prebuilt batches (default 3, quick 1)")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--rounds", type=int, default=None, help="processes per model x variant, in turn (default 3, quick 1)")
    ap.add_argument("--models", default=",".join(MODELS), help="comma list of " + ", ".join(MODELS))
    ap.add_argument("--variants", default=",".join(VARIANTS), help="comma list of " + ", ".join(VARIANTS))
    ap.add_argument("--timeout", type=int, default=1800, help="seconds per process")
    ap.add_argument("--guard", choices=("time", "off"), default=None,
                    help="the speed guard of the compiled variants ($GNNCOMPILE_GUARD; default: as set, else "
                         "time); off keeps every rewritten graph, for A/B runs of what the rewritten graph does")
    ap.add_argument("--out", default=None)
    ap.add_argument("--results-dir", default=str(_common.RESULTS))
    ap.add_argument("--child", default=None, help=argparse.SUPPRESS)
    opts = ap.parse_args(argv)
    warnings.simplefilter("ignore")
    if opts.guard is not None and not opts.child:
        import os

        os.environ["GNNCOMPILE_GUARD"] = opts.guard  # the children's environment
    opts.graphs = opts.graphs or (512 if opts.quick else 4000)
    opts.epochs = opts.epochs or (1 if opts.quick else 3)
    opts.repeats = opts.repeats or (1 if opts.quick else 3)
    opts.rounds = opts.rounds or (1 if opts.quick else 3)
    if opts.child:
        kind, variant = opts.child.split(":")
        out = measure(kind, variant, make_dataset(opts.graphs), opts)
        print("RESULT " + json.dumps(out), flush=True)
        return out
    models = [m.strip() for m in opts.models.split(",") if m.strip()]
    variants = [v.strip() for v in opts.variants.split(",") if v.strip()]
    bad = [m for m in models if m not in MODELS] + [v for v in variants if v not in VARIANTS + STRUCT_VARIANTS + ALLOCATOR_VARIANTS + LOADER_VARIANTS + GLUE_VARIANTS]
    if bad:
        ap.error(f"unknown models / variants {bad}; known: {', '.join(MODELS)} / {', '.join(VARIANTS)}")
    load_before = _common.loadavg()
    runs = {kind: {v: [] for v in variants} for kind in models}
    for rnd in range(opts.rounds):  # round-robin: a drift of the machine's speed hits every variant
        for kind in models:
            for v in variants:
                r = child(kind, v, opts)
                runs[kind][v].append(r)
                print(f"round {rnd + 1} {kind:<5} {v:<18} " + (
                    f"epoch {r['epoch_s']:.3f} s, step {r['step_s'] * 1e3:.2f} ms, first epoch "
                    f"{r['first_epoch_s']:.2f} s, breaks {r['graph_breaks']}, recompiles "
                    f"{r['recompiles_after_first_epoch']}" if "epoch_s" in r else str(r)), flush=True)
    results = {kind: {v: combine(runs[kind][v], runs[kind].get("eager")) for v in variants} for kind in models}
    ds = make_dataset(opts.graphs)
    nodes = [d.num_nodes for d in ds]
    edges = sum(d.num_edges for d in ds)
    payload = {"machine": _common.machine(), "cpu": _common.cpu_model(), "loadavg_before_after": [load_before, _common.loadavg()],
               "dataset": {"graphs": opts.graphs, "nodes_min": min(nodes), "nodes_max": max(nodes),
                           "nodes_mean": sum(nodes) / len(nodes), "edges_mean": edges / len(ds),
                           "degree": edges / sum(nodes)},
               "batch_size": opts.batch_size, "batches_per_epoch": -(-opts.graphs // opts.batch_size),
               "epochs": opts.epochs, "repeats": opts.repeats, "rounds": opts.rounds, "threads": opts.threads,
               "models": models,
               "variants": variants, "results": results, "command": _common.command("molecules", argv)}
    name = opts.out or ("molecules_quick" if opts.quick else "molecules")
    _common.write_results(Path(opts.results_dir), name, payload, markdown, plot)
    return payload


if __name__ == "__main__":
    main()
