"""Batches padded to a few fixed sizes (buckets): what a CUDA graph needs (static shapes).

``PooledLoader(dataset, batch_size, pad_to_buckets=...)`` pads every batch it yields to one of a
few bucket sizes: ``nodes`` and ``edges`` from a short list of ``(nodes, edges)`` pairs, and a
fixed graph count ``batch_size + 1``. The layout of a padded batch of ``B`` real graphs with
``N`` nodes and ``E`` edges, in a bucket ``(Nb, Eb)`` with ``G = batch_size + 1`` graphs:

* nodes ``[0, N)`` and edges ``[0, E)`` are the real batch, unchanged (the same values, in the
  same order, as the unpadded batch);
* nodes ``[N, Nb)`` are padding nodes (node attributes zero) in one extra graph, the last one
  (``batch`` = ``G - 1``); graphs ``B .. G - 2`` are empty (no nodes);
* edges ``[E, Eb)`` join padding nodes only (a cycle over them, ``N + k % P -> N + (k + 1) % P``
  for ``P = Nb - N`` padding nodes; a self loop when ``P == 1``), edge attributes zero;
* graph-level attributes of graphs ``B .. G - 1`` are zero; the target ``y`` (integer) is the
  ``ignore_index`` there (default -100, ``F.cross_entropy``'s) and on padding nodes for a
  node-level ``y``;
* ``graph_mask`` ``[G]``, ``node_mask`` ``[Nb]``, ``edge_mask`` ``[Eb]`` (bool): True for the real
  graphs, nodes, edges; ``batch.num_graphs`` is ``G``; ``batch.padding`` holds the real counts
  (``PadInfo``: Python ints, which a captured step must not read: use the masks).

There is always at least one padding node, so ``int(batch.max()) + 1`` (PyG's readouts without a
size) is ``G`` for every batch. Message passing, readouts by graph and a loss that ignores the
padded targets (``cross_entropy(..., ignore_index=-100)``, or a sum weighted by the masks) give
the real graphs the outputs, loss and gradients of the unpadded batch: no padding node or edge
reaches a real node. What does not hold under padding: anything that mixes rows across the batch
(BatchNorm in training mode, a mean over all nodes without the mask, a loss that averages over
padded rows).

Buckets (``choose_buckets``): from the node and edge totals of sample batches of the dataset (a
private generator: the global RNG is not drawn from), the batches split at node-count quantiles
into ``k`` groups, each bucket the largest node count + 1 and edge count of its group, rounded up
to a multiple of ``granule``, the largest one standard deviation of the totals higher. A batch is put in the smallest bucket that holds it (``N + 1 <= Nb``
and ``E <= Eb``); a batch that no bucket holds gets a new bucket (rounded up, 5% over its size;
a warning says so) before its pass starts; after ``MAX_NEW`` (4) such buckets the next one is the
largest possible batch (the ``batch_size`` largest graphs), so a loader never holds more than
``k + 5`` buckets. ``loader.padding_stats()`` reports the buckets, the
batches in each and the padding overhead (padded / real nodes and edges) over what was yielded.
"""
from __future__ import annotations

import math
import numbers
import statistics
from dataclasses import dataclass
from typing import Dict, List, Optional, Sequence, Tuple

import torch

MASK_KEYS = ("graph_mask", "node_mask", "edge_mask")
# new buckets a loader adds (for batches no bucket holds) before the next one is the largest
# possible batch (so a loader has at most count + MAX_NEW + 1 buckets)
MAX_NEW = 4
_SIGNED = (torch.int64, torch.int32, torch.int16, torch.int8)


@dataclass(frozen=True)
class PadInfo:
    """The real counts of a padded batch (``batch.padding``)."""

    num_graphs: int
    num_nodes: int
    num_edges: int
    bucket: Tuple[int, int]


class BucketPadding:
    """How ``PooledLoader(pad_to_buckets=...)`` pads.

    Args:
        buckets: an int ``k`` (1-16): ``k`` buckets chosen from the data; or a list of
            ``(nodes, edges)`` pairs (each >= 1 node, >= 0 edges).
        ignore_index: the padded value of an integer target ``y`` (graph- or node-level).
        granule: bucket sizes chosen from the data are rounded up to a multiple of it.
        sample: how many random batches of ``batch_size`` graphs the choice looks at.

    ValueError on a bad value.
    """

    def __init__(self, buckets=4, *, ignore_index: int = -100, granule: int = 8, sample: int = 1024) -> None:
        self.explicit: Optional[List[Tuple[int, int]]] = None
        if isinstance(buckets, (bool, str, bytes, dict)) or buckets is None:
            raise ValueError(f"pad_to_buckets: buckets must be a count or a list of (nodes, edges), got {buckets!r}")
        if isinstance(buckets, numbers.Integral):
            if not 1 <= buckets <= 16:
                raise ValueError(f"pad_to_buckets: a bucket count must be in [1, 16], got {buckets}")
            self.count = int(buckets)
        else:
            try:
                pairs = [tuple(b) for b in buckets]
            except TypeError:
                raise ValueError(f"pad_to_buckets: buckets must be a count or a list of (nodes, edges), "
                                 f"got {buckets!r}") from None
            if not pairs:
                raise ValueError("pad_to_buckets: the list of buckets is empty")
            for p in pairs:
                if (len(p) != 2 or any(isinstance(v, bool) or not isinstance(v, numbers.Integral) for v in p)
                        or p[0] < 1 or p[1] < 0):
                    raise ValueError(f"pad_to_buckets: a bucket must be (nodes >= 1, edges >= 0) integers, got {p!r}")
            self.explicit = sorted({(int(a), int(b)) for a, b in pairs})
            self.count = len(self.explicit)
        for name, v, lo in (("ignore_index", ignore_index, None), ("granule", granule, 1), ("sample", sample, 1)):
            if isinstance(v, bool) or not isinstance(v, numbers.Integral) or (lo is not None and v < lo):
                raise ValueError(f"pad_to_buckets: {name} must be an integer{'' if lo is None else f' >= {lo}'}, got {v!r}")
        self.ignore_index = int(ignore_index)
        self.granule = int(granule)
        self.sample = int(sample)

    @classmethod
    def of(cls, value) -> Optional["BucketPadding"]:
        """``PooledLoader``'s ``pad_to_buckets`` argument as a BucketPadding (None: off)."""
        if value is None or value is False:
            return None
        if isinstance(value, cls):
            return value
        if value is True:
            return cls()
        return cls(value)


def _round_up(v: int, g: int) -> int:
    return -(-v // g) * g


def choose_buckets(nodes: Sequence[int], edges: Sequence[int], k: int, granule: int = 8,
                   margin: float = 1.0) -> List[Tuple[int, int]]:
    """``k`` (or fewer, where groups coincide) buckets for batches of these node and edge totals:
    the batches sorted by node count and split into ``k`` groups of equal count; each bucket the
    group's largest node count + 1 (a padding node always) and largest edge count, rounded up to
    ``granule``; the largest bucket ``margin`` standard deviations of the totals higher (a batch
    beyond the sample's largest is then rare: each one costs a new bucket, a new CUDA graph).
    Every batch given fits a bucket."""
    if len(nodes) != len(edges) or not len(nodes):
        raise ValueError("choose_buckets: nodes and edges must be non-empty and of one length")
    order = sorted(range(len(nodes)), key=lambda i: (nodes[i], edges[i]))
    n = len(order)
    sn = statistics.pstdev(nodes) if n > 1 else 0.0
    se = statistics.pstdev(edges) if n > 1 else 0.0
    out = set()
    for g in range(k):
        grp = order[g * n // k:(g + 1) * n // k]
        if not grp:
            continue
        top = g == k - 1
        out.add((_round_up(max(nodes[i] for i in grp) + 1 + (math.ceil(margin * sn) if top else 0), granule),
                 _round_up(max(edges[i] for i in grp) + (math.ceil(margin * se) if top else 0), granule)))
    # a bucket with no more nodes and no more edges than a smaller one is useless; one with
    # fewer edges than a smaller-node bucket is kept (it serves that group)
    return sorted(out)


def pick(buckets: Sequence[Tuple[int, int]], n: int, e: int) -> Optional[int]:
    """The index of the bucket of least padded nodes (then edges) that holds ``n`` nodes + one
    padding node and ``e`` edges; None if none does."""
    best = None
    for i, (bn, be) in enumerate(buckets):
        if n + 1 <= bn and e <= be and (best is None or (bn, be) < buckets[best]):
            best = i
    return best


def new_bucket(n: int, e: int, granule: int) -> Tuple[int, int]:
    """A bucket for a batch no bucket holds: 5% over its size, rounded up."""
    return (_round_up(max(n + 1, math.ceil((n + 1) * 1.05)), granule), _round_up(math.ceil(e * 1.05), granule))


class PaddingStats:
    """Counts of what a padding loader yielded (``PooledLoader.padding_stats()``)."""

    def __init__(self) -> None:
        self.per_bucket: Dict[Tuple[int, int], int] = {}
        self.real_nodes = self.real_edges = self.padded_nodes = self.padded_edges = 0
        self.real_graphs = self.padded_graphs = 0

    def add(self, bucket: Tuple[int, int], n: int, e: int, b: int, g: int) -> None:
        self.per_bucket[bucket] = self.per_bucket.get(bucket, 0) + 1
        self.real_nodes += n
        self.real_edges += e
        self.padded_nodes += bucket[0]
        self.padded_edges += bucket[1]
        self.real_graphs += b
        self.padded_graphs += g

    def report(self, buckets: Sequence[Tuple[int, int]]) -> dict:
        def over(p, r):
            return (p / r - 1.0) if r else 0.0

        return {"buckets": [list(b) for b in buckets],
                "batches_per_bucket": {f"{b[0]}x{b[1]}": c for b, c in sorted(self.per_bucket.items())},
                "batches": sum(self.per_bucket.values()),
                "real_nodes": self.real_nodes, "padded_nodes": self.padded_nodes,
                "real_edges": self.real_edges, "padded_edges": self.padded_edges,
                "node_overhead": over(self.padded_nodes, self.real_nodes),
                "edge_overhead": over(self.padded_edges, self.real_edges),
                "graph_overhead": over(self.padded_graphs, self.real_graphs)}


def column_kinds(store) -> Dict[str, str]:
    """Each column of a loader's store as 'node', 'edge' or 'graph' level, from its per-graph
    sizes (node-level: one row per node of every graph; edge-level: as many as edge_index's
    columns; graph-level: one row per graph, or stacked). Where node and edge counts coincide
    for every graph, a name containing 'edge' is edge-level. ValueError for a column that is
    none of these (it cannot be padded), or for a dataset without a [2, E] int64 edge_index."""
    ei = None
    for c in store.columns:
        if c.key == "edge_index":
            v = c.values
            if not (c.cat_dim == 1 and v.dim() == 2 and v.size(0) == 2 and v.dtype == torch.int64 and not c.stacked):
                raise ValueError("pad_to_buckets: edge_index must be an int64 [2, E] attribute")
            ei = c
    if ei is None:
        raise ValueError("pad_to_buckets: the graphs have no edge_index attribute")
    for k in MASK_KEYS:
        if any(c.key == k for c in store.columns) or k in store.all_keys:
            raise ValueError(f"pad_to_buckets: the graphs already have an attribute {k!r}, the name of a padding mask")
    kinds = {}
    for c in store.columns:
        if c.key == "edge_index":
            kinds[c.key] = "edge"
            continue
        is_node = torch.equal(c.sizes, store.num_nodes)
        is_edge = torch.equal(c.sizes, ei.sizes)
        if c.stacked or bool((c.sizes == 1).all()) and not (is_node or is_edge):
            if c.cat_dim != 0:
                raise ValueError(f"pad_to_buckets: graph-level attribute {c.key!r} is concatenated along dim "
                                 f"{c.cat_dim}; only dim 0 can be padded")
            kinds[c.key] = "graph"
        elif is_node and is_edge:
            kinds[c.key] = "edge" if "edge" in c.key else "node"
        elif is_node:
            kinds[c.key] = "node"
        elif is_edge:
            kinds[c.key] = "edge"
        else:
            raise ValueError(f"pad_to_buckets: attribute {c.key!r} has neither one row per node, nor per edge, "
                             f"nor per graph; it cannot be padded (exclude_keys=[{c.key!r}] leaves it out)")
        if kinds[c.key] != "edge" and c.cat_dim != 0:
            raise ValueError(f"pad_to_buckets: {kinds[c.key]}-level attribute {c.key!r} is concatenated along dim "
                             f"{c.cat_dim}; only dim 0 can be padded")
        if c.has_inc and c.key != "edge_index":
            raise ValueError(f"pad_to_buckets: attribute {c.key!r} has an increment between graphs "
                             "(an index other than edge_index); it cannot be padded")
    return kinds


def pad_into(store, kinds: Dict[str, str], bufs: Dict[str, torch.Tensor], used: dict, B: int,
             pad: tuple) -> None:
    """Writes the padding of a batch just collated into ``bufs`` (real part: ``used``) up to
    ``pad = (Nb, Eb, G, ignore_index)`` and updates ``used`` to the padded lengths (see the
    module docstring for the layout). ``used["_pad"]`` keeps the real counts."""
    from .loader import _used

    Nb, Eb, G, ignore = pad
    N = used["_num_nodes"]
    E = used["edge_index"]
    if N + 1 > Nb or E > Eb or B >= G:
        raise ValueError(f"pad_to_buckets: a batch of {B} graphs, {N} nodes, {E} edges does not fit the "
                         f"bucket of {Nb} nodes, {Eb} edges, {G} graphs")
    P = Nb - N
    targets = {"node": Nb, "edge": Eb, "graph": G}
    reals = {"node": N, "edge": E, "graph": B}
    for c in store.columns:
        kind = kinds[c.key]
        t, r = targets[kind], reals[kind]
        if c.key == "edge_index":
            buf = _used(bufs[c.key], 1, t)
            k = torch.arange(t - r)
            buf[0, r:] = N + k % P
            buf[1, r:] = N + (k + 1) % P
        else:
            buf = bufs[c.key]
            fill = ignore if c.key == "y" and c.values.dtype in _SIGNED else 0
            if c.cat_dim == 0:
                buf[r:t] = fill
            else:  # an edge-level attribute along dim 1 (as edge_index)
                _used(buf, c.cat_dim, t).narrow(c.cat_dim, r, t - r).fill_(fill)
        used[c.key] = t
        if c.key in store.follow_batch:
            bufs[c.key + "_batch"][r:t] = G - 1
            ptr = bufs[c.key + "_ptr"]
            ptr[B + 1:G] = r
            ptr[G] = t
            used[c.key + "_batch"] = t
            used[c.key + "_ptr"] = G + 1
    bufs["batch"][N:Nb] = G - 1
    ptr = bufs["ptr"]
    ptr[B + 1:G] = N
    ptr[G] = Nb
    used["batch"] = Nb
    used["ptr"] = G + 1
    for key, t, r in (("graph_mask", G, B), ("node_mask", Nb, N), ("edge_mask", Eb, E)):
        m = bufs[key]
        m[:r] = True
        m[r:t] = False
        used[key] = t
    used["_num_nodes"] = Nb
    used["_pad"] = (B, N, E, G)
