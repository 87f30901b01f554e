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
* **Pool of buffers.** ``pool_size`` slots of pre-allocated buffers (sized for the largest
  possible batch) are reused; nothing is allocated per batch. Up to ``pool_size`` batches are
  in flight: one held by the training loop, the others being filled.
* **Workers.** With ``num_workers > 0`` that many forked processes fill slots (in shared
  memory) ahead of the training loop; ``persistent_workers`` keeps them across epochs.
* **CUDA target** (``device='cuda'``): slots are pinned when ``pin_memory`` (registered with
  ``cudaHostRegister`` when shared with workers), each slot has device buffers too, and the
  host-to-device copy runs on a side stream; the consumer's stream waits on an event, so the
  copy of batch i+1 overlaps the compute of batch i. (This path is not exercised by the
  CPU-only test suite.)

A yielded batch is a view of a slot: it stays valid until the next batch is requested (the
usual training loop). ``batch.clone()`` keeps one longer.

Datasets the columnar store does not cover (heterogeneous graphs, non-tensor attributes,
a dataset with a ``transform``, which must run per access) are collated by PyG's own
``Batch.from_data_list`` (same batches, no pooling).
"""
from __future__ import annotations

import math
import queue as _queue
import traceback
import warnings
from typing import Any, Dict, Iterator, List, Optional, Sequence

import torch

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


def _top_sum(sizes: torch.Tensor, k: int) -> int:
    if sizes.numel() == 0:
        return 0
    k = min(k, sizes.numel())
    return int(torch.topk(sizes, k).values.sum())


class _Store:
    """The dataset, column by column; collates a batch of graph ids into given buffers."""

    def __init__(self, dataset, follow_batch, exclude_keys):
        n = len(dataset)
        first = dataset[0]
        self.data_cls = type(first)
        self.keys = [k for k in first.keys() if k not in exclude_keys and k not in ("ptr",)]
        self.follow_batch = list(follow_batch)
        parts: Dict[str, list] = {k: [] for k in self.keys}
        sizes: Dict[str, list] = {k: [] for k in self.keys}
        incs: Dict[str, list] = {k: [] for k in self.keys}
        cat_dims: Dict[str, Any] = {}
        num_nodes = []
        for i in range(n):
            d = dataset[i]
            if type(d) is not self.data_cls or sorted(d.keys()) != sorted(first.keys()):
                raise _Unsupported("graphs differ in type or attributes")
            num_nodes.append(int(d.num_nodes))
            for k in self.keys:
                v = d[k]
                if k == "num_nodes":
                    continue
                if isinstance(v, (int, float)) and not isinstance(v, bool):
                    v = torch.tensor([v])
                    cd = 0
                elif isinstance(v, torch.Tensor):
                    cd = d.__cat_dim__(k, v)
                    if cd is None:  # stacked attribute
                        v = v.unsqueeze(0)
                        cd = 0
                    elif v.dim() == 0:
                        v = v.view(1)
                        cd = 0
                    elif cd < 0:
                        cd = v.dim() + cd
                    inc = d.__inc__(k, d[k])
                    if isinstance(inc, torch.Tensor):
                        if inc.numel() != 1:
                            raise _Unsupported(f"non-scalar increment for {k!r}")
                        inc = inc.item()
                    incs[k].append(int(inc) if inc else 0)
                else:
                    raise _Unsupported(f"attribute {k!r} of type {type(v).__name__}")
                if not isinstance(d[k], torch.Tensor):
                    incs[k].append(0)
                if k in cat_dims and cat_dims[k] != cd:
                    raise _Unsupported(f"cat dim of {k!r} varies")
                cat_dims[k] = cd
                parts[k].append(v)
                sizes[k].append(v.size(cd))
        self.num_nodes = torch.tensor(num_nodes, dtype=torch.long)
        self.has_num_nodes_attr = "num_nodes" in self.keys
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

    def set_capacity(self, batch_size: int) -> None:
        for c in self.columns:
            c.capacity = _top_sum(c.sizes, batch_size)
        self.node_capacity = _top_sum(self.num_nodes, batch_size)
        self.batch_size = batch_size

    def allocate(self, pin: bool = False, device=None) -> Dict[str, torch.Tensor]:
        """The buffers of one slot (largest possible batch)."""
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
        return bufs

    def collate_into(self, idx: torch.Tensor, bufs: Dict[str, torch.Tensor]) -> Dict[str, int]:
        """Writes the batch of graphs ``idx`` into ``bufs``; returns the used length per buffer.

        Attributes concatenated along dim 0 (x, y, ...), and the rows of a [k, E] attribute
        (edge_index), are whole-graph copies: one ``gnncompile::collate_rows`` call each (a
        memcpy per graph in the native kernel, with the node offsets added to edge_index).
        Other layouts take vectorised torch ops."""
        from ..ops import collate_rows, segment_ids

        B = idx.numel()
        used: Dict[str, int] = {}
        for c in self.columns:
            sizes = c.sizes[idx]
            total = int(sizes.sum())
            buf = bufs[c.key]
            incs = c.incs if c.has_inc else None
            native = c.values.is_contiguous() and (incs is None or c.values.dtype in _ADDABLE)
            if native and c.cat_dim == 0:
                collate_rows(c.values, c.starts, c.sizes, idx, buf, incs)
            elif native and c.cat_dim == 1 and c.values.dim() == 2 and c.values.size(0) <= 8:
                for r in range(c.values.size(0)):  # e.g. edge_index: one contiguous row at a time
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

    @staticmethod
    def _collate_torch(c: "_Column", idx: torch.Tensor, sizes: torch.Tensor, total: int,
                       buf: torch.Tensor) -> None:
        out = buf.narrow(c.cat_dim, 0, total)
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
        out = Batch(_base_cls=self.data_cls)
        B = idx.numel()
        slice_dict, inc_dict = {}, {}
        for c in self.columns:
            v = bufs[c.key].narrow(c.cat_dim, 0, used[c.key])
            setattr(out, c.key, v)
            sizes = c.sizes[idx]
            slice_dict[c.key] = torch.cat([sizes.new_zeros(1), torch.cumsum(sizes, 0)])
            inc_dict[c.key] = _exclusive_cumsum(c.incs[idx]) if c.has_inc else torch.zeros(B, dtype=torch.long)
            if c.key in self.follow_batch:
                setattr(out, c.key + "_batch", bufs[c.key + "_batch"][:used[c.key + "_batch"]])
                setattr(out, c.key + "_ptr", bufs[c.key + "_ptr"][:B + 1])
        if self.has_num_nodes_attr:
            out._num_nodes = self.num_nodes[idx].tolist()
            out.num_nodes = used["_num_nodes"]
        out.batch = bufs["batch"][:used["batch"]]
        out.ptr = bufs["ptr"][:B + 1]
        out._num_graphs = B
        out._slice_dict = slice_dict
        out._inc_dict = inc_dict
        return out


class _Unsupported(Exception):
    pass


# The last store built, reused by the next loader over the same (unchanged-length) dataset
# object with the same keys: a tuner builds many loaders over one dataset.
_LAST_STORE: list = []


def _cached_store(dataset, follow_batch, exclude_keys) -> _Store:
    import weakref

    key = (len(dataset), tuple(follow_batch), tuple(exclude_keys))
    if _LAST_STORE:
        ref, k, store = _LAST_STORE[0]
        if ref() is dataset and k == key:
            return store
    store = _Store(dataset, follow_batch, exclude_keys)
    try:
        _LAST_STORE[:] = [(weakref.ref(dataset), key, store)]
    except TypeError:  # not weak-referenceable (e.g. a plain list): no caching
        _LAST_STORE[:] = []
    return store


def _worker_loop(store: _Store, slots, jobs, results) -> None:
    torch.set_num_threads(1)
    while True:
        job = jobs.get()
        if job is None:
            return
        tag, batch_no, slot, idx = job
        try:
            used = store.collate_into(torch.tensor(idx, dtype=torch.long), slots[slot])
            results.put((tag, batch_no, slot, used, None))
        except Exception:  # reported to the main process
            results.put((tag, batch_no, slot, None, traceback.format_exc()))


class PooledLoader:
    """Mini-batches of graphs with ``torch_geometric.loader.DataLoader`` semantics.

    Args:
        dataset: a sequence of ``Data`` objects (list, ``InMemoryDataset``, ``Dataset``).
        batch_size, shuffle, drop_last, generator, follow_batch, exclude_keys: as in PyG's
            ``DataLoader``.
        pool_size: slots of reusable buffers (>= 1); up to that many batches are in flight.
        num_workers: processes that fill slots ahead of the training loop (0: the caller's
            process collates on demand).
        pin_memory: page-locked host buffers (only with a CUDA ``device``).
        persistent_workers: keep the workers across epochs.
        device: where batches are delivered; a CUDA device turns on the side-stream copy.
        timeout: seconds to wait for a worker before raising.
    """

    def __init__(self, dataset: Sequence, batch_size: int = 1, shuffle: bool = False, *,
                 drop_last: bool = False, generator: Optional[torch.Generator] = None,
                 follow_batch: Optional[List[str]] = None, exclude_keys: Optional[List[str]] = None,
                 pool_size: int = 2, num_workers: int = 0, pin_memory: bool = False,
                 persistent_workers: bool = False, device=None, timeout: float = 120.0) -> None:
        if batch_size < 1:
            raise ValueError(f"PooledLoader: batch_size must be >= 1, got {batch_size}")
        if pool_size < 1:
            raise ValueError(f"PooledLoader: pool_size must be >= 1, got {pool_size}")
        if num_workers < 0:
            raise ValueError(f"PooledLoader: num_workers must be >= 0, got {num_workers}")
        self.dataset = dataset
        self.batch_size = int(batch_size)
        self.shuffle = bool(shuffle)
        self.drop_last = bool(drop_last)
        self.generator = generator
        self.follow_batch = list(follow_batch or [])
        self.exclude_keys = list(exclude_keys or [])
        self.pool_size = int(pool_size)
        self.num_workers = int(num_workers)
        self.device = torch.device(device) if device is not None else None
        self.cuda = self.device is not None and self.device.type == "cuda"
        self.pin_memory = bool(pin_memory) and self.cuda
        self.persistent_workers = bool(persistent_workers) and self.num_workers > 0
        self.timeout = timeout
        self._workers: list = []
        self._store: Optional[_Store] = None
        if len(dataset) > 0 and getattr(dataset, "transform", None) is None:
            try:
                self._store = _cached_store(dataset, self.follow_batch, self.exclude_keys)
            except _Unsupported as e:
                warnings.warn(f"PooledLoader: {e}; collating with Batch.from_data_list (no pooling)")
        if self._store is not None:
            self._store.set_capacity(self.batch_size)
            shared = self.num_workers > 0
            self._host = []
            for _ in range(self.pool_size):
                bufs = self._store.allocate(pin=self.pin_memory and not shared)
                if shared:
                    for t in bufs.values():
                        t.share_memory_()
                        if self.pin_memory:
                            _host_register(t)
                self._host.append(bufs)
            if self.cuda:
                self._dev = [self._store.allocate(device=self.device) for _ in range(self.pool_size)]
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

        ctx = mp.get_context("fork")
        self._jobs = ctx.Queue()
        self._results = ctx.Queue()
        self._workers = []
        for _ in range(self.num_workers):
            p = ctx.Process(target=_worker_loop, args=(self._store, self._host, self._jobs, self._results),
                            daemon=True)
            p.start()
            self._workers.append(p)
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

    def close(self) -> None:
        """Stops the workers (also done at garbage collection)."""
        if self._workers:
            self._stop_workers()

    def __del__(self):
        try:
            self.close()
        except Exception:
            pass

    # ------------------------------------------------------------------ iteration
    def __iter__(self) -> Iterator[Batch]:
        batches = self._epoch_batches()
        if self._store is None:
            return self._iter_fallback(batches)
        if self.num_workers == 0:
            return self._iter_inline(batches)
        return self._iter_workers(batches)

    def _iter_fallback(self, batches):
        for b in batches:
            out = Batch.from_data_list([self.dataset[i] for i in b], follow_batch=self.follow_batch,
                                       exclude_keys=self.exclude_keys)
            yield out.to(self.device, non_blocking=True) if self.device is not None else out

    def _deliver(self, slot: int, idx: torch.Tensor, used: Dict[str, int]) -> Batch:
        if not self.cuda:
            return self._store.make_batch(idx, self._host[slot], used)
        stream = self._stream
        if self._released[slot] is not None:
            stream.wait_event(self._released[slot])
        with torch.cuda.stream(stream):
            for k, dst in self._dev[slot].items():
                if k in used:
                    n = used[k]
                    src = self._host[slot][k]
                    dim = next((c.cat_dim for c in self._store.columns if c.key == k), 0)
                    dst.narrow(dim, 0, n).copy_(src.narrow(dim, 0, n), non_blocking=True)
            ev = torch.cuda.Event()
            ev.record(stream)
        self._copied[slot] = ev
        torch.cuda.current_stream(self.device).wait_event(ev)
        return self._store.make_batch(idx, self._dev[slot], used)

    def _release(self, slot: int) -> None:
        if self.cuda:
            ev = torch.cuda.Event()
            ev.record(torch.cuda.current_stream(self.device))
            self._released[slot] = ev
            if self._copied[slot] is not None:
                self._copied[slot].synchronize()  # the host buffer may be refilled now

    def _iter_inline(self, batches):
        for i, b in enumerate(batches):
            slot = i % self.pool_size
            if i >= self.pool_size:
                self._release(slot)
            idx = torch.tensor(b, dtype=torch.long)
            used = self._store.collate_into(idx, self._host[slot])
            yield self._deliver(slot, idx, used)

    def _iter_workers(self, batches):
        if not self._workers or not all(p.is_alive() for p in self._workers):
            if self._workers:
                self._stop_workers()
            self._start_workers()
        self._tag += 1
        tag = self._tag
        n = len(batches)
        sent = 0
        received = 0
        ready: Dict[int, tuple] = {}
        try:
            while sent < min(n, self.pool_size):
                self._jobs.put((tag, sent, sent % self.pool_size, batches[sent]))
                sent += 1
            for i in range(n):
                while i not in ready:
                    try:
                        t, bno, slot, used, err = self._results.get(timeout=1.0)
                    except _queue.Empty:
                        if not all(p.is_alive() for p in self._workers):
                            raise RuntimeError("PooledLoader: a worker process died") from None
                        continue
                    if t != tag:
                        continue  # a stale result from an abandoned epoch
                    received += 1
                    if err is not None:
                        raise RuntimeError(f"PooledLoader: a worker failed:\n{err}")
                    ready[bno] = (slot, used)
                slot, used = ready.pop(i)
                yield self._deliver(slot, torch.tensor(batches[i], dtype=torch.long), used)
                # the caller asked for the next batch: slot is free again
                self._release(slot)
                if sent < n:
                    self._jobs.put((tag, sent, slot, batches[sent]))
                    sent += 1
        finally:
            if not self.persistent_workers:
                self._stop_workers()
            else:
                # an abandoned epoch: wait for the jobs still out, so that none of them writes
                # into a slot that the next epoch hands out again
                while received < sent and self._workers and all(p.is_alive() for p in self._workers):
                    try:
                        t, *_ = self._results.get(timeout=self.timeout)
                    except _queue.Empty:
                        self._stop_workers()
                        break
                    if t == tag:
                        received += 1


def _host_register(t: torch.Tensor) -> None:
    """Page-locks a shared-memory tensor in place (CUDA only; best effort)."""
    try:
        if t.numel():
            torch.cuda.cudart().cudaHostRegister(t.data_ptr(), t.numel() * t.element_size(), 0)
    except Exception as e:  # pragma: no cover - needs CUDA
        warnings.warn(f"PooledLoader: could not pin a shared buffer ({e}); copies will not overlap")
