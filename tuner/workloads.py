"""Workloads the tuner measures: what is trained, and how throughput is measured.

Three kinds:

* ``fullgraph``: one generated power-law graph (:func:`gnncompile.data.synthetic.power_law_graph`),
  node classification, one optimizer step per epoch; throughput in epochs/s.
* ``graphs``: mini-batch graph classification over a generated dataset of many small graphs
  (:func:`gnncompile.data.synthetic.graph_dataset`), a pooled readout; throughput in graphs/s.
* ``neighbor``: node classification on one large generated power-law graph, trained on sampled
  subgraphs (:class:`gnncompile.data.NeighborLoader`, ``fanout`` neighbors per hop, seeds drawn
  from the first ``train_fraction`` of a fixed permutation of the nodes); the loss is taken on
  each batch's seed nodes (its first ``batch_size`` rows, as PyG's examples do); throughput in
  seed nodes trained per second (seeds/s).

:func:`measure` runs ``warmup`` steps (compilation, allocator, worker start-up), then times
``steps`` steps in ``chunks`` pieces, calling ``report(step, throughput_so_far)`` after each
(the tuner prunes on it), and returns the throughput and the peak memory of the run.
:func:`interleaved` is a short A/B: several settings, each compiled and warmed once, then
trained a few steps each in turn for some rounds (the check of a transferred profile,
:mod:`gnncompile.transfer`).

A data-parallel trial (``Workload(kind="neighbor", ranks=N)``, N > 1): :func:`measure` runs the
trial as N gloo rank processes on this host (``MASTER_ADDR=127.0.0.1``, a free port per trial),
each with 1 torch thread unless the settings' ``threads`` says otherwise (``threads`` is per
rank), its own equal share of the training seeds (:class:`gnncompile.data.NeighborLoader`'s
``num_replicas`` / ``rank`` split with the remainder left out), and the model as
``DistributedDataParallel(gnncompile.compile(model, ...))``
with the trial's compile settings (``DDP(model)`` uncompiled). The throughput is the ranks'
combined one: the seeds of every rank over the slowest rank's wall time; the peak memory is the
largest rank's; progress is reported per chunk as for one process. A rank that fails, or ranks
still running at the run's deadline (:mod:`tuner.guard`) or after ``timeout`` seconds
(:data:`DDP_TIMEOUT_S` without one), end the measurement with :class:`RankFailed` (the rank's
error and the tail of its stderr in the message); every rank's process group (its loader workers
included) is killed on the way out, whatever ended it.
"""
from __future__ import annotations

import json
import math
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import warnings
from dataclasses import asdict, dataclass, field
from functools import lru_cache
from typing import Any, Callable, Dict, List, Optional, Tuple

import torch

from gnncompile.config import child_environment

from . import guard as _guard
from .guard import checkpoint

with warnings.catch_warnings():
    warnings.simplefilter("ignore")
    import torch_geometric.nn as gnn
    from torch_geometric.nn import models as pyg_models

MODELS = ("gcn", "sage", "gin", "gat")
KINDS = ("fullgraph", "graphs", "neighbor")
#: The batch sizes (seed nodes) the tuner searches on a neighbor workload unless given a range.
NEIGHBOR_BATCH_RANGE = (128, 4096)
#: seconds a data-parallel trial's ranks may run when no deadline of the run bounds them sooner
DDP_TIMEOUT_S = 900.0


@dataclass
class Workload:
    kind: str = "graphs"
    model: str = "gin"
    hidden: int = 64
    layers: int = 3
    num_features: int = 16
    num_classes: int = 2
    compiled: bool = True
    # fullgraph, neighbor
    num_nodes: int = 20000
    num_edges: int = 200000
    # neighbor: neighbors sampled per hop, and the share of the nodes that are training seeds
    fanout: List[int] = field(default_factory=lambda: [15, 10])
    train_fraction: float = 0.1
    # neighbor: data-parallel rank processes per trial (1: the trial runs in this process)
    ranks: int = 1
    # the fused spmm may gather bfloat16 (choices['precision'] = 'bf16', an opt-in lower
    # precision): only then does the tuner search the precision (--allow-bf16)
    allow_bf16: bool = False
    # graphs
    num_graphs: int = 20000
    min_nodes: int = 10
    max_nodes: int = 40
    seed: int = 0
    # measurement
    warmup: int = 10
    steps: int = 40
    chunks: int = 4

    def __post_init__(self):
        if self.kind not in KINDS:
            raise ValueError(f"workload kind must be one of {KINDS}, got {self.kind!r}")
        if self.model not in MODELS:
            raise ValueError(f"model must be one of {MODELS}, got {self.model!r}")
        if isinstance(self.ranks, bool) or not isinstance(self.ranks, int) or self.ranks < 1:
            raise ValueError(f"ranks must be an integer >= 1, got {self.ranks!r}")
        if not isinstance(self.allow_bf16, bool):
            raise ValueError(f"allow_bf16 must be True or False, got {self.allow_bf16!r}")
        if self.allow_bf16 and not self.compiled:
            raise ValueError("allow_bf16 needs a compiled workload (bf16 is a choice of the compiled model's fused spmm)")
        if self.ranks > 1 and self.kind != "neighbor":
            raise ValueError(f"ranks > 1 (a data-parallel trial) needs the neighbor workload, got "
                             f"kind={self.kind!r}")
        if self.kind == "neighbor":
            self.fanout = _check_fanout(self.fanout)
            if isinstance(self.train_fraction, bool) or not 0 < float(self.train_fraction) <= 1:
                raise ValueError(f"train_fraction must be in (0, 1], got {self.train_fraction!r}")
            self.train_fraction = float(self.train_fraction)
            if self.num_nodes < 1 or round(self.num_nodes * self.train_fraction) < 1:
                raise ValueError(f"a neighbor workload needs at least one training node: num_nodes="
                                 f"{self.num_nodes}, train_fraction={self.train_fraction}")
            if round(self.num_nodes * self.train_fraction) < self.ranks:
                raise ValueError(f"a neighbor workload with ranks={self.ranks} needs at least one training "
                                 f"node per rank: num_nodes={self.num_nodes}, train_fraction={self.train_fraction}")

    def signature_dict(self) -> Dict[str, Any]:
        """What identifies the workload in a profile (not the measurement lengths)."""
        d = {"kind": self.kind, "model": self.model, "hidden": self.hidden, "layers": self.layers,
             "num_features": self.num_features, "num_classes": self.num_classes,
             "compiled": self.compiled}
        if self.kind in ("fullgraph", "neighbor"):
            d.update(num_nodes=self.num_nodes, num_edges=self.num_edges)
            if self.kind == "neighbor":
                d.update(fanout=list(self.fanout), train_fraction=self.train_fraction)
                if self.ranks > 1:  # absent for one process: the signatures of earlier studies hold
                    d["ranks"] = self.ranks
        else:
            d.update(num_graphs=self.num_graphs, min_nodes=self.min_nodes, max_nodes=self.max_nodes)
        if self.allow_bf16:  # absent unless allowed: the signatures of earlier studies hold
            d["allow_bf16"] = True
        return d

    @property
    def unit(self) -> str:
        return {"fullgraph": "epochs/s", "graphs": "graphs/s", "neighbor": "seeds/s"}[self.kind]


def _check_fanout(fanout: Any) -> List[int]:
    """A list of ints >= 1 (or -1: every neighbor), one per hop."""
    if isinstance(fanout, (str, bytes)) or not hasattr(fanout, "__iter__"):
        raise ValueError(f"fanout must be a list of ints, one per hop, got {fanout!r}")
    out = list(fanout)
    if not out or any(isinstance(k, bool) or not isinstance(k, int) or (k < 1 and k != -1) for k in out):
        raise ValueError(f"fanout must be a non-empty list of ints >= 1 (or -1: all neighbors), got {fanout!r}")
    return out


class GraphClassifier(torch.nn.Module):
    """A PyG model from ``torch_geometric.nn.models``, a sum readout and a linear head."""

    def __init__(self, body: torch.nn.Module, hidden: int, num_classes: int) -> None:
        super().__init__()
        self.body = body
        self.head = torch.nn.Linear(hidden, num_classes)

    def forward(self, x, edge_index, batch):
        h = self.body(x, edge_index)
        return self.head(gnn.global_add_pool(h, batch))


def build_model(w: Workload) -> torch.nn.Module:
    out = w.hidden if w.kind == "graphs" else w.num_classes
    cls = {"gcn": pyg_models.GCN, "sage": pyg_models.GraphSAGE, "gin": pyg_models.GIN,
           "gat": pyg_models.GAT}[w.model]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        body = cls(w.num_features, w.hidden, w.layers, out)
    return GraphClassifier(body, w.hidden, w.num_classes) if w.kind == "graphs" else body


@lru_cache(maxsize=2)
def _dataset(num_graphs, min_nodes, max_nodes, num_features, num_classes, seed):
    from gnncompile.data.synthetic import graph_dataset

    return graph_dataset(num_graphs, min_nodes, max_nodes, num_features, num_classes, seed=seed)


def dataset_for(w: Workload):
    return _dataset(w.num_graphs, w.min_nodes, w.max_nodes, w.num_features, w.num_classes, w.seed)


@lru_cache(maxsize=2)
def _graph(num_nodes, num_edges, num_features, num_classes, seed):
    from gnncompile.data.synthetic import power_law_graph

    g = torch.Generator().manual_seed(seed)
    ei = power_law_graph(num_nodes, num_edges, seed=seed)
    x = torch.randn(num_nodes, num_features, generator=g)
    y = torch.randint(0, num_classes, (num_nodes,), generator=g)
    return x, ei, y


def _rss_bytes() -> int:
    try:
        with open("/proc/self/statm") as f:
            return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    except (OSError, ValueError):
        return 0


def default_settings(w: Workload, device_props: Optional[dict] = None, batch_size: int = 128) -> Dict[str, Any]:
    """The baseline a tuned profile is compared with: PyG's DataLoader with its defaults (on a
    neighbor workload, :class:`gnncompile.data.NeighborLoader` with its defaults: no workers, no
    prefetch), torch's thread count as it is (1 per rank of a data-parallel trial), the kernels'
    default knobs."""
    from gnncompile.hardware import device as _device

    p = _device.detect() if device_props is None else device_props
    # data-parallel ranks: 1 thread each, as torchrun starts them (OMP_NUM_THREADS=1)
    threads = 1 if w.ranks > 1 else torch.get_num_threads()
    return {"loader": "neighbor" if w.kind == "neighbor" else "pyg",
            "batch_size": batch_size if w.kind in ("graphs", "neighbor") else None,
            "pool_size": None, "num_workers": 0, "pin_memory": False, "persistent_workers": False,
            "threads": threads, "knobs": _device.default_settings(p)["knobs"],
            "inner": None, "spmm_impl": None, "precision": None}


class MemoryBudgetExceeded(RuntimeError):
    pass


class _MemoryWatch:
    """Peak memory over a run: on CUDA the peak allocated bytes; on CPU the growth of this
    process's resident set (workers not included). Raises MemoryBudgetExceeded past ``budget``."""

    def __init__(self, dev: torch.device, budget: Optional[int]) -> None:
        self.dev, self.budget, self.peak = dev, budget, 0
        if dev.type == "cuda":
            torch.cuda.reset_peak_memory_stats(dev)
        self.rss0 = _rss_bytes()

    def check(self) -> None:
        used = (torch.cuda.max_memory_allocated(self.dev) if self.dev.type == "cuda"
                else max(_rss_bytes() - self.rss0, 0))
        self.peak = max(self.peak, used)
        if self.budget is not None and self.peak > self.budget:
            raise MemoryBudgetExceeded(f"peak memory {self.peak} > budget {self.budget}")


def _graph_loader(ds, bs: int, settings: Dict[str, Any], dev: torch.device):
    """PyG's DataLoader (``loader='pyg'``) or the pooled loader, with the settings under test."""
    workers = int(settings.get("num_workers") or 0)
    if settings.get("loader", "pooled") == "pyg":
        from torch_geometric.loader import DataLoader

        return DataLoader(ds, batch_size=bs, shuffle=True, num_workers=workers,
                          pin_memory=bool(settings.get("pin_memory")) and dev.type == "cuda",
                          persistent_workers=bool(settings.get("persistent_workers")) and workers > 0)
    from gnncompile.data import PooledLoader

    return PooledLoader(ds, batch_size=bs, shuffle=True, pool_size=int(settings.get("pool_size") or 2),
                        num_workers=workers, pin_memory=bool(settings.get("pin_memory")),
                        persistent_workers=bool(settings.get("persistent_workers")),
                        device=dev if dev.type == "cuda" else None)


@lru_cache(maxsize=2)
def _neighbor_data(num_nodes, num_edges, num_features, num_classes, seed, train_fraction):
    """The neighbor workload's graph (a Data on the CPU, where the sampler runs) and its training
    nodes: the first ``train_fraction`` of a permutation drawn from ``seed``."""
    from torch_geometric.data import Data

    x, ei, y = _graph(num_nodes, num_edges, num_features, num_classes, seed)
    g = torch.Generator().manual_seed(seed + 1)
    train = torch.randperm(num_nodes, generator=g)[:max(1, round(num_nodes * train_fraction))]
    return Data(x=x, edge_index=ei, y=y, num_nodes=num_nodes), train


def neighbor_data(w: Workload):
    """(graph, training node ids) of a neighbor workload (cached: the CSC the sampler builds for
    the graph is shared by every trial)."""
    return _neighbor_data(w.num_nodes, w.num_edges, w.num_features, w.num_classes, w.seed,
                          w.train_fraction)


def prepare(w: Workload) -> None:
    """Builds the workload's data (cached per process: the dataset, the graph) before the first
    measurement, so that the first trial of a run takes as long as the next ones: a run with a
    timeout plans the rest of its time with the trials' durations (:mod:`tuner.study`)."""
    if w.kind == "graphs":
        dataset_for(w)
    elif w.kind == "neighbor":
        if w.ranks == 1:  # a data-parallel trial's ranks build it, each in its own process
            neighbor_data(w)
    else:
        _graph(w.num_nodes, w.num_edges, w.num_features, w.num_classes, w.seed)


def _neighbor_loader(w: Workload, settings: Dict[str, Any], dev: torch.device, rank: Optional[int] = None):
    """:class:`gnncompile.data.NeighborLoader` with the settings under test; ``pool_size`` is
    the batches in flight, the DataLoader's prefetch depth (``prefetch_factor`` per worker), as
    ``NeighborLoader(profile=...)`` applies it. ``rank``: this rank's shard of the seeds (a
    data-parallel trial), as many seeds on every rank: the loader's own split
    (``num_replicas=``, ``rank=``, ``shard_drop_last=True``, the same seed on every rank)."""
    from gnncompile.data import NeighborLoader

    data, train = neighbor_data(w)
    kw: Dict[str, Any] = {}
    if rank is not None:
        kw.update(num_replicas=w.ranks, rank=rank, shard_drop_last=True)
    workers = int(settings.get("num_workers") or 0)
    if workers > 0 and settings.get("pool_size"):
        kw["prefetch_factor"] = max(1, math.ceil(int(settings["pool_size"]) / workers))
    return NeighborLoader(data, list(w.fanout), input_nodes=train, batch_size=int(settings["batch_size"]),
                          shuffle=True, seed=w.seed, num_workers=workers,
                          persistent_workers=bool(settings.get("persistent_workers")) and workers > 0,
                          pin_memory=bool(settings.get("pin_memory")) and dev.type == "cuda", **kw)


def _inputs(w: Workload, loader, dev: torch.device):
    """Endless (units, (x, edge_index, batch or None, y, k)): the one graph, or the loader's
    batches; ``k``: the loss is on the first k rows of the output (None: all)."""
    if w.kind == "fullgraph":
        x, ei, y = (t.to(dev) for t in _graph(w.num_nodes, w.num_edges, w.num_features,
                                              w.num_classes, w.seed))
        while True:
            yield 1, (x, ei, None, y, None)
    while True:
        for b in loader:
            if dev.type == "cuda" and b.x.device != dev:
                b = b.to(dev, non_blocking=True)
            if w.kind == "neighbor":
                k = int(b.batch_size)
                yield k, (b.x, b.edge_index, None, b.y[:k], k)
            else:
                yield b.num_graphs, (b.x, b.edge_index, b.batch, b.y, None)


def _timed(w: Workload, it, step, watch: _MemoryWatch, dev, report, on_chunk=None) -> float:
    """Throughput over ``w.steps`` steps, reported after each of ``w.chunks`` chunks
    (``on_chunk(chunk, units, seconds, peak_memory)`` too, when given)."""
    if dev.type == "cuda":
        torch.cuda.synchronize(dev)
    per_chunk = max(1, math.ceil(w.steps / max(w.chunks, 1)))
    units, t0, rate = 0, time.perf_counter(), 0.0
    for c in range(max(w.chunks, 1)):
        for _ in range(per_chunk):
            checkpoint()
            n, inp = next(it)
            step(inp)
            units += n
        if dev.type == "cuda":
            torch.cuda.synchronize(dev)
        watch.check()
        seconds = time.perf_counter() - t0
        rate = units / seconds
        if on_chunk is not None:
            on_chunk(c, units, seconds, watch.peak)
        if report is not None:
            report(c, rate)
    return rate


def measure(w: Workload, settings: Dict[str, Any], report: Optional[Callable[[int, float], None]] = None,
            device: Optional[str] = None, memory_budget: Optional[int] = None,
            timeout: Optional[float] = None) -> Tuple[float, int]:
    """Trains ``w`` with ``settings``; returns (throughput in ``w.unit``, peak memory in bytes).

    settings: ``loader`` ('pooled' or 'pyg', graphs only; a neighbor workload always uses
    :class:`gnncompile.data.NeighborLoader`), ``batch_size``, ``pool_size``,
    ``num_workers``, ``pin_memory``, ``persistent_workers``, ``threads``, ``knobs``, ``inner``
    (the inner compiler; None: the default), ``spmm_impl`` (the fused spmm's implementation,
    ``Settings.choices['spmm_impl']``; None: 'auto'), ``precision`` (``Settings.choices['precision']``,
    'fp32' or 'bf16'; None: fp32), ``compiled`` (overrides ``w.compiled``: a
    baseline of PyG's own eager model on a compiled workload).
    Peak memory: on CUDA the peak allocated bytes; on CPU the growth of this process's
    resident set over the run (workers not included). Raises MemoryBudgetExceeded when it
    passes ``memory_budget``. Inside a tuning run, :func:`tuner.guard.checkpoint` before each
    step raises KeyboardInterrupt after a Ctrl-C and DeadlineReached past the run's deadline.

    ``w.ranks`` > 1: a data-parallel trial, run as that many rank processes (module docstring;
    ``threads`` is per rank, 1 when not given); ``timeout``: seconds the ranks may run (default:
    :data:`DDP_TIMEOUT_S`; the run's deadline stops them sooner). Raises :class:`RankFailed`
    when a rank fails or they run past it.
    """
    if w.ranks > 1:
        return _measure_ranks(w, settings, report, device, memory_budget, timeout)
    return _train(w, settings, report, device, memory_budget)


def _train(w: Workload, settings: Dict[str, Any], report, device, memory_budget, rank: Optional[int] = None,
           on_chunk=None) -> Tuple[float, int]:
    """The measurement in this process; ``rank``: as that rank of a data-parallel trial (the
    process group is initialised: the model in DDP, the loader on the rank's shard)."""
    dev = torch.device(device or ("cuda" if torch.cuda.is_available() else "cpu"))
    old_threads = torch.get_num_threads()
    if settings.get("threads"):
        torch.set_num_threads(int(settings["threads"]))
    loader = it = None
    try:
        checkpoint()  # Ctrl-C or the run's deadline (tuner.guard): before and between the steps
        torch.manual_seed(w.seed)
        model = build_model(w).to(dev)
        fwd = _compile_with(model, settings, dev) if settings.get("compiled", w.compiled) else model
        if rank is not None:
            from torch.nn.parallel import DistributedDataParallel as DDP

            fwd = DDP(fwd, device_ids=[dev.index] if dev.type == "cuda" else None)
        opt = torch.optim.Adam(model.parameters(), lr=1e-3)
        watch = _MemoryWatch(dev, memory_budget)
        if w.kind == "graphs":
            ds, bs = dataset_for(w), int(settings["batch_size"])
            loader = _graph_loader(ds, bs, settings, dev)
        elif w.kind == "neighbor":
            loader = _neighbor_loader(w, settings, dev, rank)

        def step(inp):
            xx, ee, bb, yy, k = inp
            opt.zero_grad(set_to_none=True)
            out = fwd(xx, ee) if bb is None else fwd(xx, ee, bb)
            torch.nn.functional.cross_entropy(out if k is None else out[:k], yy).backward()
            opt.step()

        it = _inputs(w, loader, dev)
        # neighbor batches differ in size: a compiled model compiles the first for its sizes and
        # the second (other sizes) once more with symbolic sizes, then no more (torch's automatic
        # dynamic shapes); both in the warm-up
        warmup = max(w.warmup, 2) if w.kind == "neighbor" and w.warmup > 0 else w.warmup
        for _ in range(warmup):
            checkpoint()
            step(next(it)[1])
        if w.kind == "graphs" and w.warmup > 0:
            # the last batch of an epoch is smaller: a compiled model sees a new number of graphs
            # there and recompiles once (seconds with inductor), which a long training run pays
            # once per run, not per step; take it here, not in the timed steps
            checkpoint()
            step(_odd_batch(ds, bs, dev))
        watch.check()
        return _timed(w, it, step, watch, dev, report, on_chunk), watch.peak
    finally:
        _close(it, loader)
        torch.set_num_threads(old_threads)


class _Arm:
    """One side of :func:`interleaved`: the model compiled with ``settings``, its optimizer,
    loader and batches, built once and trained a chunk of steps at a time."""

    def __init__(self, w: Workload, settings: Dict[str, Any], dev: torch.device) -> None:
        self.w, self.settings, self.dev = w, settings, dev
        self.threads = int(settings["threads"]) if settings.get("threads") else None
        self.loader = self.it = None
        torch.manual_seed(w.seed)
        model = build_model(w).to(dev)
        self.fwd = _compile_with(model, settings, dev) if settings.get("compiled", w.compiled) else model
        self.opt = torch.optim.Adam(model.parameters(), lr=1e-3)
        if w.kind == "graphs":
            self.ds, self.bs = dataset_for(w), int(settings["batch_size"])
            self.loader = _graph_loader(self.ds, self.bs, settings, dev)
        elif w.kind == "neighbor":
            self.loader = _neighbor_loader(w, settings, dev)
        self.it = _inputs(w, self.loader, dev)

    def step(self, inp) -> None:
        xx, ee, bb, yy, k = inp
        self.opt.zero_grad(set_to_none=True)
        out = self.fwd(xx, ee) if bb is None else self.fwd(xx, ee, bb)
        torch.nn.functional.cross_entropy(out if k is None else out[:k], yy).backward()
        self.opt.step()

    def warm(self) -> None:
        w = self.w
        warmup = max(w.warmup, 2) if w.kind == "neighbor" else max(w.warmup, 1)
        for _ in range(warmup):
            checkpoint()
            self.step(next(self.it)[1])
        if w.kind == "graphs":
            self.step(_odd_batch(self.ds, self.bs, self.dev))  # the epoch's last, smaller batch

    def run(self, steps: int) -> float:
        """Throughput over ``steps`` steps."""
        if self.dev.type == "cuda":
            torch.cuda.synchronize(self.dev)
        units, t0 = 0, time.perf_counter()
        for _ in range(steps):
            checkpoint()
            n, inp = next(self.it)
            self.step(inp)
            units += n
        if self.dev.type == "cuda":
            torch.cuda.synchronize(self.dev)
        return units / (time.perf_counter() - t0)

    def close(self) -> None:
        _close(self.it, self.loader)


def interleaved(w: Workload, arms: List[Dict[str, Any]], rounds: int, steps: int,
                device: Optional[str] = None) -> List[List[float]]:
    """A short A/B (A/B/C...): each arm's model is compiled and warmed once (``w.warmup`` steps),
    then the arms train ``steps`` steps each in turn, ``rounds`` times, the order reversed every
    other round (A B, B A, ...: a drift of the machine's speed falls on both); returns each arm's
    throughputs (``w.unit``), one per round, the i-th of each measured side by side (pairs for
    :func:`tuner.noise.ratio_interval`). Each arm runs with its own ``threads`` (torch's thread
    count is restored at the end). Unlike :func:`measure`, nothing is compiled between rounds,
    so a round costs only its steps. One process only (``w.ranks`` must be 1)."""
    if w.ranks != 1:
        raise ValueError("interleaved: a data-parallel workload (ranks > 1) is measured with measure()")
    if rounds < 1 or steps < 1 or not arms:
        raise ValueError(f"interleaved: needs arms, rounds >= 1 and steps >= 1; got {len(arms)} arm(s), "
                         f"rounds={rounds}, steps={steps}")
    dev = torch.device(device or ("cuda" if torch.cuda.is_available() else "cpu"))
    old_threads = torch.get_num_threads()
    built: List[_Arm] = []
    try:
        for s in arms:  # every arm compiled (lazily) before any runs: each compile resets dynamo
            built.append(_Arm(w, s, dev))
        for a in built:
            torch.set_num_threads(a.threads or old_threads)
            a.warm()
        out: List[List[float]] = [[] for _ in built]
        for r in range(rounds):
            order = list(range(len(built)))
            if r % 2:
                order.reverse()
            for i in order:
                torch.set_num_threads(built[i].threads or old_threads)
                out[i].append(built[i].run(steps))
        return out
    finally:
        for a in built:
            a.close()
        torch.set_num_threads(old_threads)


def _close(it, loader) -> None:
    """Ends the run's batches now: the PooledLoader's close(); for a torch DataLoader (the
    NeighborLoader), its worker processes are shut down here, not whenever the garbage collector
    gets to the iterator (a collection inside the next trial's freshly forked workers would try
    to shut down workers that are not their children)."""
    if it is not None:
        it.close()  # drops the generator's iterator over the loader
    if loader is None:
        return
    if hasattr(loader, "close"):
        loader.close()
    persistent = getattr(loader, "_iterator", None)  # kept by persistent_workers
    if persistent is not None and hasattr(persistent, "_shutdown_workers"):
        persistent._shutdown_workers()
        loader._iterator = None


def _odd_batch(ds, bs: int, dev):
    from torch_geometric.data import Batch

    k = max(1, min(len(ds), bs) // 2 + 1)
    b = Batch.from_data_list([ds[i] for i in range(k)]).to(dev)
    return b.x, b.edge_index, b.batch, b.y, None


def _compile_with(model, settings, dev):
    """The model compiled with the knobs under test (carried by the compiled model, whatever
    was compiled before in this process), the rewritten form always: a trial measures what the
    knobs do, so the speed guard, which could keep the unrewritten form, is off."""
    import gnncompile

    torch._dynamo.reset()
    knobs = settings.get("knobs")
    chosen = {"choices": {"guard": "off"}}
    if settings.get("spmm_impl"):
        chosen["choices"]["spmm_impl"] = settings["spmm_impl"]
    if settings.get("precision"):
        chosen["choices"]["precision"] = settings["precision"]
    if knobs is not None:
        chosen["knobs"] = {dev.type: list(knobs)}
    return gnncompile.compile(model, profile=None, inner=settings.get("inner") or "auto", settings=chosen)


# ----------------------------------------------------------------------------- data-parallel trials
class RankFailed(RuntimeError):
    """A rank of a data-parallel trial failed, or the ranks ran past their time (the message
    names the rank and ends with the tail of its stderr)."""


_TAG = "GNNCOMPILE-RANK "  # the lines a rank writes to its stdout for the process that runs it
_POLL_S = 0.05


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _rank_command(spec_path: str) -> List[str]:
    """The command line of one rank: this module's :func:`_rank_main` on its spec file."""
    code = f"import sys; from {__name__} import _rank_main; sys.exit(_rank_main(sys.argv[1]))"
    return [sys.executable, "-c", code, spec_path]


def _rank_env(n: int, threads: int) -> Dict[str, str]:
    env = child_environment(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(_free_port()), WORLD_SIZE=str(n),
                            OMP_NUM_THREADS=str(threads))
    if sys.platform.startswith("linux") and os.path.exists("/sys/class/net/lo"):
        env.setdefault("GLOO_SOCKET_IFNAME", "lo")  # the ranks talk over the loopback only
    top = __name__.split(".")[0]
    if top != "gnncompile":
        # imported from a source tree as `tuner` (not the installed gnncompile.tuner): the
        # ranks import it from the same folder
        root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
        env["PYTHONPATH"] = os.pathsep.join(x for x in (root, env.get("PYTHONPATH")) if x)
    return env


class _Lines:
    """The complete tagged lines a rank has written to its stdout file so far."""

    def __init__(self, path: str) -> None:
        self.path, self.offset, self.partial = path, 0, b""

    def new(self) -> List[Dict[str, Any]]:
        try:
            with open(self.path, "rb") as f:
                f.seek(self.offset)
                data = f.read()
        except OSError:
            return []
        self.offset += len(data)
        *lines, self.partial = (self.partial + data).split(b"\n")
        out = []
        for ln in lines:
            text = ln.decode(errors="replace")
            if text.startswith(_TAG):
                try:
                    out.append(json.loads(text[len(_TAG):]))
                except ValueError:
                    pass
        return out


def _tail(path: str, lines: int = 15, chars: int = 2000) -> str:
    try:
        with open(path, "rb") as f:
            f.seek(0, os.SEEK_END)
            f.seek(max(0, f.tell() - 64 * chars))
            text = f.read().decode(errors="replace")
    except OSError:
        return "(no stderr)"
    kept = [ln for ln in text.splitlines() if ln.strip()][-lines:]
    return "\n".join(kept)[-chars:] or "(stderr empty)"


def _kill_ranks(procs: List[subprocess.Popen]) -> None:
    """Kills each rank's process group (the rank and its loader workers), then reaps the ranks."""
    for p in procs:
        try:
            os.killpg(p.pid, signal.SIGKILL)  # each rank leads its own session and group
        except (ProcessLookupError, PermissionError):
            pass
    for p in procs:
        try:
            p.wait(timeout=30)
        except subprocess.TimeoutExpired:  # pragma: no cover - SIGKILL does not wait
            pass


def _combined(rows: List[Dict[str, Any]]) -> float:
    """The ranks' throughput: every rank's units over the slowest rank's seconds."""
    return sum(float(r["units"]) for r in rows) / max(max(float(r["seconds"]) for r in rows), 1e-12)


def _measure_ranks(w: Workload, settings: Dict[str, Any], report, device, memory_budget,
                   timeout: Optional[float]) -> Tuple[float, int]:
    """:func:`measure` of a data-parallel trial: ``w.ranks`` gloo rank processes on this host."""
    checkpoint()
    n = w.ranks
    threads = int(settings.get("threads") or 1)
    limit_s = DDP_TIMEOUT_S if timeout is None else float(timeout)
    folder = tempfile.mkdtemp(prefix="gnncompile-ddp-")
    procs: List[subprocess.Popen] = []
    try:
        env = _rank_env(n, threads)
        spec = {"workload": asdict(w), "settings": dict(settings, threads=threads), "device": device,
                "world": n, "timeout": limit_s, "parent": os.getpid()}
        start = time.monotonic()
        for r in range(n):
            path = os.path.join(folder, f"rank{r}.json")
            with open(path, "w") as f:
                json.dump(dict(spec, rank=r), f, default=str)
            with open(os.path.join(folder, f"rank{r}.out"), "wb") as out, \
                    open(os.path.join(folder, f"rank{r}.err"), "wb") as err:
                procs.append(subprocess.Popen(_rank_command(path), stdout=out, stderr=err,
                                              stdin=subprocess.DEVNULL, start_new_session=True,
                                              env=dict(env, RANK=str(r), LOCAL_RANK=str(r))))
        return _watch_ranks(procs, folder, report, memory_budget, start, limit_s)
    finally:
        _kill_ranks(procs)
        shutil.rmtree(folder, ignore_errors=True)


def _watch_ranks(procs, folder: str, report, memory_budget, start: float, limit_s: float) -> Tuple[float, int]:
    """Follows the ranks to their end: reports each chunk once every rank has timed it, raises
    at the first rank that fails, past ``limit_s``, or at the run's deadline / a Ctrl-C
    (:func:`tuner.guard.checkpoint`)."""
    n = len(procs)
    err = [os.path.join(folder, f"rank{r}.err") for r in range(n)]
    readers = [_Lines(os.path.join(folder, f"rank{r}.out")) for r in range(n)]
    chunks: List[list] = [[] for _ in range(n)]
    done: List[Optional[dict]] = [None] * n
    errors: List[Optional[dict]] = [None] * n
    exited: Dict[int, int] = {}  # rank -> the order in which its exit was seen
    reported = 0
    while True:
        for r, p in enumerate(procs):  # exits first, then lines: nothing written before an exit is missed
            if r not in exited and p.poll() is not None:
                exited[r] = len(exited)
        for r in range(n):
            for msg in readers[r].new():
                if "chunk" in msg:
                    chunks[r].append(msg)
                elif "done" in msg:
                    done[r] = msg
                elif "error" in msg:
                    errors[r] = msg
        while all(len(c) > reported for c in chunks):
            rows = [c[reported] for c in chunks]
            peak = max(int(x["peak"]) for x in rows)
            if memory_budget is not None and peak > memory_budget:
                worst = max(range(n), key=lambda r: int(rows[r]["peak"]))
                raise MemoryBudgetExceeded(f"peak memory {peak} > budget {memory_budget} (rank {worst} of {n})")
            if report is not None:
                report(reported, _combined(rows))
            reported += 1
        # a rank that wrote its error has failed, exited or not (a process group's teardown can
        # wait on the other ranks); so has one that exited without its result. The rank named is
        # the one whose error came first (a failing rank makes the others fail when it exits)
        failed = sorted({r for r in range(n) if errors[r] is not None}
                        | {r for r in exited if procs[r].returncode != 0 or done[r] is None},
                        key=lambda r: (errors[r] is None, (errors[r] or {}).get("at", math.inf),
                                       exited.get(r, n)))
        if failed:
            raise _rank_error(failed[0], procs, errors[failed[0]], err[failed[0]])
        if all(d is not None for d in done) or len(exited) == n:
            break  # every rank has its result (what is left of them is their exit: killed)
        if time.monotonic() - start > limit_s:
            alive = [r for r in range(n) if r not in exited]
            tails = "\n".join(f"--- rank {r} stderr tail:\n{_tail(err[r], lines=8)}" for r in alive)
            raise RankFailed(f"the data-parallel trial ran past {limit_s:.0f} s (a hang?): rank(s) "
                             f"{', '.join(map(str, alive))} of {n} still running, stopped\n{tails}")
        try:
            checkpoint()
        except _guard.DeadlineReached as e:
            raise _guard.DeadlineReached(f"{e}; the trial's {n} rank processes were stopped") from None
        time.sleep(_POLL_S)
    last = [c[-1] for c in chunks]
    return _combined(last), max(int(x["peak"]) for x in last)


def _rank_error(r: int, procs, error: Optional[dict], err_path: str) -> Exception:
    rc = procs[r].returncode
    what = error["error"] if error else (f"killed by signal {-rc}" if rc is not None and rc < 0
                                         else "exited without a result")
    others = [f"rank {q}: exit {p.returncode}" for q, p in enumerate(procs) if q != r and p.returncode is not None]
    status = "its process stopped" if rc is None else f"exit status {rc}"
    msg = (f"rank {r} of {len(procs)} failed ({status}): {what}"
           + (f" [{'; '.join(others)}]" if others else "")
           + f"\n--- rank {r} stderr tail:\n{_tail(err_path)}")
    if error and error.get("type") in ("OutOfMemoryError", "MemoryError"):
        return MemoryError(msg)  # the study records it as out of memory (infeasible)
    return RankFailed(msg)


def _die_with_parent(parent: int) -> None:
    """This rank is killed when the process that started it dies (Linux), so that no rank
    outlives a tuner killed mid-trial."""
    if sys.platform.startswith("linux"):
        try:
            import ctypes

            ctypes.CDLL(None).prctl(1, int(signal.SIGKILL))  # PR_SET_PDEATHSIG
        except Exception:  # pragma: no cover
            pass
    if os.getppid() != parent:  # the parent died before the line above
        os._exit(1)


def _rank_main(spec_path: str) -> int:
    """One rank of a data-parallel trial (its own process, started by :func:`_measure_ranks`):
    joins the gloo group, trains its shard, and writes each chunk's units, seconds and peak
    memory (then ``done``, or the error) as tagged lines to stdout."""
    import traceback
    from datetime import timedelta

    import torch.distributed as dist

    with open(spec_path) as f:
        spec = json.load(f)
    _die_with_parent(int(spec["parent"]))
    rank, world = int(spec["rank"]), int(spec["world"])

    def emit(**msg) -> None:
        sys.stdout.write(_TAG + json.dumps(msg) + "\n")
        sys.stdout.flush()

    def fail(e: Exception) -> None:
        traceback.print_exc()
        sys.stderr.flush()
        emit(error=f"{type(e).__name__}: {e}", type=type(e).__name__, at=time.time())
        os._exit(1)  # at once: the interpreter's teardown can wait on the other ranks

    try:
        w = workload_from_dict(spec["workload"])
        settings = dict(spec["settings"])
        device = spec.get("device") or ("cuda" if torch.cuda.is_available() else "cpu")
        if torch.device(device).type == "cuda" and torch.device(device).index is None:
            device = f"cuda:{rank % torch.cuda.device_count()}"
            torch.cuda.set_device(torch.device(device))
        dist.init_process_group("gloo", rank=rank, world_size=world,
                                timeout=timedelta(seconds=float(spec["timeout"])))
        try:
            _train(w, settings, None, device, None, rank=rank,
                   on_chunk=lambda c, units, seconds, peak: emit(chunk=c, units=units, seconds=seconds,
                                                                 peak=int(peak)))
        except Exception as e:
            # reported before this rank's connections close: their closing makes the other
            # ranks fail too, and the error written first names the rank that failed first
            fail(e)
        finally:
            dist.destroy_process_group()
    except Exception as e:
        fail(e)
    emit(done=True)
    sys.stderr.flush()
    os._exit(0)  # the process that started it kills what is left (loader workers)


def workload_from_dict(d: Dict[str, Any]) -> Workload:
    fields = set(Workload.__dataclass_fields__)
    return Workload(**{k: v for k, v in d.items() if k in fields})


__all__ = ["Workload", "measure", "interleaved", "prepare", "build_model", "default_settings", "dataset_for",
           "neighbor_data", "MODELS", "KINDS", "NEIGHBOR_BATCH_RANGE", "DDP_TIMEOUT_S",
           "MemoryBudgetExceeded", "RankFailed", "workload_from_dict"]
