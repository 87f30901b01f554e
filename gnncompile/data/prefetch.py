"""Batches of any loader with their graph structure prepared ahead, in a background thread.

``prefetch_structures(loader, depth=2)`` iterates ``loader`` (e.g. PyG's ``DataLoader``) in a
thread of its own, up to ``depth`` batches ahead of the training loop, and builds each batch's
CSR (by destination, ``batch.num_nodes`` of them) and CSC into the structure cache
(:func:`gnncompile.ops.structure.prepare_structure`), so that a compiled model's structure ops
find them by identity: no build and no validation in the training step. The batches are yielded
unchanged, in order. Loader exceptions are raised in the consumer, at the batch where they
happened.

Only for loaders whose batches are fresh tensors (PyG's ``DataLoader``, ``Batch`` lists): a
:class:`gnncompile.data.PooledLoader` hands out batches that live in a reused slot, which a
thread running ahead would overwrite; it prepares structures itself (``structures=True``), and
is refused here.

Where it helps: the thread overlaps the collation and the structure build of the next batches
with the current step where the machine has a core to spare; on a machine whose cores the step
already keeps busy, it moves that work off the step's timeline without making it free.
"""
from __future__ import annotations

import queue
import threading
from typing import Iterable, Iterator

import torch

_DONE = object()


class _Failure:
    def __init__(self, exc: BaseException) -> None:
        self.exc = exc


def _prepare(batch) -> None:
    from ..ops.structure import prepare_structure

    ei = getattr(batch, "edge_index", None)
    if not isinstance(ei, torch.Tensor) or ei.dim() != 2 or ei.size(0) != 2 or ei.dtype not in (torch.int64, torch.int32):
        return
    n = getattr(batch, "num_nodes", None)
    if n is None:
        return
    try:
        prepare_structure(ei, int(n))
    except (IndexError, ValueError, RuntimeError):
        pass  # a bad edge_index: the model's own lookup raises as usual


def prefetch_structures(loader: Iterable, depth: int = 2) -> Iterator:
    """Yields the batches of ``loader`` with their structures prepared (see the module
    docstring); ``depth`` (>= 1) batches at most are prepared ahead. Closing the generator (or
    dropping it) stops the thread after the batch it is on."""
    from .loader import PooledLoader

    if isinstance(loader, PooledLoader):
        raise ValueError("prefetch_structures: a PooledLoader's batches live in reused slots; use "
                         "PooledLoader(..., structures=True) instead")
    if isinstance(depth, bool) or not isinstance(depth, int) or depth < 1:
        raise ValueError(f"prefetch_structures: depth must be an integer >= 1, got {depth!r}")
    q: "queue.Queue" = queue.Queue(maxsize=depth)
    stop = threading.Event()

    def put(item) -> bool:
        while not stop.is_set():
            try:
                q.put(item, timeout=0.1)
                return True
            except queue.Full:
                continue
        return False

    def run() -> None:
        try:
            for batch in loader:
                _prepare(batch)
                if not put(batch):
                    return
        except BaseException as e:  # handed to the consumer
            put(_Failure(e))
            return
        put(_DONE)

    t = threading.Thread(target=run, name="gnncompile-prefetch-structures", daemon=True)
    t.start()
    try:
        while True:
            item = q.get()
            if item is _DONE:
                return
            if isinstance(item, _Failure):
                raise item.exc
            yield item
    finally:
        stop.set()
        t.join(timeout=5)


__all__ = ["prefetch_structures"]
