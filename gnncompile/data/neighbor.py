"""Neighbor sampling for mini-batch training on large graphs, with a native kernel.

* :class:`NeighborSampler`: a :class:`torch_geometric.sampler.BaseSampler` over the native op
  ``gnncompile::neighbor_sample`` (native/cpu/neighbor_sample.cpp). Usable wherever PyG
  takes a node sampler, e.g. ``NodeLoader(data, node_sampler=NeighborSampler(data, [15, 10]))``.
* :class:`NeighborLoader`: PyG's ``NeighborLoader`` arguments over that sampler. Batches are
  what PyG's loader produces (``n_id``, ``e_id``, ``input_id``, ``batch_size``,
  ``num_sampled_nodes``, ``num_sampled_edges``, the seeds first), so ``trim_to_layer`` and PyG's
  examples run unchanged.

What is sampled: for each hop ``h``, every node added in the previous hop (hop 0: the seeds)
draws ``num_neighbors[h]`` of its in-edges (-1: all of them; without replacement, all of them
when it has no more); the new source nodes follow in order of first appearance. The graph's
CSC (in-edges grouped by destination) is built once, by the structure cache, and shared by every
sampler and loader over the same ``edge_index``.

Randomness: a batch's sample depends only on a 64-bit batch seed, never on threads or worker
processes. The loader derives it from its ``seed`` (drawn from torch's generator when not
given), the epoch and the batch's position, so the same ``seed`` gives the same batches with
any ``num_workers``, and epochs differ from one another.
"""
from __future__ import annotations

import math
import operator
import warnings
from typing import Any, List, Optional, Sequence

import torch
from torch import Tensor

from ..ops import structure as _structure
from ..ops import targets as _targets

with warnings.catch_warnings():
    warnings.simplefilter("ignore")
    from torch_geometric.data import Data
    from torch_geometric.loader import NodeLoader
    from torch_geometric.sampler import BaseSampler, NodeSamplerInput, SamplerOutput

_M64 = (1 << 64) - 1


def _mix(*parts: int) -> int:
    """A 63-bit hash of integers (splitmix64 steps), for per-batch seeds."""
    z = 0x9E3779B97F4A7C15
    for p in parts:
        z = (z ^ (int(p) & _M64)) & _M64
        z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & _M64
        z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & _M64
        z ^= z >> 31
    return z >> 1


def _check_fanout(num_neighbors: Any) -> List[int]:
    """The fanouts as ints: each an integer (not a float, string or bool) in [-1, 2^63 - 1]."""
    if isinstance(num_neighbors, dict):
        raise TypeError("gnncompile NeighborSampler: heterogeneous graphs (a dict of num_neighbors) "
                        "are not supported; give a list of ints, one per hop")
    try:
        if isinstance(num_neighbors, (str, bytes)):
            raise TypeError
        items = list(num_neighbors)
        if any(isinstance(k, bool) for k in items):
            raise TypeError
        fan = [operator.index(k) for k in items]  # no float truncated, no string parsed
    except (TypeError, ValueError):
        raise TypeError(f"num_neighbors must be a list of ints, one per hop; got {num_neighbors!r}") from None
    if any(k < -1 for k in fan):
        raise ValueError(f"num_neighbors entries must be >= 0, or -1 for all neighbors; got {fan}")
    if any(k > 2**63 - 1 for k in fan):
        raise ValueError(f"num_neighbors entries must be at most 2^63 - 1; got {fan}")
    return fan


def _graph_of(data: Any):
    if not isinstance(data, Data):
        raise TypeError(f"gnncompile NeighborSampler samples a torch_geometric.data.Data (homogeneous) "
                        f"graph; got {type(data).__name__}")
    ei = data.edge_index
    if not isinstance(ei, Tensor) or ei.dim() != 2 or ei.size(0) != 2:
        raise ValueError("the graph needs an edge_index of shape [2, num_edges]")
    if ei.is_floating_point() or ei.dtype == torch.bool:
        raise TypeError(f"edge_index must hold integers, got {ei.dtype}")
    return ei, int(data.num_nodes)


def _advise_huge_pages(t: Tensor) -> None:
    """Asks Linux to back a large tensor with 2 MiB pages (madvise MADV_HUGEPAGE) before it is
    filled: the sampler's reads land at random slots, and with 4 KiB pages nearly each one is
    also a TLB miss. A no-op where that is not available."""
    try:
        import ctypes
        import mmap

        libc = ctypes.CDLL(None, use_errno=True)
        page, huge = mmap.PAGESIZE, 2 << 20
        start, end = t.data_ptr(), t.data_ptr() + t.numel() * t.element_size()
        lo, hi = -(-start // huge) * huge, end // huge * huge
        if hi > lo and page:
            libc.madvise(ctypes.c_void_p(lo), ctypes.c_size_t(hi - lo), 14)  # MADV_HUGEPAGE
    except (OSError, AttributeError, ValueError):  # pragma: no cover - not Linux
        pass


def _slot_pairs(st, num_nodes: int) -> Optional[Tensor]:
    """(source, edge id) of every CSC slot side by side as int32 [E, 2], built once per structure
    (kept with it, with a huge-page copy of colptr): one cache line per sampled edge instead of
    two. None beyond int32."""
    E = st.col.numel()
    if num_nodes >= 2**31 or E >= 2**31:
        return None
    pairs = st.extras.get("sampler_pairs")
    if pairs is None:
        pairs = torch.empty(E, 2, dtype=torch.int32)
        _advise_huge_pages(pairs)
        pairs[:, 0].copy_(st.col)
        pairs[:, 1].copy_(st.perm)
        colptr = torch.empty_like(st.rowptr)  # read at random too
        _advise_huge_pages(colptr)
        colptr.copy_(st.rowptr)
        st.extras["sampler_pairs"], st.extras["sampler_colptr"] = pairs, colptr
    return pairs


class NeighborSampler(BaseSampler):
    """Samples ``num_neighbors[h]`` in-neighbors per node and hop with the native kernel.

    Args:
        data: a homogeneous :class:`~torch_geometric.data.Data` graph.
        num_neighbors: fanout per hop (-1: all neighbors).
        replace: sample with replacement.
        directed: ``False`` returns every edge between the sampled nodes (the induced subgraph;
            not with ``disjoint``).
        disjoint: every seed gets a tree of its own (``batch`` tells which).
        seed: the base seed; drawn from torch's generator when ``None``.
    """

    def __init__(self, data: Data, num_neighbors: Sequence[int], replace: bool = False,
                 directed: bool = True, disjoint: bool = False, seed: Optional[int] = None) -> None:
        self.num_neighbors = _check_fanout(num_neighbors)
        if disjoint and not directed:
            raise ValueError("directed=False (the induced subgraph) is not supported with disjoint=True")
        self.replace, self.directed, self.disjoint = bool(replace), bool(directed), bool(disjoint)
        edge_index, self.num_nodes = _graph_of(data)
        if edge_index.device.type != "cpu":
            raise ValueError("NeighborSampler samples on the CPU: keep the graph's edge_index on the CPU "
                             "and move each batch to the device")
        edge_index = edge_index.long()
        st = _structure.structure(edge_index, self.num_nodes)
        st.check_sources(self.num_nodes)
        self.colptr, self.row, self.perm = st.rowptr, st.col, st.perm
        self._pairs = _slot_pairs(st, self.num_nodes)
        if self._pairs is not None:
            self.colptr = st.extras["sampler_colptr"]
        self.seed = int(torch.randint(0, 2**62, (1,)).item()) if seed is None else int(seed)
        self._calls = 0

    @property
    def edge_permutation(self) -> Optional[Tensor]:
        return None  # sample() returns original edge ids already

    def sample(self, seeds: Tensor, seed: Optional[int] = None):
        """The raw sample of ``seeds`` (global node ids): (node, row, col, edge, batch,
        num_sampled_nodes, num_sampled_edges) with ``edge`` the original edge ids."""
        if seed is None:
            seed, self._calls = _mix(self.seed, self._calls), self._calls + 1
        if seeds.is_floating_point() or seeds.dtype == torch.bool:
            raise TypeError(f"seed nodes must be integers, got {seeds.dtype}")
        row, perm = (self._pairs, None) if self._pairs is not None else (self.row, self.perm)
        return _targets.NEIGHBOR_SAMPLE(
            self.colptr, row, seeds.reshape(-1).long().cpu(), self.num_neighbors, self.replace,
            self.directed, self.disjoint, int(seed) & (2**63 - 1), perm)

    def sample_from_nodes(self, index: NodeSamplerInput, seed: Optional[int] = None, **kwargs) -> SamplerOutput:
        if index.input_type is not None:
            raise TypeError("gnncompile NeighborSampler: heterogeneous input nodes are not supported")
        node, row, col, edge, batch, n_nodes, n_edges = self.sample(index.node, seed)
        return SamplerOutput(node=node, row=row, col=col, edge=edge,
                             batch=batch if self.disjoint else None,
                             num_sampled_nodes=n_nodes.tolist(), num_sampled_edges=n_edges.tolist(),
                             metadata=(index.input_id, index.time))

    def sample_from_edges(self, index, neg_sampling=None):
        raise NotImplementedError("gnncompile NeighborSampler samples from nodes only (NodeLoader)")


class _EpochSampler(torch.utils.data.Sampler):
    """Positions 0..n-1 (shuffled or not), each shifted by ``epoch * n`` so that the loader's
    collate function knows the epoch in whichever process it runs."""

    def __init__(self, n: int, shuffle: bool, seed: int) -> None:
        self.n, self.shuffle, self.seed, self.epoch = n, shuffle, seed, -1

    def __len__(self) -> int:
        return self.n

    def __iter__(self):
        self.epoch += 1
        if self.shuffle:
            g = torch.Generator().manual_seed(_mix(self.seed, self.epoch, 1))
            order = torch.randperm(self.n, generator=g)
        else:
            order = torch.arange(self.n)
        return iter((order + self.epoch * self.n).tolist())


class _Positions:
    """The loader's dataset: an encoded position is its own item."""

    def __init__(self, n: int) -> None:
        self.n = n

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int) -> int:
        return i


def _profile_loader_settings(profile: Any) -> dict:
    if profile is None:
        return {}
    from .. import profiles

    p = profiles.resolve(profile)
    return {} if p.is_default else p.loader_kwargs()


class NeighborLoader(NodeLoader):
    """PyG's ``NeighborLoader`` over :class:`NeighborSampler` (homogeneous graphs).

    Arguments as PyG's: ``num_neighbors``, ``input_nodes`` (ids or a boolean mask; default all
    nodes), ``batch_size``, ``shuffle``, ``replace``, ``directed``, ``disjoint``,
    ``num_workers``, ``persistent_workers``, ``pin_memory`` and the other DataLoader/NodeLoader
    keywords. Also ``seed`` (batches are a function of it) and ``profile``: a tuned profile
    (path, :class:`~gnncompile.profiles.Profile` or 'auto') whose ``batch_size``,
    ``num_workers``, ``pool_size`` (batches in flight: the DataLoader's prefetch depth),
    ``pin_memory`` and ``persistent_workers`` apply where they are not given here.
    """

    def __init__(self, data: Data, num_neighbors: Sequence[int], input_nodes: Any = None,
                 batch_size: Optional[int] = None, shuffle: bool = False, replace: bool = False,
                 directed: bool = True, disjoint: bool = False, num_workers: Optional[int] = None,
                 persistent_workers: Optional[bool] = None, pin_memory: Optional[bool] = None,
                 seed: Optional[int] = None, profile: Any = None, **kwargs) -> None:
        for key in ("sampler", "batch_sampler"):
            if key in kwargs:
                raise TypeError(f"NeighborLoader chooses the {key} itself; use shuffle/seed")
        given = {"batch_size": batch_size, "num_workers": num_workers,
                 "persistent_workers": persistent_workers, "pin_memory": pin_memory}
        settings = _profile_loader_settings(profile)
        pool = settings.pop("pool_size", None)
        opts = {k: (v if v is not None else settings.get(k)) for k, v in given.items()}
        opts["batch_size"] = 1 if opts["batch_size"] is None else opts["batch_size"]
        opts["num_workers"] = int(opts["num_workers"] or 0)
        opts["persistent_workers"] = bool(opts["persistent_workers"]) and opts["num_workers"] > 0
        opts["pin_memory"] = bool(opts["pin_memory"])
        if pool and opts["num_workers"] > 0 and "prefetch_factor" not in kwargs:
            kwargs["prefetch_factor"] = max(1, math.ceil(pool / opts["num_workers"]))
        sampler = NeighborSampler(data, num_neighbors, replace=replace, directed=directed,
                                  disjoint=disjoint, seed=seed)
        self.seed = sampler.seed
        n = self._num_inputs(data, input_nodes)
        self._epochs = _EpochSampler(n, bool(shuffle), sampler.seed)
        super().__init__(data, node_sampler=sampler, input_nodes=input_nodes,
                         sampler=self._epochs, **opts, **kwargs)
        # DataLoader freezes `dataset` after __init__; the positions it yields carry the epoch.
        object.__setattr__(self, "dataset", _Positions(n))
        self.settings = dict(opts, prefetch_factor=kwargs.get("prefetch_factor"))

    @staticmethod
    def _num_inputs(data: Data, input_nodes: Any) -> int:
        if input_nodes is None:
            return int(data.num_nodes)
        t = torch.as_tensor(input_nodes)
        return int(t.sum()) if t.dtype == torch.bool else int(t.numel())

    def collate_fn(self, index) -> Any:
        idx = torch.as_tensor(index, dtype=torch.long).reshape(-1)
        n = self._epochs.n
        epoch, pos = idx // n, idx % n
        input_data: NodeSamplerInput = self.input_data[pos]
        batch_seed = _mix(self.seed, int(epoch[0]) if idx.numel() else 0, int(pos[0]) if idx.numel() else 0)
        out = self.node_sampler.sample_from_nodes(input_data, seed=batch_seed)
        if self.filter_per_worker:
            out = self.filter_fn(out)
        return out


__all__ = ["NeighborSampler", "NeighborLoader"]
