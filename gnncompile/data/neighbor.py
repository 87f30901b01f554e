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
sampler and loader over the same ``edge_index``; on a graph from
:func:`gnncompile.data.shared_graph` it is the host's one copy, mapped from shared memory.

Randomness: a batch's sample depends only on a 64-bit batch seed, never on threads or worker
processes. The loader derives it from its ``seed`` (drawn from torch's generator when not
given), the epoch and the batch's position, so the same ``seed`` gives the same batches with
any ``num_workers``, and epochs differ from one another.
"""
from __future__ import annotations

import math
import operator
import warnings
from typing import Any, Dict, List, Optional, Sequence

import torch
from torch import Tensor

from ..ops import structure as _structure
from ..ops import targets as _targets

with warnings.catch_warnings():
    warnings.simplefilter("ignore")
    from torch_geometric.data import Data, HeteroData
    from torch_geometric.loader import NodeLoader
    from torch_geometric.sampler import (BaseSampler, HeteroSamplerOutput, NodeSamplerInput, NumNeighbors,
                                         SamplerOutput)

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
    if isinstance(num_neighbors, (dict, NumNeighbors)):
        raise TypeError("gnncompile NeighborSampler: a dict of num_neighbors (one list per edge type) is for "
                        "heterogeneous graphs (HeteroData); on a Data graph give a list of ints, one per hop")
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


def _check_edge_index(ei: Any, where: str = "the graph") -> Tensor:
    if not isinstance(ei, Tensor) or ei.dim() != 2 or ei.size(0) != 2:
        raise ValueError(f"{where} needs an edge_index of shape [2, num_edges]")
    if ei.is_floating_point() or ei.dtype == torch.bool:
        raise TypeError(f"edge_index must hold integers, got {ei.dtype}")
    if ei.device.type != "cpu":
        raise ValueError("NeighborSampler samples on the CPU: keep the graph's edge_index on the CPU "
                         "and move each batch to the device")
    return ei.long()


def _graph_of(data: Any):
    if not isinstance(data, Data):
        raise TypeError(f"gnncompile NeighborSampler samples a torch_geometric.data.Data or HeteroData "
                        f"graph; got {type(data).__name__}")
    return _check_edge_index(data.edge_index), int(data.num_nodes)


def _edge_type_name(et) -> str:
    return "__".join(et)


def _hetero_fanouts(num_neighbors: Any, edge_types: Sequence[tuple]) -> Dict[tuple, List[int]]:
    """Fanouts per edge type, as PyG takes them: one list for every edge type, or a dict keyed by
    edge type (a tuple or ``"src__rel__dst"``), every edge type present (or a
    ``NumNeighbors(values, default=...)`` for the missing ones), all with the same number of hops."""
    default = None
    if isinstance(num_neighbors, NumNeighbors):
        num_neighbors, default = num_neighbors.values, num_neighbors.default
    if not isinstance(num_neighbors, dict):
        fan = _check_fanout(num_neighbors)
        return {et: fan for et in edge_types}
    known = {et: et for et in edge_types}
    known.update({_edge_type_name(et): et for et in edge_types})
    out: Dict[tuple, List[int]] = {}
    for key, value in num_neighbors.items():
        et = known.get(tuple(key) if isinstance(key, list) else key)
        if et is None:
            raise ValueError(f"num_neighbors names the edge type {key!r}, which the graph does not have "
                             f"(its edge types: {list(edge_types)})")
        out[et] = _check_fanout(value)
    missing = [et for et in edge_types if et not in out]
    if missing and default is None:
        raise ValueError(f"num_neighbors gives no fanout for the edge types {missing}: give one list per edge "
                         f"type, or NumNeighbors(values, default=[...])")
    for et in missing:
        out[et] = _check_fanout(default)
    hops = {len(v) for v in out.values()}
    if len(hops) > 1:
        raise ValueError(f"num_neighbors must give the same number of hops for every edge type; got {sorted(hops)}")
    return {et: out[et] for et in edge_types}


class _HeteroGraph:
    """A HeteroData's sampling view: node types and counts, and per edge type its CSC (built once
    by the structure cache, shared with the compiled model's structures of the same edge_index)."""

    def __init__(self, data: HeteroData) -> None:
        self.node_types = list(data.node_types)
        self.edge_types = [tuple(et) for et in data.edge_types]
        if not self.edge_types:
            raise ValueError("the heterogeneous graph has no edge types to sample")
        self.index = {t: i for i, t in enumerate(self.node_types)}
        self.num_nodes = []
        for t in self.node_types:
            n = data[t].num_nodes
            if n is None:
                raise ValueError(f"node type {t!r} has no node count: set data[{t!r}].num_nodes or its x")
            self.num_nodes.append(int(n))
        self.colptrs, self.rows, self.perms = [], [], []
        self.shared = 0  # edge types whose CSC is shared_graph's
        for et in self.edge_types:
            src, _, dst = et
            raw = data[et].get("edge_index")
            ei = _check_edge_index(raw, f"edge type {et}")
            n_src, n_dst = self.num_nodes[self.index[src]], self.num_nodes[self.index[dst]]
            shared = _shared_csc(data, et, raw, n_dst, n_src)
            if shared is not None:  # the host's one copy, from shared_graph (validated there)
                self.shared += 1
                self.colptrs.append(shared.colptr)
                self.rows.append(shared.row)
                self.perms.append(shared.perm)
                continue
            try:  # (the structure checks both index rows; the message names the edge type)
                st = _structure.structure(ei, n_dst)
                st.check_sources(n_src)
            except IndexError as e:
                raise IndexError(f"edge type {et}: {e}") from None
            pairs = _slot_pairs(st, max(n_src, n_dst))
            if pairs is not None:
                self.colptrs.append(st.extras["sampler_colptr"])
                self.rows.append(pairs)
                self.perms.append(None)
            else:
                self.colptrs.append(st.rowptr)
                self.rows.append(st.col)
                self.perms.append(st.perm)
        self.edge_src = [self.index[et[0]] for et in self.edge_types]
        self.edge_dst = [self.index[et[2]] for et in self.edge_types]

    def sample(self, seeds: Tensor, input_type: str, fanouts: Dict[tuple, List[int]], replace: bool, seed: int):
        if input_type not in self.index:
            raise ValueError(f"input node type {input_type!r} is not a node type of the graph "
                             f"({self.node_types})")
        hops = len(next(iter(fanouts.values())))
        flat = [k for et in self.edge_types for k in fanouts[et]]
        node, row, col, edge, n_nodes, n_edges = _targets.HETERO_NEIGHBOR_SAMPLE(
            self.colptrs, self.rows, self.perms, self.edge_src, self.edge_dst, self.num_nodes, seeds,
            self.index[input_type], flat, hops, replace, seed)
        return (dict(zip(self.node_types, node)), dict(zip(self.edge_types, row)),
                dict(zip(self.edge_types, col)), dict(zip(self.edge_types, edge)),
                dict(zip(self.node_types, n_nodes.tolist())), dict(zip(self.edge_types, n_edges.tolist())))


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
    if not _fits_pairs(num_nodes, E):
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


# A Data from gnncompile.data.shared_graph carries the sampler's CSC, mapped from the host's one
# shared copy, under this attribute (in the Data's __dict__, not its store: never a data key).
_SHARED_CSC_ATTR = "_gnncompile_shared_csc"


class _SharedCsc:
    """The sampler's CSC of one ``edge_index`` tensor (built and validated once per host by
    :func:`gnncompile.data.shared_graph`, mapped by the others): valid for that very tensor
    object, at the version counter it had, and those numbers of destination and source nodes.
    ``row``: the int32 (source, edge id) slot pairs [E, 2] (``perm`` None), or the sources
    [E] with ``perm`` the edge ids (beyond int32)."""

    __slots__ = ("edge_index", "version", "num_dst", "num_src", "colptr", "row", "perm")

    def __init__(self, edge_index: Tensor, num_dst: int, num_src: int, colptr: Tensor, row: Tensor,
                 perm: Optional[Tensor]) -> None:
        self.edge_index, self.version = edge_index, edge_index._version
        self.num_dst, self.num_src = int(num_dst), int(num_src)
        self.colptr, self.row, self.perm = colptr, row, perm

    def describes(self, edge_index: Any, num_dst: int, num_src: int) -> bool:
        return (edge_index is self.edge_index and edge_index._version == self.version
                and int(num_dst) == self.num_dst and int(num_src) == self.num_src)


def _shared_csc(data: Any, edge_type: Optional[tuple], edge_index: Any, num_dst: int,
                num_src: int) -> Optional[_SharedCsc]:
    """The shared CSC that ``data`` carries for this edge_index (of ``edge_type`` on a
    HeteroData, None on a Data), if it still describes it."""
    shared = getattr(data, _SHARED_CSC_ATTR, None)
    if isinstance(shared, dict):
        shared = shared.get(edge_type)
    if shared is not None and shared.describes(edge_index, num_dst, num_src):
        return shared
    return None


def _fits_pairs(num_nodes: int, num_edges: int) -> bool:
    """Whether the sampler keeps its slots as int32 (source, edge id) pairs."""
    return num_nodes < 2**31 and num_edges < 2**31


class NeighborSampler(BaseSampler):
    """Samples ``num_neighbors[h]`` in-neighbors per node and hop with the native kernel.

    Args:
        data: a :class:`~torch_geometric.data.Data` graph, or a
            :class:`~torch_geometric.data.HeteroData` graph (see below).
        num_neighbors: fanout per hop (-1: all neighbors); on a heterogeneous graph one list for
            every edge type, or a dict of lists keyed by edge type (all edge types, the same
            number of hops; PyG's ``NumNeighbors(values, default=...)`` also).
        replace: sample with replacement.
        directed: ``False`` returns every edge between the sampled nodes (the induced subgraph;
            not with ``disjoint``).
        disjoint: every seed gets a tree of its own (``batch`` tells which).
        seed: the base seed; drawn from torch's generator when ``None``.

    On a heterogeneous graph, hop ``h`` visits the edge types in ``data.edge_types`` order: the
    nodes of an edge type's destination type added by hop ``h - 1`` (hop 0: the seeds, of the
    input node type) draw ``num_neighbors[edge_type][h]`` of their in-edges of that type, and new
    source nodes join their type's list in order of first appearance. Batches have PyG's layout:
    per node type ``n_id`` and ``num_sampled_nodes`` (hops + 1 entries), per edge type ``e_id``
    and ``num_sampled_edges``, ``input_id`` and ``batch_size`` on the input type, so
    ``trim_to_layer`` and ``to_hetero`` models run on them. Directed and not disjoint only.

    On a graph from :func:`gnncompile.data.shared_graph` the sampler reads the CSC that the
    host's local rank 0 built (``shared_csc`` is True), as long as the graph's ``edge_index``
    is the tensor it came with, unchanged; otherwise it builds its own.
    """

    def __init__(self, data: Any, num_neighbors: Any, replace: bool = False,
                 directed: bool = True, disjoint: bool = False, seed: Optional[int] = None) -> None:
        self.replace, self.directed, self.disjoint = bool(replace), bool(directed), bool(disjoint)
        self.seed = int(torch.randint(0, 2**62, (1,)).item()) if seed is None else int(seed)
        self._calls = 0
        self.hetero: Optional[_HeteroGraph] = None
        self.shared_csc = False
        if isinstance(data, HeteroData):
            if disjoint or not directed:
                raise ValueError("gnncompile NeighborSampler on a heterogeneous graph samples directed, not "
                                 "disjoint (directed=True, disjoint=False)")
            self.hetero = _HeteroGraph(data)
            self.shared_csc = self.hetero.shared == len(self.hetero.edge_types)
            self.num_neighbors = _hetero_fanouts(num_neighbors, self.hetero.edge_types)
            return
        self.num_neighbors = _check_fanout(num_neighbors)
        if disjoint and not directed:
            raise ValueError("directed=False (the induced subgraph) is not supported with disjoint=True")
        edge_index, self.num_nodes = _graph_of(data)
        shared = _shared_csc(data, None, data.edge_index, self.num_nodes, self.num_nodes)
        self.shared_csc = shared is not None  # the host's one copy, from shared_graph (validated there)
        if shared is not None:
            self.colptr, self.row, self.perm = shared.colptr, shared.row, shared.perm
            self._pairs = shared.row if shared.row.dim() == 2 else None
            return
        st = _structure.structure(edge_index, self.num_nodes)
        st.check_sources(self.num_nodes)
        self.colptr, self.row, self.perm = st.rowptr, st.col, st.perm
        self._pairs = _slot_pairs(st, self.num_nodes)
        if self._pairs is not None:
            self.colptr = st.extras["sampler_colptr"]

    @property
    def edge_permutation(self) -> Optional[Tensor]:
        return None  # sample() returns original edge ids already

    def sample(self, seeds: Tensor, seed: Optional[int] = None, input_type: Optional[str] = None):
        """The raw sample of ``seeds`` (global node ids): (node, row, col, edge, batch,
        num_sampled_nodes, num_sampled_edges) with ``edge`` the original edge ids. On a
        heterogeneous graph (``input_type``: the seeds' node type): (node, row, col, edge,
        num_sampled_nodes, num_sampled_edges), dicts by node or edge type."""
        if seed is None:
            seed, self._calls = _mix(self.seed, self._calls), self._calls + 1
        if seeds.is_floating_point() or seeds.dtype == torch.bool:
            raise TypeError(f"seed nodes must be integers, got {seeds.dtype}")
        if self.hetero is not None:
            if input_type is None:
                raise ValueError("a heterogeneous graph's seeds need their node type (input_type)")
            return self.hetero.sample(seeds.reshape(-1).long().cpu(), input_type, self.num_neighbors,
                                      self.replace, int(seed) & (2**63 - 1))
        row, perm = (self._pairs, None) if self._pairs is not None else (self.row, self.perm)
        return _targets.NEIGHBOR_SAMPLE(
            self.colptr, row, seeds.reshape(-1).long().cpu(), self.num_neighbors, self.replace,
            self.directed, self.disjoint, int(seed) & (2**63 - 1), perm)

    def sample_from_nodes(self, index: NodeSamplerInput, seed: Optional[int] = None, **kwargs):
        if index.time is not None:
            raise ValueError("gnncompile NeighborSampler does not sample by time (seed_time)")
        if self.hetero is not None:
            if index.input_type is None:
                raise ValueError("a heterogeneous graph's seeds need their node type: input_nodes=(type, ids)")
            node, row, col, edge, n_nodes, n_edges = self.sample(index.node, seed, index.input_type)
            return HeteroSamplerOutput(node=node, row=row, col=col, edge=edge, batch=None,
                                       num_sampled_nodes=n_nodes, num_sampled_edges=n_edges,
                                       metadata=(index.input_id, index.time))
        if index.input_type is not None:
            raise TypeError("gnncompile NeighborSampler: the graph is homogeneous (Data), but the input nodes "
                            f"have a node type ({index.input_type!r})")
        node, row, col, edge, batch, n_nodes, n_edges = self.sample(index.node, seed)
        return SamplerOutput(node=node, row=row, col=col, edge=edge,
                             batch=batch if self.disjoint else None,
                             num_sampled_nodes=n_nodes.tolist(), num_sampled_edges=n_edges.tolist(),
                             metadata=(index.input_id, index.time))

    def sample_from_edges(self, index, neg_sampling=None):
        raise NotImplementedError("gnncompile NeighborSampler samples from nodes only (NodeLoader)")


class _EpochSampler(torch.utils.data.Sampler):
    """Positions 0..n-1 (shuffled or not), each shifted by ``epoch * n`` so that the loader's
    collate function knows the epoch in whichever process it runs.

    Sharded (``num_replicas`` > 1, or a rank given): every rank draws the same order of all n
    positions (from the seed and the epoch), pads it by wrapping around to a multiple of
    ``num_replicas`` (or, with ``drop_last``, cuts it to one) and takes every
    ``num_replicas``-th position from its ``rank`` on: ``DistributedSampler``'s split.

    Epochs: each iteration runs the epoch after the previous one (the first: 0), unless
    :meth:`set_epoch` named the next one."""

    def __init__(self, n: int, shuffle: bool, seed: int, num_replicas: int = 1, rank: int = 0,
                 drop_last: bool = False) -> None:
        self.n, self.shuffle, self.seed = n, shuffle, seed
        self.num_replicas, self.rank, self.drop_last = num_replicas, rank, drop_last
        self.epoch, self._pending = 0, True  # `epoch` is the next iteration's while pending

    def set_epoch(self, epoch: int) -> None:
        epoch = operator.index(epoch)
        if epoch < 0:
            raise ValueError(f"the epoch must be >= 0, got {epoch}")
        self.epoch, self._pending = epoch, True

    def __len__(self) -> int:
        R = self.num_replicas
        return self.n // R if self.drop_last else -(-self.n // R)

    def order(self, epoch: int) -> Tensor:
        """This rank's positions of ``epoch``, in order (not yet shifted by the epoch)."""
        if self.shuffle:
            g = torch.Generator().manual_seed(_mix(self.seed, epoch, 1))
            order = torch.randperm(self.n, generator=g)
        else:
            order = torch.arange(self.n)
        R = self.num_replicas
        if R == 1:
            return order
        total = len(self) * R
        if total > self.n:  # pad by wrapping around (as often as it takes when n < R)
            order = order.repeat(-(-total // self.n))
        return order[self.rank:total:R]

    def __iter__(self):
        if self._pending:
            self._pending = False
        else:
            self.epoch += 1
        return iter((self.order(self.epoch) + self.epoch * self.n).tolist())


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


def _as_int(name: str, v: Any) -> int:
    if isinstance(v, bool):
        raise TypeError(f"NeighborLoader: {name} must be an int, got {v!r}")
    try:
        return operator.index(v)
    except TypeError:
        raise TypeError(f"NeighborLoader: {name} must be an int, got {v!r}") from None


def _shard_settings(distributed: bool, num_replicas: Optional[int], rank: Optional[int]):
    """(sharded, num_replicas, rank, group): the explicit values, the missing ones from the
    default process group (``group``: whether one is initialized); (False, 1, 0, ...) when
    neither ``distributed`` nor a value is given."""
    import torch.distributed as dist

    group = dist.is_available() and dist.is_initialized()
    if not distributed and num_replicas is None and rank is None:
        return False, 1, 0, group
    if num_replicas is None or rank is None:
        if not group:
            missing = " and ".join(k for k, v in (("num_replicas", num_replicas), ("rank", rank)) if v is None)
            raise RuntimeError(
                f"NeighborLoader(distributed=True) takes {missing} from torch.distributed, but no process group "
                "is initialized: call torch.distributed.init_process_group() first, or give num_replicas= and "
                "rank= (and seed=) explicitly")
        num_replicas = dist.get_world_size() if num_replicas is None else num_replicas
        rank = dist.get_rank() if rank is None else rank
    num_replicas, rank = _as_int("num_replicas", num_replicas), _as_int("rank", rank)
    if num_replicas < 1:
        raise ValueError(f"NeighborLoader: num_replicas must be >= 1, got {num_replicas}")
    if not 0 <= rank < num_replicas:
        raise ValueError(f"NeighborLoader: rank must be in [0, {num_replicas - 1}] (num_replicas={num_replicas}), "
                         f"got {rank}")
    return True, num_replicas, rank, group


def _shared_seed(seed: Optional[int], sharded: bool, group: bool) -> Optional[int]:
    """The loader seed every rank agrees on: the given one, else rank 0's, broadcast."""
    if seed is not None or not sharded:
        return seed
    if not group:
        raise ValueError("NeighborLoader: sharded without a process group (num_replicas= and rank= given), so "
                         "the ranks cannot agree on a drawn seed: give the same seed= on every rank")
    import torch.distributed as dist

    box = [int(torch.randint(0, 2**62, (1,)).item())]
    dist.broadcast_object_list(box, src=0)
    return int(box[0])


class NeighborLoader(NodeLoader):
    """PyG's ``NeighborLoader`` over :class:`NeighborSampler` (``Data`` or ``HeteroData``).

    Arguments as PyG's: ``num_neighbors`` (on a ``HeteroData``: one list for all edge types or a
    dict by edge type), ``input_nodes`` (ids or a boolean mask, default all nodes; on a
    ``HeteroData`` a node type or ``(node type, ids or mask)``), ``batch_size``, ``shuffle``, ``replace``, ``directed``, ``disjoint``,
    ``num_workers``, ``persistent_workers``, ``pin_memory`` and the other DataLoader/NodeLoader
    keywords. Also ``seed`` (batches are a function of it) and ``profile``: a tuned profile
    (path, :class:`~gnncompile.profiles.Profile` or 'auto') whose ``batch_size``,
    ``num_workers``, ``pool_size`` (batches in flight: the DataLoader's prefetch depth),
    ``pin_memory`` and ``persistent_workers`` apply where they are not given here.

    Data-parallel training (one loader per rank, as with ``DistributedSampler``):

    * ``distributed=True``: shard the input nodes over the ranks of the default
      ``torch.distributed`` process group (it must be initialized); ``num_replicas`` and
      ``rank`` give the split explicitly instead (they win over the process group's, and need
      none: one process can rebuild any rank's batches; then ``seed`` is required).
    * Each epoch, every rank takes the same order of all input nodes (shuffled by ``seed`` and
      the epoch, or in order), padded by wrapping around to a multiple of ``num_replicas``, and
      uses every ``num_replicas``-th from ``rank`` on. So every rank gets ``ceil(n /
      num_replicas)`` seeds and the same number of batches, and the ranks together cover every
      input node (the padding repeats a few). ``shard_drop_last=True`` cuts the order to a
      multiple of ``num_replicas`` instead (``n // num_replicas`` seeds a rank; the tail of
      the order, a different one each shuffled epoch, is left out).
    * The seed must be the same on every rank: with ``seed=None`` and a process group, rank 0's
      is broadcast (a collective: construct the loader on every rank).
    * A rank's batches are a function of (``seed``, epoch, ``num_replicas``, ``rank``), with any
      ``num_workers``; with one replica they are the unsharded loader's.

    Epochs: each iteration is the next epoch (the first is 0). ``set_epoch(k)``, as
    ``DistributedSampler.set_epoch``, makes the next iteration epoch ``k`` (resuming a run);
    ``loader.epoch`` is the epoch of the iteration under way (before the first, or after
    ``set_epoch``, the next one's).
    """

    def __init__(self, data: Any, num_neighbors: Any, input_nodes: Any = None,
                 batch_size: Optional[int] = None, shuffle: bool = False, replace: bool = False,
                 directed: bool = True, disjoint: bool = False, num_workers: Optional[int] = None,
                 persistent_workers: Optional[bool] = None, pin_memory: Optional[bool] = None,
                 seed: Optional[int] = None, profile: Any = None, distributed: bool = False,
                 num_replicas: Optional[int] = None, rank: Optional[int] = None,
                 shard_drop_last: bool = False, **kwargs) -> None:
        for key in ("sampler", "batch_sampler"):
            if key in kwargs:
                raise TypeError(f"NeighborLoader chooses the {key} itself; use shuffle/seed")
        sharded, num_replicas, rank, group = _shard_settings(bool(distributed), num_replicas, rank)
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
        n = self._num_inputs(data, input_nodes)
        seed = _shared_seed(seed, sharded, group)
        sampler = NeighborSampler(data, num_neighbors, replace=replace, directed=directed,
                                  disjoint=disjoint, seed=seed)
        self.seed = sampler.seed
        self.num_replicas, self.rank = num_replicas, rank
        self._epochs = _EpochSampler(n, bool(shuffle), sampler.seed, num_replicas, rank, bool(shard_drop_last))
        super().__init__(data, node_sampler=sampler, input_nodes=input_nodes,
                         sampler=self._epochs, **opts, **kwargs)
        # DataLoader freezes `dataset` after __init__; the positions it yields carry the epoch.
        object.__setattr__(self, "dataset", _Positions(n))
        self.settings = dict(opts, prefetch_factor=kwargs.get("prefetch_factor"))

    @property
    def epoch(self) -> int:
        """The epoch of the iteration under way (before the first, or after :meth:`set_epoch`:
        the next iteration's)."""
        return self._epochs.epoch

    def set_epoch(self, epoch: int) -> None:
        """Makes the next iteration epoch ``epoch`` (its shuffle and batch seeds), as
        ``DistributedSampler.set_epoch``; later iterations count on from it."""
        self._epochs.set_epoch(epoch)

    @staticmethod
    def _num_inputs(data: Any, input_nodes: Any) -> int:
        if isinstance(data, HeteroData):
            if isinstance(input_nodes, str):
                input_nodes = (input_nodes, None)
            if (not isinstance(input_nodes, (tuple, list)) or len(input_nodes) != 2
                    or not isinstance(input_nodes[0], str)):
                raise ValueError("on a heterogeneous graph input_nodes is a node type, or (node type, ids or "
                                 f"mask); got {input_nodes!r}")
            node_type, input_nodes = input_nodes
            if node_type not in data.node_types:
                raise ValueError(f"input node type {node_type!r} is not a node type of the graph "
                                 f"({data.node_types})")
            if input_nodes is None:
                return int(data[node_type].num_nodes)
        elif input_nodes is None:
            return int(data.num_nodes)
        t = torch.as_tensor(input_nodes)
        return int(t.sum()) if t.dtype == torch.bool else int(t.numel())

    def collate_fn(self, index) -> Any:
        idx = torch.as_tensor(index, dtype=torch.long).reshape(-1)
        n = self._epochs.n
        epoch, pos = idx // n, idx % n
        input_data: NodeSamplerInput = self.input_data[pos]
        batch_seed = _mix(self.seed, int(epoch[0]) if idx.numel() else 0, int(pos[0]) if idx.numel() else 0)
        if self._epochs.num_replicas > 1:  # ranks whose batches start at the same (padded) position differ
            batch_seed = _mix(batch_seed, self._epochs.num_replicas, self._epochs.rank)
        out = self.node_sampler.sample_from_nodes(input_data, seed=batch_seed)
        if self.filter_per_worker:
            out = self.filter_fn(out)
        return out


__all__ = ["NeighborSampler", "NeighborLoader"]
