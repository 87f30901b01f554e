"""The pooled prefetching loader: PyG ``DataLoader`` batches, collated into reused buffers.

``PooledLoader(dataset, batch_size, shuffle, ...)`` yields the same ``Batch`` objects (same
graphs in the same order, same tensors) as ``torch_geometric.loader.DataLoader`` with the same
arguments and the same seed (the global RNG, or ``generator``): it draws from the RNG exactly
what torch's DataLoader draws (a base seed per epoch, then the sampler's permutation).

How it is faster:

* **Columnar store.** At construction the dataset is read once into one tensor per attribute
  (graphs concatenated, as ``InMemoryDataset`` stores them) plus per-graph sizes and
  increments. A batch is then one native call per attribute (``gnncompile::collate_rows``: a
  memcpy per graph, node offsets added to edge_index; native/cpu/collate_core.h), instead of
  ``dataset[i]`` and ``Batch.from_data_list`` over a Python list of ``Data`` objects.
* **The Batch object without PyG's per-object cost.** ``Batch(_base_cls=...)`` builds a
  resolver class and reads ``inspect.signature`` on every call, and each ``setattr`` walks
  ``Data.__setattr__`` and the storage's; ``_BatchFactory`` resolves the class and its
  constructor's arguments once per data class, and writes the attributes whose ``setattr``
  would end as a plain storage write (no setter of the user's on the way) directly. The
  batch's slices, increments and per-column totals come from one ``index_select`` and one
  ``cumsum`` over a table of every per-graph count (``_Store._table``). A batch of 128
  molecules: 149 -> 60 us to assemble, 89 -> 64 us to collate; an epoch of the loader alone
  12.5 -> 7.5 ms (benchmarks/results/molecules_s57a.md, column "loader alone"; PyG's
  DataLoader 80-105 ms).
* **Pool of buffers.** ``pool_size`` slots of pre-allocated buffers (sized for the largest
  possible batch) are reused; nothing is allocated per batch. Up to ``pool_size`` batches are
  in flight: one held by the training loop, the others being filled.
* **Workers.** With ``num_workers > 0`` that many forked processes fill slots (in shared
  memory) ahead of the training loop; ``persistent_workers`` keeps them across epochs.
* **The batch's structure** (``structures=True``, CPU targets; off by default). The worker
  that fills a slot also builds the batch's CSR (by destination, ``num_dst`` = the
  batch's nodes) and its CSC with ``build_csr`` / ``transpose_structure``, into the slot's
  structure buffers, with the edge_index's content fingerprint. At delivery the parent records
  them as valid (``gnncompile::adopt_worker_structure``: its own worker built them; CPU tensors
  only, whose kernels range-check every index they read) and enters them in the structure cache
  for the yielded ``edge_index`` tensor (``StructureCache.adopt``): the compiled model's
  ``cached_csr`` / ``cached_csc`` are identity hits, with no build and no validation in the
  step. The cache's rule still holds: an ``edge_index`` edited after delivery (in place, or
  behind its version counter: the CPU content check) is a miss and builds anew. When the slot is
  handed out again (the next ``next()`` after it, or a new pass) the entry leaves the cache and
  the structure tensors on the slot get a new version (the native record, and autograd, see
  them as changed). Without workers (``structures=True``) the structure is built at delivery,
  in the main thread (``StructureCache.prepare``): the step is spared the work, the main thread
  is not. Off by default because what it saves is small and only models whose compiled graph
  looks up the batch's own ``edge_index`` use it (benchmarks/results/loader_structures.md, 2-core
  Zen 4, batches of 128 molecules: the step's two lookups take 68 us instead of 222 us, while the
  parent's adoption and release take about 65 us per batch; GIN looks the batch's structure up, GCN
  the structure of its self-loop edge_index, built in the step either way, and GINE at this size
  keeps no fused op, so for those two the adoption is pure cost); end to end the difference is
  below the noise of a shared 2-core machine. With PyG's ``DataLoader``:
  :func:`gnncompile.data.prefetch_structures`.
* **CUDA target** (``device='cuda'``): slots are pinned when ``pin_memory`` (registered with
  ``cudaHostRegister`` when shared with workers), each slot has device buffers too, and the
  host-to-device copy runs on a side stream; the consumer's stream waits on an event, so the
  copy of batch i+1 overlaps the compute of batch i. (This path is not exercised by the
  CPU-only test suite.)
* **Padding to buckets** (``pad_to_buckets``; off by default): every batch padded in its slot
  to one of a few ``(nodes, edges)`` sizes and ``batch_size + 1`` graphs, the fixed shapes a
  CUDA graph needs (:class:`gnncompile.cuda_graphs.GraphedStep`). The parent assigns each batch
  of a pass its bucket before the pass starts (a batch no bucket holds gets a new one, and the
  slots grow); the collation (worker or inline) writes the real batch, then the padding
  (:func:`gnncompile.data.buckets.pad_into`: layout, masks, ``ignore_index`` targets).

A yielded batch lives in a slot's memory: it stays valid until the next batch is requested
(the usual training loop). ``batch.clone()`` keeps one longer. Its tensors have the layout of
the DataLoader's (contiguous, not views of the slot buffers), so a compiled model compiles
once for either loader.

Datasets the columnar store does not cover (heterogeneous graphs, non-tensor attributes,
a dataset with a ``transform``, which must run per access) are collated by PyG's own
``Batch.from_data_list`` (same batches, no pooling).
"""
from __future__ import annotations

import math
import numbers
import os
import queue as _queue
import signal
import sys
import time
import traceback
import warnings
import weakref
from typing import Any, Dict, Iterator, List, Optional, Sequence

import torch
from torch.autograd.graph import increment_version as _increment_version

with warnings.catch_warnings():
    warnings.simplefilter("ignore")
    from torch_geometric.data import Batch


class _Column:
    """One attribute of every graph, concatenated along its cat dim."""

    __slots__ = ("key", "cat_dim", "values", "starts", "sizes", "incs", "stacked", "has_inc", "capacity")

    def __init__(self, key, cat_dim, values, sizes, incs, stacked):
        self.key = key
        self.cat_dim = cat_dim
        self.values = values
        self.sizes = sizes
        self.starts = torch.cumsum(sizes, 0) - sizes
        self.incs = incs
        self.has_inc = bool((incs != 0).any()) if incs.numel() else False
        self.stacked = stacked
        self.capacity = 0


_SERIAL_ELEMS = 16384  # at::internal::GRAIN_SIZE is 32768
# dtypes the collate_rows kernel can add an increment to
_ADDABLE = (torch.int64, torch.int32, torch.int16, torch.int8, torch.uint8, torch.float32, torch.float64)


def _exclusive_cumsum(t: torch.Tensor) -> torch.Tensor:
    return torch.cumsum(t, 0) - t


def _repeat(values: torch.Tensor, sizes: torch.Tensor, total: int) -> torch.Tensor:
    """``torch.repeat_interleave(values, sizes)`` as a scatter of differences and a cumsum
    (much faster than repeat_interleave on small CPU tensors)."""
    offs = _exclusive_cumsum(sizes)
    d = torch.zeros(total + 1, dtype=values.dtype)
    d.index_add_(0, offs, torch.diff(values, prepend=values.new_zeros(1)))
    return torch.cumsum(d[:total], 0)


def _used(buf: torch.Tensor, cat_dim: int, n: int) -> torch.Tensor:
    """The first ``n`` entries along ``cat_dim`` of a slot buffer, laid out as the DataLoader
    lays a batch out: contiguous (along a dim other than 0, the buffer's start taken with that
    shape: a pooled ``edge_index`` ``[2, E]`` is contiguous), and not a view (a tensor of its
    own on the slot's storage: Dynamo guards on a view's base, so a compiled model would
    compile once for pooled batches and again for plain ones)."""
    shape = list(buf.shape)
    shape[cat_dim] = n
    stride = list(buf.stride())  # a contiguous buffer's: right for a first-dim prefix
    if cat_dim != 0:
        step = 1
        for d in range(len(shape) - 1, -1, -1):
            stride[d] = step
            step *= max(1, shape[d])
    out = torch.empty(0, dtype=buf.dtype, device=buf.device)
    return out.set_(buf.untyped_storage(), buf.storage_offset(), shape, stride)


def _top_sum(sizes: torch.Tensor, k: int) -> int:
    if sizes.numel() == 0:
        return 0
    k = min(k, sizes.numel())
    return int(torch.topk(sizes, k).values.sum())


def _item_row(d, k):
    """Attribute ``k`` of graph ``d`` as the store concatenates it: (tensor, cat dim). Scalars
    and 0-d tensors become one row, a stacked attribute (``__cat_dim__`` None) gets a new dim 0."""
    v = d[k]
    if isinstance(v, torch.Tensor):
        if v.layout != torch.strided:
            raise _Unsupported(f"attribute {k!r} is a {v.layout} tensor")
        cd = d.__cat_dim__(k, v)
        if cd is None:
            return v.unsqueeze(0), 0
        if not isinstance(cd, int):
            raise _Unsupported(f"cat dim of {k!r} is {cd!r}")
        if v.dim() == 0:
            return v.view(1), 0
        return v, cd + v.dim() if cd < 0 else cd
    if isinstance(v, (int, float)) and not isinstance(v, bool):
        return torch.tensor([v]), 0
    raise _Unsupported(f"attribute {k!r} of type {type(v).__name__}")


class _Store:
    """The dataset, column by column; collates a batch of graph ids into given buffers."""

    def __init__(self, dataset, follow_batch, exclude_keys):
        n = len(dataset)
        first = dataset[0]
        self.data_cls = type(first)
        self.keys = [k for k in first.keys() if k not in exclude_keys and k not in ("ptr",)]
        self.all_keys = sorted(first.keys())
        self.follow_batch = list(follow_batch)
        parts: Dict[str, list] = {k: [] for k in self.keys}
        sizes: Dict[str, list] = {k: [] for k in self.keys}
        incs: Dict[str, list] = {k: [] for k in self.keys}
        cat_dims: Dict[str, Any] = {}
        num_nodes = []
        for i in range(n):
            d = dataset[i]
            if type(d) is not self.data_cls or sorted(d.keys()) != self.all_keys:
                raise _Unsupported("graphs differ in type or attributes")
            num_nodes.append(int(d.num_nodes))
            for k in self.keys:
                if k == "num_nodes":
                    continue
                v, cd = _item_row(d, k)
                inc = d.__inc__(k, d[k]) if isinstance(d[k], torch.Tensor) else 0
                if isinstance(inc, torch.Tensor):
                    if inc.numel() != 1:
                        raise _Unsupported(f"non-scalar increment for {k!r}")
                    inc = inc.item()
                incs[k].append(int(inc) if inc else 0)
                if k in cat_dims and cat_dims[k] != cd:
                    raise _Unsupported(f"cat dim of {k!r} varies")
                cat_dims[k] = cd
                parts[k].append(v)
                sizes[k].append(v.size(cd))
        self.num_nodes = torch.tensor(num_nodes, dtype=torch.long)
        self.has_num_nodes_attr = "num_nodes" in self.keys
        # num_nodes is a function of a graph's attributes: compared on reuse only when some of
        # them are not in the columns (excluded keys, or an explicit num_nodes)
        self.check_nodes = bool(exclude_keys) or self.has_num_nodes_attr
        self.columns: List[_Column] = []
        for k in self.keys:
            if k == "num_nodes":
                continue
            stacked = isinstance(first[k], torch.Tensor) and first.__cat_dim__(k, first[k]) is None
            vals = torch.cat(parts[k], cat_dims[k])
            self.columns.append(_Column(k, cat_dims[k], vals, torch.tensor(sizes[k], dtype=torch.long),
                                        torch.tensor(incs[k], dtype=torch.long), stacked))
        for k in self.follow_batch:
            if not any(c.key == k for c in self.columns):
                raise _Unsupported(f"follow_batch key {k!r} is not a tensor attribute")
        # Every per-graph count a batch needs, one row each (the columns' sizes, the node
        # counts, the increments of the columns that have them): one index_select and one
        # cumsum a batch give every total, slice and increment (instead of a few small ops per
        # column).
        inc_cols = [c for c in self.columns if c.has_inc]
        self._table = torch.stack([c.sizes for c in self.columns] + [self.num_nodes]
                                  + [c.incs for c in inc_cols]) if n else torch.zeros(0, 0, dtype=torch.long)
        self._nodes_row = len(self.columns)
        self._inc_row = {c.key: self._nodes_row + 1 + i for i, c in enumerate(inc_cols)}
        self._batch_new = _BatchFactory(self.data_cls)

    def matches(self, dataset) -> bool:
        """Whether ``dataset`` holds exactly the graphs this store was read from: same length,
        class and attributes per graph, and every column equal (sizes per graph, dtype and
        values; num_nodes where it is not implied by the columns). Re-reads every graph but
        skips the increments and the store's allocation (see ``_cached_store``)."""
        n = self.num_nodes.numel()
        if len(dataset) != n:
            return False
        parts: Dict[str, list] = {c.key: [] for c in self.columns}
        for i in range(n):
            d = dataset[i]
            if type(d) is not self.data_cls or sorted(d.keys()) != self.all_keys:
                return False
            if self.check_nodes and d.num_nodes != int(self.num_nodes[i]):
                return False
            for c in self.columns:
                v, cd = _item_row(d, c.key)
                if cd != c.cat_dim or v.dim() != c.values.dim():
                    return False
                parts[c.key].append(v)
        for c in self.columns:
            if [v.size(c.cat_dim) for v in parts[c.key]] != c.sizes.tolist():
                return False
            try:
                vals = torch.cat(parts[c.key], c.cat_dim)
            except RuntimeError:  # other sizes along the other dims
                return False
            if vals.dtype != c.values.dtype or not torch.equal(vals, c.values):
                return False
        return True

    def set_capacity(self, batch_size: int) -> None:
        batch_size = min(batch_size, self.num_nodes.numel())  # no batch holds more graphs
        for c in self.columns:
            c.capacity = _top_sum(c.sizes, batch_size)
        self.node_capacity = _top_sum(self.num_nodes, batch_size)
        self.batch_size = batch_size

    def batch_totals(self, batches: Sequence[Sequence[int]]) -> Dict[str, int]:
        """The largest total per column (and of nodes, and of graphs) over ``batches``: the
        capacity a slot needs to hold every one of them."""
        lens = torch.tensor([len(b) for b in batches], dtype=torch.long)
        flat = torch.tensor([i for b in batches for i in b], dtype=torch.long)
        ends = torch.cumsum(lens, 0)

        def most(sizes: torch.Tensor) -> int:
            cs = torch.cat([sizes.new_zeros(1), torch.cumsum(sizes[flat], 0)])
            return int((cs[ends] - cs[ends - lens]).max()) if lens.numel() else 0

        out = {c.key: most(c.sizes) for c in self.columns}
        out["_num_nodes"] = most(self.num_nodes)
        out["_graphs"] = int(lens.max()) if lens.numel() else 0
        return out

    def fits(self, totals: Dict[str, int]) -> bool:
        return (totals["_graphs"] <= self.batch_size and totals["_num_nodes"] <= self.node_capacity
                and all(totals[c.key] <= c.capacity for c in self.columns))

    def grow_capacity(self, totals: Dict[str, int]) -> None:
        """Capacities at least ``totals`` (``batch_totals``), never smaller than now."""
        for c in self.columns:
            c.capacity = max(c.capacity, totals[c.key])
        self.node_capacity = max(self.node_capacity, totals["_num_nodes"])
        self.batch_size = max(self.batch_size, totals["_graphs"])

    def slot_bytes(self) -> int:
        """The size of one slot's buffers (``allocate``), after ``set_capacity``."""
        total = 0
        for c in self.columns:
            row = c.values.numel() // max(1, c.values.size(c.cat_dim))
            total += c.capacity * max(1, row) * c.values.element_size()
            if c.key in self.follow_batch:
                total += 8 * (c.capacity + self.batch_size + 1)
        return total + 8 * (self.node_capacity + self.batch_size + 1)

    def allocate(self, pin: bool = False, device=None, masks: bool = False) -> Dict[str, torch.Tensor]:
        """The buffers of one slot (largest possible batch); ``masks``: with the padding masks
        (``graph_mask``, ``node_mask``, ``edge_mask``: bool, of the graph, node and edge
        capacities)."""
        kw = {"pin_memory": True} if pin else {}
        if device is not None:
            kw = {"device": device}
        bufs = {}
        for c in self.columns:
            shape = list(c.values.shape)
            shape[c.cat_dim] = c.capacity
            bufs[c.key] = torch.empty(shape, dtype=c.values.dtype, **kw)
            if c.key in self.follow_batch:
                bufs[c.key + "_batch"] = torch.empty(c.capacity, dtype=torch.long, **kw)
                bufs[c.key + "_ptr"] = torch.empty(self.batch_size + 1, dtype=torch.long, **kw)
        bufs["batch"] = torch.empty(self.node_capacity, dtype=torch.long, **kw)
        bufs["ptr"] = torch.empty(self.batch_size + 1, dtype=torch.long, **kw)
        if masks:
            edges = next(c.capacity for c in self.columns if c.key == "edge_index")
            for k, n in (("graph_mask", self.batch_size), ("node_mask", self.node_capacity), ("edge_mask", edges)):
                bufs[k] = torch.empty(n, dtype=torch.bool, **kw)
        return bufs

    def collate_into(self, idx: torch.Tensor, bufs: Dict[str, torch.Tensor],
                     pad: Optional[tuple] = None) -> Dict[str, int]:
        """Writes the batch of graphs ``idx`` into ``bufs``; returns the used length per buffer.

        Attributes concatenated along dim 0 (x, y, ...), and the rows of a [k, E] attribute
        (edge_index), are whole-graph copies: one ``gnncompile::collate_rows`` call each (a
        memcpy per graph in the native kernel, with the node offsets added to edge_index).
        Other layouts take vectorised torch ops. With ``pad`` (nodes, edges, graphs,
        ignore_index: ``PooledLoader(pad_to_buckets=...)``) the batch is then padded to that
        size (:func:`gnncompile.data.buckets.pad_into`; attributes along dim 1 are laid out
        for the padded length from the start)."""
        from ..ops import collate_rows, segment_ids

        B = idx.numel()
        used: Dict[str, int] = {}
        totals = self._table.index_select(1, idx).sum(1).tolist()
        if pad is not None:
            lay = {"node": pad[0], "edge": pad[1], "graph": pad[2]}
        for i, c in enumerate(self.columns):
            total = totals[i]
            if c.cat_dim == 0:
                buf = bufs[c.key]
            elif pad is None:
                buf = _used(bufs[c.key], c.cat_dim, total)
            else:  # the padded layout; the real part is its first `total` entries along cat_dim
                buf = _used(bufs[c.key], c.cat_dim, lay[self.kinds[c.key]])
            incs = c.incs if c.has_inc else None
            native = c.values.is_contiguous() and (incs is None or c.values.dtype in _ADDABLE)
            if native and c.cat_dim == 0:
                collate_rows(c.values, c.starts, c.sizes, idx, buf, incs)
            elif native and c.cat_dim == 1 and c.values.dim() == 2 and c.values.size(0) <= 8:
                for r in range(c.values.size(0)):  # e.g. edge_index: one contiguous row at a time
                    collate_rows(c.values[r], c.starts, c.sizes, idx, buf[r], incs)
            else:
                self._collate_torch(c, idx, c.sizes[idx], total, buf)
            used[c.key] = total
            if c.key in self.follow_batch:
                segment_ids(c.sizes, idx, bufs[c.key + "_batch"], bufs[c.key + "_ptr"])
                used[c.key + "_batch"] = total
                used[c.key + "_ptr"] = B + 1
        total = totals[self._nodes_row]
        segment_ids(self.num_nodes, idx, bufs["batch"], bufs["ptr"])
        used["batch"] = total
        used["ptr"] = B + 1
        used["_num_nodes"] = total
        if pad is not None:
            from .buckets import pad_into

            pad_into(self, self.kinds, bufs, used, B, pad)
        return used

    @staticmethod
    def _collate_torch(c: "_Column", idx: torch.Tensor, sizes: torch.Tensor, total: int,
                       buf: torch.Tensor) -> None:
        if c.cat_dim != 0 and buf.size(c.cat_dim) != total:  # a padded layout (collate_into)
            tmp = torch.empty_like(buf.narrow(c.cat_dim, 0, total), memory_format=torch.contiguous_format)
            _Store._collate_torch(c, idx, sizes, total, tmp)
            buf.narrow(c.cat_dim, 0, total).copy_(tmp)
            return
        out = _used(buf, c.cat_dim, total)
        offs = _exclusive_cumsum(sizes)
        rows = torch.arange(total) + _repeat(c.starts[idx] - offs, sizes, total)
        if c.cat_dim == 0:
            # in pieces below torch's parallel grain: collation is many small ops, and a
            # parallel region costs more than it saves (far more on a loaded machine)
            row = max(1, c.values[0].numel()) if c.values.size(0) else 1
            step = max(1, _SERIAL_ELEMS // row)
            for a in range(0, total, step):
                torch.index_select(c.values, 0, rows[a:a + step], out=out[a:a + step])
        else:
            torch.index_select(c.values, c.cat_dim, rows, out=out)
        if c.has_inc:
            add = _repeat(_exclusive_cumsum(c.incs[idx]), sizes, total)
            shape = [1] * out.dim()
            shape[c.cat_dim] = total
            out.add_(add.view(shape).to(out.dtype))

    def make_batch(self, idx: torch.Tensor, bufs: Dict[str, torch.Tensor], used: Dict[str, int]) -> Batch:
        """The ``Batch`` of the graphs ``idx`` collated into ``bufs``: the object PyG's
        ``Batch.from_data_list`` makes (class, attributes in the same order, ``_num_graphs``,
        ``_slice_dict``, ``_inc_dict``, ``_num_nodes`` where the graphs carry ``num_nodes``),
        its tensors on the slot's memory. Built by :class:`_BatchFactory` (no per-batch class
        resolution or attribute-setter dispatch); the slices and increments of every column
        come from one cumsum over the store's table of per-graph counts (rows of one tensor)."""
        B = idx.numel()
        pad = used.get("_pad")
        sel = self._table.index_select(1, idx)
        cs = torch.zeros(sel.size(0), B + 1, dtype=torch.long)
        torch.cumsum(sel, 1, out=cs[:, 1:])
        zeros = None
        attrs: list = []
        slice_dict, inc_dict = {}, {}
        for i, c in enumerate(self.columns):
            attrs.append((c.key, _used(bufs[c.key], c.cat_dim, used[c.key])))
            slice_dict[c.key] = cs[i]
            r = self._inc_row.get(c.key)
            if r is not None:
                inc_dict[c.key] = cs[r, :B]
            else:
                if zeros is None:
                    zeros = torch.zeros(len(self.columns), B, dtype=torch.long)
                inc_dict[c.key] = zeros[i]
            if c.key in self.follow_batch:
                attrs.append((c.key + "_batch", _used(bufs[c.key + "_batch"], 0, used[c.key + "_batch"])))
                attrs.append((c.key + "_ptr", _used(bufs[c.key + "_ptr"], 0, used[c.key + "_ptr"])))
        private = [("_num_graphs", B if pad is None else pad[3]), ("_slice_dict", slice_dict),
                   ("_inc_dict", inc_dict)]
        if self.has_num_nodes_attr:
            private.append(("_num_nodes", sel[self._nodes_row].tolist()))
            attrs.append(("num_nodes", used["_num_nodes"]))
        if pad is not None:
            from .buckets import MASK_KEYS, PadInfo

            for k in MASK_KEYS:
                attrs.append((k, _used(bufs[k], 0, used[k])))
            private.append(("padding", PadInfo(pad[0], pad[1], pad[2], (used["_num_nodes"], used["edge_index"]))))
        attrs.append(("batch", _used(bufs["batch"], 0, used["batch"])))
        attrs.append(("ptr", _used(bufs["ptr"], 0, used["ptr"])))
        return self._batch_new(attrs, private)


class _BatchFactory:
    """Makes the ``Batch`` objects of one data class as ``Batch(_base_cls=cls)`` and
    ``setattr`` make them, without their per-object cost (~40 us a batch: PyG's metaclass
    builds a resolver class and reads ``inspect.signature`` on every ``Batch()``; each
    ``setattr`` walks ``Data.__setattr__`` and the storage's).

    Once per data class: the batch class and the constructor's arguments, by PyG's own rule
    (``DynamicInheritance.__call__``). Per attribute name, once: whether ``setattr`` on a new
    batch would end as a plain write of the storage (``_mapping[key] = value`` for a public
    name, ``__dict__[key] = value`` for a private one: no property of the batch class or of
    its storage class other than ``Data``'s and ``GlobalStorage``'s own, which write exactly
    that) -- those are written directly, every other name through ``setattr`` as before."""

    _DATA_SETTERS: Optional[Dict[str, Any]] = None

    def __init__(self, data_cls) -> None:
        import inspect

        from torch_geometric.data.batch import DynamicInheritance

        probe = Batch(_base_cls=data_cls)
        self.cls = type(probe)
        self.store_cls = type(probe._store)
        kwargs = {}
        params = list(inspect.signature(data_cls.__init__).parameters.items())
        for k, v in params[1:]:  # (no positional arguments here, as in DynamicInheritance)
            if k in ("args", "kwargs") or v.default is not inspect.Parameter.empty:
                continue
            kwargs[k] = None
        self.kwargs = kwargs
        self.new = super(DynamicInheritance, self.cls).__call__
        self._plain: Dict[str, bool] = {}

    @classmethod
    def _known_setters(cls) -> Dict[str, Any]:
        """Data's and GlobalStorage's property setters that end in ``storage[key] = value``
        (checked by tests/data/test_data.py against PyG's code: they are one-liners)."""
        if cls._DATA_SETTERS is None:
            from torch_geometric.data import Data
            from torch_geometric.data.storage import GlobalStorage

            known = {}
            for owner in (Data, GlobalStorage):
                for k in ("x", "edge_index", "edge_weight", "edge_attr", "y", "pos", "batch", "time", "face",
                          "num_nodes"):
                    p = getattr(owner, k, None)
                    if isinstance(p, property) and p.fset is not None:
                        known[(owner.__name__, k)] = p.fset
            cls._DATA_SETTERS = known
        return cls._DATA_SETTERS

    def _is_plain(self, key: str) -> bool:
        """Whether ``setattr(batch, key, v)`` on a new batch (v not None) only writes the
        storage: ``Data.__setattr__`` calls a property's setter where the class has one, else
        sets the attribute on the storage, whose ``__setattr__`` calls its class's setter
        where there is one, else writes ``_mapping`` (a public name) or ``__dict__`` (a
        private one). Plain: no setter on the way other than the known one-liners."""
        ok = self._plain.get(key)
        if ok is None:
            from torch_geometric.data import Data
            from torch_geometric.data.storage import BaseStorage, GlobalStorage

            known = self._known_setters()
            ok = (key != "_parent" and self.cls.__setattr__ is Data.__setattr__
                  and self.store_cls.__setattr__ is BaseStorage.__setattr__
                  and self.store_cls.__setitem__ is BaseStorage.__setitem__)
            for owner, base in ((self.cls, Data), (self.store_cls, GlobalStorage)):
                fset = getattr(getattr(owner, key, None), "fset", None)
                if fset is not None and known.get((base.__name__, key)) is not fset:
                    ok = False
            self._plain[key] = ok
        return ok

    def __call__(self, attrs: Sequence[tuple], private: Sequence[tuple]) -> Batch:
        out = self.new(**self.kwargs)
        store = out._store
        if type(store) is not self.store_cls or getattr(store, "_cached_attr", None):
            for k, v in list(attrs) + list(private):  # (not seen with PyG's classes)
                setattr(out, k, v)
            return out
        mapping, sdict = store._mapping, store.__dict__
        for k, v in attrs:
            if v is not None and self._is_plain(k):
                mapping[k] = v
            else:
                setattr(out, k, v)
        for k, v in private:
            if self._is_plain(k):
                sdict[k] = v
            else:
                setattr(out, k, v)
        return out


class _Unsupported(Exception):
    pass


# The last store built, reused by the next loader over the same dataset object with the same
# keys if the dataset still holds the same graphs: a tuner builds many loaders over one dataset.
_LAST_STORE: list = []


def _cached_store(dataset, follow_batch, exclude_keys) -> _Store:
    """The store of ``dataset``: the last one built if it was built from this dataset object
    and ``_Store.matches`` proves the graphs unchanged (items replaced or edited in place, by
    torch ops or through numpy, are caught: the check compares values, not versions or ids),
    else a new one."""
    key = (tuple(follow_batch), tuple(exclude_keys))
    if _LAST_STORE:
        ref, k, store = _LAST_STORE[0]
        if ref() is dataset and k == key:
            try:
                if store.matches(dataset):
                    return store
            except _Unsupported:  # an attribute changed type: the new build decides
                pass
        _LAST_STORE[:] = []  # do not keep a stale copy alive through the build
    store = _Store(dataset, follow_batch, exclude_keys)
    try:
        _LAST_STORE[:] = [(weakref.ref(dataset), key, store)]
    except TypeError:  # not weak-referenceable (e.g. a plain list): no caching
        pass
    return store


# how often an idle worker checks that its parent is still alive
_PARENT_POLL_S = 0.5
# num_workers above this many per CPU core is clamped (with a warning)
_WORKERS_PER_CPU = 4


def _set_parent_death_signal() -> None:
    """Linux: have the kernel SIGKILL this process when the thread that forked it exits."""
    import ctypes

    libc = ctypes.CDLL(None, use_errno=True)
    pr_set_pdeathsig = 1
    if libc.prctl(pr_set_pdeathsig, int(signal.SIGKILL), 0, 0, 0) != 0:
        raise OSError(ctypes.get_errno(), "prctl(PR_SET_PDEATHSIG) failed")


def _worker_setup(parent: int, death_signal: bool) -> None:
    # Ctrl-C reaches the whole foreground process group: the parent decides (it stops the
    # workers). SIGINT was blocked across the fork, so none arrives before it is ignored.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.pthread_sigmask(signal.SIG_UNBLOCK, [signal.SIGINT])
    if death_signal:
        try:
            _set_parent_death_signal()
        except (OSError, AttributeError):
            pass  # the getppid() poll in _worker_loop still ends an orphan
    if os.getppid() != parent:  # the parent died before the signal was armed
        os._exit(0)


def _worker_loop(store: _Store, slots, struct_slots, jobs, results, parent: int, death_signal: bool) -> None:
    _worker_setup(parent, death_signal)
    torch.set_num_threads(1)
    while True:
        try:
            job = jobs.get(timeout=_PARENT_POLL_S)
        except _queue.Empty:
            if os.getppid() != parent:  # orphaned: leave now, without flushing the queues
                os._exit(0)
            continue
        if job is None:
            return
        tag, batch_no, slot, idx, pad = job
        try:
            used = store.collate_into(torch.tensor(idx, dtype=torch.long), slots[slot], pad)
            if struct_slots is not None:
                _build_structure_into(store, slots[slot], used, struct_slots[slot])
            results.put((tag, batch_no, slot, used, None))
        except Exception:  # reported to the main process
            results.put((tag, batch_no, slot, None, traceback.format_exc()))


# The structure a slot carries with structures=True (workers): CSR by destination, then its CSC
_STRUCT_KEYS = ("rowptr", "col", "perm", "rowptr_t", "col_t", "perm_t")


def _edge_index_column(store: "_Store") -> Optional["_Column"]:
    """The store's ``edge_index`` column when the loader can prepare its structure: int64
    ``[2, E]`` concatenated along dim 1 (PyG's layout); None otherwise."""
    for c in store.columns:
        if c.key == "edge_index":
            v = c.values
            ok = c.cat_dim == 1 and v.dim() == 2 and v.size(0) == 2 and v.dtype == torch.int64 and not c.stacked
            return c if ok else None
    return None


def _structure_buffers(store: "_Store", shared: bool) -> Dict[str, torch.Tensor]:
    """One slot's structure buffers (largest batch): rowptrs of node_capacity + 1, the rest of
    the edge capacity."""
    edges = _edge_index_column(store).capacity
    bufs = {k: torch.empty(store.node_capacity + 1 if k.startswith("rowptr") else edges, dtype=torch.long)
            for k in _STRUCT_KEYS}
    if shared:
        for t in bufs.values():
            t.share_memory_()
    return bufs


def _build_structure_into(store: "_Store", bufs: Dict[str, torch.Tensor], used: Dict[str, Any],
                          sbufs: Dict[str, torch.Tensor]) -> None:
    """In a worker: the CSR (by destination, num_dst = num_src = the batch's nodes) and CSC of
    the batch just collated into ``bufs``, written into the slot's structure buffers;
    ``used["_struct"]`` tells the parent (nodes, edges, source min / max, the content
    fingerprint of the edge_index they were built from). An edge_index that does not build
    (an index out of range) leaves no ``_struct``: the model's own lookup raises as usual."""
    from ..ops import structure as S

    N, E = used["_num_nodes"], used["edge_index"]
    ei = _used(bufs["edge_index"], 1, E)
    try:
        fp = S.fingerprint(ei)  # of the content the structure is built from
        s = S.build(ei, N)
        s.check_sources(N)
        built = (s.rowptr, s.col, s.perm) + tuple(S.transpose_structure(s.rowptr, s.col, s.perm, N))
    except (IndexError, ValueError, RuntimeError):
        return
    for k, t in zip(_STRUCT_KEYS, built):
        sbufs[k][:t.numel()].copy_(t)
    used["_struct"] = (N, E, s.src_min, s.src_max, fp)


def _count(name: str, value, minimum: int) -> int:
    """``value`` as an int >= ``minimum``, else a ValueError naming the argument."""
    if isinstance(value, bool) or not isinstance(value, numbers.Integral) or value < minimum:
        raise ValueError(f"PooledLoader: {name} must be an integer >= {minimum}, got {value!r}")
    return int(value)


def _key_list(name: str, value) -> List[str]:
    if value is None:
        return []
    if isinstance(value, str) or not isinstance(value, (list, tuple)) or \
            not all(isinstance(k, str) for k in value):
        raise ValueError(f"PooledLoader: {name} must be a list of attribute names, got {value!r}")
    return list(value)


def _clamp_workers(n: int) -> int:
    cap = _WORKERS_PER_CPU * (os.cpu_count() or 1)
    if n > cap:
        warnings.warn(f"PooledLoader: num_workers={n} clamped to {cap} ({_WORKERS_PER_CPU} per CPU core)")
        return cap
    return n


def _pool_budget() -> int:
    """Bytes the pool's slots may take: a quarter of the machine's physical memory."""
    try:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") // 4
    except (ValueError, OSError, AttributeError):  # pragma: no cover - not POSIX
        return 4 << 30


class _Pass:
    """One pass over a :class:`PooledLoader`: what ``iter(loader)`` returns.

    The passes of a loader share its slots, so a loader has one live pass: a new ``iter()``
    (or ``loader.close()``) ends the previous pass (its jobs in flight are waited for first),
    and ``next()`` on an ended pass raises RuntimeError instead of yielding overwritten
    batches. A pass abandoned half-way therefore never blocks the next one."""

    def __init__(self, gen, loader: Optional["PooledLoader"] = None) -> None:
        self._gen = gen
        self._ended = False
        self._loader = weakref.ref(loader) if loader is not None else None

    def __del__(self) -> None:
        # Dropped half-way: its jobs in flight are waited for by the loader's next iter() or
        # close(), in the caller's context, not here: Python swallows exceptions in finalizers,
        # and a Ctrl-C that landed during that wait would be lost.
        ref = getattr(self, "_loader", None)  # absent if a Ctrl-C cut __init__ short
        loader = ref() if ref is not None else None
        if loader is not None and self._gen.gi_frame is not None:
            loader._abandoned.append(self._gen)

    def __iter__(self) -> "_Pass":
        return self

    def __next__(self) -> Batch:
        if self._ended:
            raise RuntimeError("PooledLoader: this iterator was ended by a newer iter() of its loader "
                               "(or by close()); a loader's batches share its buffers, so it serves one "
                               "iterator at a time (use two loaders for two concurrent passes)")
        return next(self._gen)

    def close(self) -> None:
        """Ends the pass now (as exhausting it does)."""
        self._gen.close()

    def _end(self) -> None:
        finished = self._gen.gi_frame is None
        try:
            self._gen.close()
        except ValueError:  # "generator already executing": next() runs in another thread
            raise RuntimeError("PooledLoader: an iterator of this loader is running in another thread; "
                               "a loader serves one iterator at a time") from None
        self._ended = not finished


class PooledLoader:
    """Mini-batches of graphs with ``torch_geometric.loader.DataLoader`` semantics.

    Args:
        dataset: a sequence of ``Data`` objects (list, ``InMemoryDataset``, ``Dataset``),
            read at construction (a later change to it needs a new loader).
        batch_size, shuffle, drop_last, generator, follow_batch, exclude_keys: as in PyG's
            ``DataLoader``.
        pool_size: slots of reusable buffers (>= 1); up to that many batches are in flight.
            Clamped to the batches of an epoch, and (with a warning) so that the slots take at
            most a quarter of the machine's memory.
        num_workers: processes that fill slots ahead of the training loop (0: the caller's
            process collates on demand); clamped (with a warning) to 4 per CPU core. Workers
            ignore SIGINT (the parent stops them) and die with their parent.
        pin_memory: page-locked host buffers (only with a CUDA ``device``).
        persistent_workers: keep the workers across epochs.
        device: where batches are delivered; a CUDA device turns on the side-stream copy.
        timeout: seconds to wait for a batch from the workers before raising RuntimeError.
        structures: build each batch's CSR / CSC ahead and put them in the structure cache
            for its ``edge_index`` (see the module docstring): in the workers, or without
            workers in the main thread at delivery. Only for CPU targets and an int64
            ``edge_index`` attribute; otherwise ignored. Default False.
        pad_to_buckets: pad every batch to one of a few fixed sizes (for CUDA graphs:
            :class:`gnncompile.cuda_graphs.GraphedStep`): None / False (default) off; True
            (4 buckets chosen from the data), a bucket count, a list of ``(nodes, edges)``, or a
            :class:`gnncompile.data.buckets.BucketPadding`. Layout, masks and the targets'
            ``ignore_index``: :mod:`gnncompile.data.buckets`; ``padding_stats()`` reports the
            overhead. ValueError for a dataset it cannot pad (an attribute neither per node,
            per edge nor per graph; no int64 edge_index; one the columnar store does not cover).

    Bad arguments (wrong type, out of range) raise ValueError. One iterator at a time: a new
    ``iter()`` ends the previous one (see :class:`_Pass`).
    """

    def __init__(self, dataset: Sequence, batch_size: int = 1, shuffle: bool = False, *,
                 drop_last: bool = False, generator: Optional[torch.Generator] = None,
                 follow_batch: Optional[List[str]] = None, exclude_keys: Optional[List[str]] = None,
                 pool_size: int = 2, num_workers: int = 0, pin_memory: bool = False,
                 persistent_workers: bool = False, device=None, timeout: float = 120.0,
                 structures: bool = False, pad_to_buckets=None) -> None:
        self._workers: list = []
        self._pass = None
        self._abandoned: List[Any] = []  # generators of passes dropped half-way, not yet closed
        self.batch_size = _count("batch_size", batch_size, 1)
        self.pool_size = _count("pool_size", pool_size, 1)
        self.num_workers = _clamp_workers(_count("num_workers", num_workers, 0))
        if isinstance(timeout, bool) or not isinstance(timeout, numbers.Real) or not timeout > 0:
            raise ValueError(f"PooledLoader: timeout must be a number of seconds > 0, got {timeout!r}")
        if generator is not None and not isinstance(generator, torch.Generator):
            raise ValueError(f"PooledLoader: generator must be a torch.Generator, got {generator!r}")
        if not hasattr(dataset, "__len__") or not hasattr(dataset, "__getitem__"):
            raise ValueError(f"PooledLoader: dataset must be a sequence of graphs, got {type(dataset).__name__}")
        self.dataset = dataset
        self.shuffle = bool(shuffle)
        self.drop_last = bool(drop_last)
        self.generator = generator
        self.follow_batch = _key_list("follow_batch", follow_batch)
        self.exclude_keys = _key_list("exclude_keys", exclude_keys)
        self.device = torch.device(device) if device is not None else None
        self.cuda = self.device is not None and self.device.type == "cuda"
        self.pin_memory = bool(pin_memory) and self.cuda
        self._persistent_asked = bool(persistent_workers)
        self.persistent_workers = self._persistent_asked and self.num_workers > 0
        self.timeout = float(timeout)
        if not isinstance(structures, bool):
            raise ValueError(f"PooledLoader: structures must be True or False, got {structures!r}")
        self.structures = structures
        from .buckets import BucketPadding

        self._padding = BucketPadding.of(pad_to_buckets)
        self._store: Optional[_Store] = None
        if len(dataset) > 0 and getattr(dataset, "transform", None) is None:
            try:
                self._store = _cached_store(dataset, self.follow_batch, self.exclude_keys)
            except _Unsupported as e:
                warnings.warn(f"PooledLoader: {e}; collating with Batch.from_data_list (no pooling)")
        if self._padding is not None and self._store is None:
            raise ValueError("PooledLoader: pad_to_buckets needs a dataset the loader stores column-wise "
                             "(homogeneous graphs of tensor attributes, no transform)")
        if self._store is not None:
            self._store.set_capacity(self.batch_size)
            if self._padding is not None:
                self._init_padding()
            self.pool_size = self._pool_slots(self.pool_size)
            self._allocate_pool()

    # ------------------------------------------------------------------ padding
    def _init_padding(self) -> None:
        from . import buckets as bk

        store, spec = self._store, self._padding
        store.kinds = bk.column_kinds(store)
        self._pad_graphs = store.batch_size + 1
        self._pad_stats = bk.PaddingStats()
        if spec.explicit is not None:
            self._buckets = list(spec.explicit)
        else:
            n = len(self.dataset)
            gen = torch.Generator()
            gen.manual_seed(0)  # a private generator: the global RNG is not drawn from
            bs = min(self.batch_size, n)
            # random batches (graphs drawn with replacement: the totals' spread is what matters)
            ids = torch.randint(0, n, (spec.sample, bs), generator=gen)
            row_e = next(i for i, c in enumerate(store.columns) if c.key == "edge_index")
            nodes = store.num_nodes[ids].sum(1).tolist()
            edges = store.columns[row_e].sizes[ids].sum(1).tolist()
            self._buckets = bk.choose_buckets(nodes, edges, spec.count, spec.granule)
        self._grow_for_buckets(resize=False)

    def _grow_for_buckets(self, resize: bool) -> None:
        store = self._store
        nb = max(b[0] for b in self._buckets)
        eb = max(b[1] for b in self._buckets)
        size = {"node": nb, "edge": eb, "graph": self._pad_graphs}
        totals = {c.key: size[store.kinds[c.key]] for c in store.columns}
        totals["_num_nodes"] = nb
        totals["_graphs"] = self._pad_graphs
        if store.fits(totals):
            return
        if resize:
            self._resize_pool(totals=totals)
        else:
            store.grow_capacity(totals)

    def _batch_counts(self, batches: Sequence[Sequence[int]]) -> List[tuple]:
        """(graphs, nodes, edges) of each batch of graph ids."""
        store = self._store
        lens = torch.tensor([len(b) for b in batches], dtype=torch.long)
        flat = torch.tensor([i for b in batches for i in b], dtype=torch.long)
        ends = torch.cumsum(lens, 0)
        row_e = next(i for i, c in enumerate(store.columns) if c.key == "edge_index")
        sel = store._table[[store._nodes_row, row_e]].index_select(1, flat)
        cs = torch.cat([sel.new_zeros(2, 1), torch.cumsum(sel, 1)], 1)
        tot = cs[:, ends] - cs[:, ends - lens]
        return list(zip(lens.tolist(), tot[0].tolist(), tot[1].tolist()))

    def _plan_padding(self, batches: Sequence[Sequence[int]]) -> List[tuple]:
        """The bucket of each batch of a pass, as ``collate_into``'s ``pad`` argument; a batch
        that no bucket holds gets a new one (with a warning), and the slots grow to the largest
        bucket before the pass starts. ValueError for a batch of more graphs than the padded
        graph count allows."""
        from . import buckets as bk

        spec, G = self._padding, self._pad_graphs
        out = []
        added = []
        for B, N, E in self._batch_counts(batches) if batches else []:
            if B + 1 > G:
                raise ValueError(f"PooledLoader(pad_to_buckets): a batch of {B} graphs; padded batches hold at most "
                                 f"{G - 1} real graphs (batch_size) and one padding graph")
            i = bk.pick(self._buckets, N, E)
            if i is None:
                if len(self._buckets) >= spec.count + bk.MAX_NEW:  # bounded: the largest possible batch
                    nb = self._cap_bucket()
                else:
                    nb = bk.new_bucket(N, E, spec.granule)
                self._buckets = sorted(self._buckets + [nb])
                added.append(nb)
                i = bk.pick(self._buckets, N, E)
            out.append(self._buckets[i] + (G, spec.ignore_index))
        if added:
            warnings.warn(f"PooledLoader(pad_to_buckets): {len(added)} new bucket(s) {added} for batches that no "
                          f"bucket held; buckets now {self._buckets}")
            self._grow_for_buckets(resize=True)
        return out

    def _cap_bucket(self) -> tuple:
        """The bucket of the largest possible batch: the ``G - 1`` largest graphs' nodes (+ 1)
        and edges."""
        from . import buckets as bk

        store, g = self._store, self._padding.granule
        ei = next(c for c in store.columns if c.key == "edge_index")
        return (bk._round_up(_top_sum(store.num_nodes, self._pad_graphs - 1) + 1, g),
                bk._round_up(_top_sum(ei.sizes, self._pad_graphs - 1), g))

    @property
    def buckets(self) -> List[tuple]:
        """The ``(nodes, edges)`` buckets batches are padded to (empty when not padding)."""
        return list(self._buckets) if self._padding is not None else []

    def padding_stats(self) -> dict:
        """What padding cost over the batches yielded so far: the buckets, batches per bucket,
        real and padded node / edge counts, and the overheads (padded / real - 1)."""
        if self._padding is None:
            raise RuntimeError("PooledLoader.padding_stats: this loader does not pad (pad_to_buckets)")
        return self._pad_stats.report(self._buckets)

    @property
    def _structures(self) -> bool:
        """Whether the batches' structures are prepared (``structures``, where it applies)."""
        return (self.structures and not self.cuda and self._store is not None
                and _edge_index_column(self._store) is not None)

    def _pool_slots(self, requested: int, clamp_to_epoch: bool = True) -> int:
        """``requested`` slots, less those an epoch never uses and those over the memory budget."""
        slots = min(requested, max(1, len(self))) if clamp_to_epoch else requested
        per_slot = max(1, self._store.slot_bytes())
        fit = max(1, _pool_budget() // per_slot)
        if slots > fit:
            warnings.warn(f"PooledLoader: pool_size={requested} clamped to {fit}: {slots} slots of "
                          f"{per_slot / 2**20:.1f} MiB would exceed a quarter of the machine's memory")
            slots = fit
        return slots

    def _allocate_pool(self) -> None:
        if self._padding is not None:  # (another loader over the same store may have set it smaller)
            self._grow_for_buckets(resize=False)
        shared = self.num_workers > 0
        self._shared_pool = shared
        self._unhand_all()
        self._handed = [None] * self.pool_size
        self._sbufs = ([_structure_buffers(self._store, shared) for _ in range(self.pool_size)]
                       if self._structures and shared else None)
        self._host = []
        for _ in range(self.pool_size):
            bufs = self._store.allocate(pin=self.pin_memory and not shared, masks=self._padding is not None)
            if shared:
                for t in bufs.values():
                    t.share_memory_()
                    if self.pin_memory:
                        _host_register(t)
            self._host.append(bufs)
        if self.cuda:
            self._dev = [self._store.allocate(device=self.device, masks=self._padding is not None)
                         for _ in range(self.pool_size)]
            self._stream = torch.cuda.Stream(self.device)
            self._copied = [None] * self.pool_size
            self._released = [None] * self.pool_size

    # ------------------------------------------------------------------ sampling
    def __len__(self) -> int:
        n = len(self.dataset)
        return n // self.batch_size if self.drop_last else math.ceil(n / self.batch_size)

    def _epoch_batches(self) -> List[List[int]]:
        """The batches of one epoch, drawing from the RNG what torch's DataLoader draws."""
        n = len(self.dataset)
        torch.empty((), dtype=torch.int64).random_(generator=self.generator)  # base seed
        if self.shuffle:
            if self.generator is None:
                seed = int(torch.empty((), dtype=torch.int64).random_().item())
                gen = torch.Generator()
                gen.manual_seed(seed)
            else:
                gen = self.generator
            order = torch.randperm(n, generator=gen).tolist()
            torch.randperm(n, generator=gen)  # RandomSampler draws a second (empty) tail
        else:
            order = list(range(n))
        bs = self.batch_size
        out = [order[i:i + bs] for i in range(0, n, bs)]
        if self.drop_last and out and len(out[-1]) < bs:
            out.pop()
        return out

    # ------------------------------------------------------------------ workers
    def _start_workers(self) -> None:
        import multiprocessing as mp
        import threading

        ctx = mp.get_context("fork")
        self._jobs = ctx.Queue()
        self._results = ctx.Queue()
        self._workers = []
        # The kernel's parent-death signal fires when the forking *thread* exits: armed only
        # when that is the main thread (its exit is the process's). Workers forked from another
        # thread rely on their getppid() poll alone to die with the parent.
        death_signal = sys.platform.startswith("linux") and threading.current_thread() is threading.main_thread()
        args = (self._store, self._host, self._sbufs, self._jobs, self._results, os.getpid(), death_signal)
        mask = signal.pthread_sigmask(signal.SIG_BLOCK, [signal.SIGINT])  # see _worker_setup
        try:
            for _ in range(self.num_workers):
                p = ctx.Process(target=_worker_loop, args=args, daemon=True)
                p.start()
                self._workers.append(p)
        finally:
            signal.pthread_sigmask(signal.SIG_SETMASK, mask)
        self._tag = 0

    def _stop_workers(self) -> None:
        for _ in self._workers:
            try:
                self._jobs.put(None)
            except Exception:
                pass
        for p in self._workers:
            p.join(timeout=5)
            if p.is_alive():
                p.terminate()
        self._workers = []

    def _end_pass(self) -> None:
        prev = self._pass() if self._pass is not None else None
        self._pass = None
        if prev is not None:
            prev._end()
        while self._abandoned:  # passes dropped half-way (_Pass.__del__)
            self._abandoned.pop().close()

    def close(self) -> None:
        """Ends the live iterator and stops the workers (also done at garbage collection)."""
        self._end_pass()
        if self._workers:
            self._stop_workers()

    def __del__(self):
        try:
            self.close()
        except Exception:
            pass

    # ------------------------------------------------------------------ iteration
    def __iter__(self) -> Iterator[Batch]:
        self._end_pass()
        if self._store is not None and len(self.dataset) != self._store.num_nodes.numel():
            raise RuntimeError(f"PooledLoader: the dataset has {len(self.dataset)} graphs, "
                               f"{self._store.num_nodes.numel()} when the loader read it; a loader reads "
                               "its dataset once, at construction: build a new one")
        batches = self._epoch_batches()
        pads = self._plan_padding(batches) if self._padding is not None else None
        if self._store is None:
            gen = self._iter_fallback(batches)
        elif self.num_workers == 0:
            gen = self._iter_inline(batches, pads)
        else:
            gen = self._iter_workers(batches, pads)
        it = _Pass(gen, self)
        self._pass = weakref.ref(it)
        return it

    def iter_batches(self, batches: Sequence[Sequence[int]]) -> "_Pass":
        """One pass over the given batches of graph ids, in that order, instead of an epoch of
        ``batch_size`` batches: the hook of :class:`gnncompile.adapt.AdaptiveLoader`, which
        chooses each batch itself (by graph count, or packed up to a node or edge budget).

        Same slots, workers and delivery as ``iter()``, and the same one-pass-at-a-time rule
        (it ends the live pass). Draws nothing from the RNG. When a batch needs more room than
        the slots have (more graphs than ``batch_size``, or more nodes or edges than the
        ``batch_size`` largest graphs), the slots grow to fit every batch given (a new pool:
        workers, if any, restart at the next pass). Each batch must be a non-empty list of
        graph ids in range; ValueError otherwise."""
        self._end_pass()
        n = len(self.dataset)
        if isinstance(batches, (str, bytes)) or not hasattr(batches, "__iter__"):
            raise ValueError(f"PooledLoader.iter_batches: batches must be a list of lists of graph ids, "
                             f"got {type(batches).__name__}")
        plan: List[List[int]] = []
        for b in batches:
            if isinstance(b, torch.Tensor):
                b = b.tolist()
            if isinstance(b, (str, bytes)) or not hasattr(b, "__iter__"):
                raise ValueError(f"PooledLoader.iter_batches: a batch must be a list of graph ids, got {b!r}")
            b = list(b)
            if not b:
                raise ValueError("PooledLoader.iter_batches: a batch is empty")
            for i in b:
                if isinstance(i, bool) or not isinstance(i, numbers.Integral) or not 0 <= i < n:
                    raise ValueError(f"PooledLoader.iter_batches: graph id {i!r} is not an integer in "
                                     f"[0, {n - 1}]")
            plan.append([int(i) for i in b])
        if self._store is None:
            gen = self._iter_fallback(plan)
        else:
            if plan:
                totals = self._store.batch_totals(plan)
                if not self._store.fits(totals):
                    self._resize_pool(totals=totals)
            pads = self._plan_padding(plan) if self._padding is not None else None
            gen = self._iter_inline(plan, pads) if self.num_workers == 0 else self._iter_workers(plan, pads)
        it = _Pass(gen, self)
        self._pass = weakref.ref(it)
        return it

    def reconfigure(self, *, pool_size: Optional[int] = None, num_workers: Optional[int] = None) -> None:
        """Changes the pool size and the number of workers of this loader between passes (it
        ends the live pass): the dataset's store is kept, the slots are reallocated (a pool
        size) and the workers stopped (they start again, as many as asked, at the next pass).
        ValueError on a bad value, as in the constructor."""
        pool = self.pool_size if pool_size is None else _count("pool_size", pool_size, 1)
        workers = self.num_workers if num_workers is None else _clamp_workers(_count("num_workers", num_workers, 0))
        self._end_pass()
        if workers != self.num_workers:
            if self._workers:
                self._stop_workers()
            self.num_workers = workers
            self.persistent_workers = bool(self._persistent_asked) and workers > 0
        if pool != self.pool_size or (self._store is not None and bool(workers) != self._shared_pool):
            self.pool_size = pool
            if self._store is not None:
                self._resize_pool()

    def _resize_pool(self, totals: Optional[Dict[str, int]] = None) -> None:
        """New slots (grown to ``totals`` when given); workers stop (they hold the old slots)."""
        if self._workers:
            self._stop_workers()
        if totals is not None:
            self._store.grow_capacity(totals)
        self.pool_size = self._pool_slots(self.pool_size, clamp_to_epoch=False)
        self._allocate_pool()

    def _iter_fallback(self, batches):
        for b in batches:
            out = Batch.from_data_list([self.dataset[i] for i in b], follow_batch=self.follow_batch,
                                       exclude_keys=self.exclude_keys)
            yield out.to(self.device, non_blocking=True) if self.device is not None else out

    def _deliver(self, slot: int, idx: torch.Tensor, used: Dict[str, int]) -> Batch:
        pad = used.get("_pad")
        if pad is not None:
            self._pad_stats.add((used["_num_nodes"], used["edge_index"]), pad[1], pad[2], pad[0], pad[3])
        if not self.cuda:
            batch = self._store.make_batch(idx, self._host[slot], used)
            if self._structures:
                self._hand_structure(slot, batch, used)
            return batch
        stream = self._stream
        if self._released[slot] is not None:
            stream.wait_event(self._released[slot])
        with torch.cuda.stream(stream):
            for k, dst in self._dev[slot].items():
                if k in used:
                    n = used[k]
                    src = self._host[slot][k]
                    dim = next((c.cat_dim for c in self._store.columns if c.key == k), 0)
                    _used(dst, dim, n).copy_(_used(src, dim, n), non_blocking=True)
            ev = torch.cuda.Event()
            ev.record(stream)
        self._copied[slot] = ev
        torch.cuda.current_stream(self.device).wait_event(ev)
        return self._store.make_batch(idx, self._dev[slot], used)

    def _hand_structure(self, slot: int, batch: Batch, used: Dict[str, Any]) -> None:
        """Puts the structure of ``batch.edge_index`` in the structure cache, by identity (see
        the class docstring, ``structures``): adopted from the worker that built it into the
        slot, or built here (no workers)."""
        from ..ops import structure as S

        ei = batch.edge_index
        N = used["_num_nodes"]
        if self._sbufs is None:  # no workers: built here, fresh tensors (build_csr records them)
            try:
                S.CACHE.prepare(ei, N)
            except (IndexError, ValueError, RuntimeError):
                return  # a bad edge_index: the model's own lookup raises as usual
            self._handed[slot] = (weakref.ref(ei), None)
            return
        st = used.get("_struct")
        if st is None:
            return
        N, E, lo, hi, fp = st
        sb = self._sbufs[slot]
        # views of the slot's buffers (cheaper than _used's tensors; the structure tensors are
        # outputs of the structure ops, never a compiled graph's inputs, so no guard sees a base)
        ts = [sb[k][:N + 1] if k.startswith("rowptr") else sb[k][:E] for k in _STRUCT_KEYS]
        adopt = S.ops.adopt_worker_structure
        adopt(ts[0], ts[1], ts[2], N)  # built by build_csr in our worker: recorded, not validated
        adopt(ts[3], ts[4], ts[5], N)
        S.CACHE.adopt(ei, S.Structure(ts[0], ts[1], ts[2], N, lo, hi, csc={N: tuple(ts[3:])}), fp)
        self._handed[slot] = (weakref.ref(ei), ts)

    def _unhand(self, slot: int) -> None:
        """The slot is about to be filled again: its batch's prepared entry leaves the cache,
        and the structure tensors on the slot's memory get a new version (the native record,
        and autograd, then know them as changed)."""
        h = self._handed[slot]
        if h is None:
            return
        self._handed[slot] = None
        from ..ops import structure as S

        ref, ts = h
        ei = ref()
        if ei is not None:
            S.CACHE.discard(ei)
        for t in ts or ():
            _increment_version(t)

    def _unhand_all(self) -> None:
        for slot in range(len(getattr(self, "_handed", ()))):
            self._unhand(slot)

    def _release(self, slot: int) -> None:
        if self._structures:
            self._unhand(slot)
        if self.cuda:
            ev = torch.cuda.Event()
            ev.record(torch.cuda.current_stream(self.device))
            self._released[slot] = ev
            if self._copied[slot] is not None:
                self._copied[slot].synchronize()  # the host buffer may be refilled now

    def _iter_inline(self, batches, pads=None):
        self._unhand_all()  # the slots of an earlier pass are filled again
        for i, b in enumerate(batches):
            slot = i % self.pool_size
            if i >= self.pool_size:
                self._release(slot)
            idx = torch.tensor(b, dtype=torch.long)
            used = self._store.collate_into(idx, self._host[slot], pads[i] if pads is not None else None)
            yield self._deliver(slot, idx, used)

    def _result(self, tag: int) -> tuple:
        """The next result of pass ``tag`` from the workers: (batch no, slot, used, error)."""
        deadline = time.monotonic() + self.timeout
        while True:
            try:
                t, *rest = self._results.get(timeout=min(1.0, max(0.01, deadline - time.monotonic())))
            except _queue.Empty:
                if not all(p.is_alive() for p in self._workers):
                    raise RuntimeError("PooledLoader: a worker process died") from None
                if time.monotonic() >= deadline:
                    raise RuntimeError(f"PooledLoader: no batch from the workers in {self.timeout:g} s "
                                       "(timeout)") from None
                continue
            if t == tag:
                return tuple(rest)
            # else a stale result from an abandoned pass

    def _iter_workers(self, batches, pads=None):
        if not self._workers or not all(p.is_alive() for p in self._workers):
            if self._workers:
                self._stop_workers()
            self._start_workers()
        self._unhand_all()  # the slots of an earlier pass are filled again
        self._tag += 1
        tag = self._tag
        n = len(batches)
        sent = 0
        received = 0
        ready: Dict[int, tuple] = {}
        interrupted = False
        try:
            while sent < min(n, self.pool_size):
                self._jobs.put((tag, sent, sent % self.pool_size, batches[sent],
                                pads[sent] if pads is not None else None))
                sent += 1
            for i in range(n):
                while i not in ready:
                    bno, slot, used, err = self._result(tag)
                    received += 1
                    if err is not None:
                        raise RuntimeError(f"PooledLoader: a worker failed:\n{err}")
                    ready[bno] = (slot, used)
                slot, used = ready.pop(i)
                yield self._deliver(slot, torch.tensor(batches[i], dtype=torch.long), used)
                # the caller asked for the next batch: slot is free again
                self._release(slot)
                if sent < n:
                    self._jobs.put((tag, sent, slot, batches[sent], pads[sent] if pads is not None else None))
                    sent += 1
        except KeyboardInterrupt:
            # A Ctrl-C may land between a result leaving the queue and its count (or mid-read of
            # the queue's pipe): the count of jobs still out is no longer sure, and draining could
            # wait out the timeout for a result already taken. Stop the workers instead; the
            # next pass starts fresh ones on fresh queues.
            interrupted = True
            raise
        finally:
            if not self.persistent_workers or interrupted:
                self._stop_workers()
            else:
                # an abandoned pass: wait for the jobs still out, so that none of them writes
                # into a slot that the next pass hands out again
                while received < sent and self._workers:
                    try:
                        self._result(tag)
                        received += 1
                    except RuntimeError:  # a worker died or timed out: start afresh next time
                        self._stop_workers()
                    except KeyboardInterrupt:  # stop them rather than wait: no job writes later
                        self._stop_workers()
                        raise


def _host_register(t: torch.Tensor) -> None:
    """Page-locks a shared-memory tensor in place (CUDA only; best effort)."""
    try:
        if t.numel():
            torch.cuda.cudart().cudaHostRegister(t.data_ptr(), t.numel() * t.element_size(), 0)
    except Exception as e:  # pragma: no cover - needs CUDA
        warnings.warn(f"PooledLoader: could not pin a shared buffer ({e}); copies will not overlap")
