"""Batches of any loader with their graph structure prepared ahead, in a background thread.

``prefetch_structures(loader, depth=2)`` takes each batch from ``loader`` (e.g. PyG's
``DataLoader``) ``depth - 1`` batches before the training loop asks for it, and has a
background thread build its CSR (by destination, ``batch.num_nodes`` of them) and CSC into the
structure cache (:func:`gnncompile.ops.structure.prepare_structure`) meanwhile, so that a
compiled model's structure ops find them by identity: no build and no validation in the
training step. The batches are yielded unchanged, in order; an exception of the loader is
raised at the batch where it happened, after the batches before it.

The loader itself is iterated in the caller's thread, as without the wrapper: only the
structure build runs in the thread.

**Measured: it does not pay on the CPU** (benchmarks/results/loader_structures.md; 2-core Zen 4,
batches of 128 molecules, a compiled GIN step of ~8 ms): the thread's work is short Python
stretches between native calls, and each time it takes the GIL back from a training step that
is itself Python-heavy at this size, one of the two waits for the interpreter's switch
interval (5 ms): the step took ~5 ms longer per batch (epochs ~50% longer), for a build of
~0.15 ms. The same thread doing nothing costs nothing, and the same preparation in the caller's
thread costs what the build costs. It is meant for steps that leave the GIL free most of the
time (a step waiting on a device, or large graphs, whose kernels run long outside the GIL);
where the step holds the GIL, ``PooledLoader(structures=True)`` (workers: other processes) is
the way to take the build off the step.

Only for loaders whose batches are fresh tensors (PyG's ``DataLoader``, ``Batch`` lists): a
:class:`gnncompile.data.PooledLoader` hands out batches that live in a reused slot, which
taking batches ahead would overwrite; it prepares structures itself (``structures``), and is
refused here.
"""
from __future__ import annotations

import collections
from concurrent.futures import ThreadPoolExecutor
from typing import Iterable, Iterator

import torch


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
    docstring); ``depth`` (>= 1) batches at most are taken from ``loader`` ahead of the one
    yielded (1: none ahead, the structure is built in the thread while the caller waits)."""
    from .loader import PooledLoader

    if isinstance(loader, PooledLoader):
        raise ValueError("prefetch_structures: a PooledLoader's batches live in reused slots; use "
                         "PooledLoader(..., structures=True) instead")
    if isinstance(depth, bool) or not isinstance(depth, int) or depth < 1:
        raise ValueError(f"prefetch_structures: depth must be an integer >= 1, got {depth!r}")
    return _prefetch(loader, depth)


def _prefetch(loader: Iterable, depth: int) -> Iterator:
    it = iter(loader)
    pending: "collections.deque" = collections.deque()
    failure = None
    pool = ThreadPoolExecutor(1, thread_name_prefix="gnncompile-structures")
    try:
        while True:
            while failure is None and len(pending) < depth:
                try:
                    b = next(it)
                except StopIteration:
                    break
                except Exception as e:  # raised after the batches before it
                    failure = e
                    break
                pending.append((b, pool.submit(_prepare, b)))
            if not pending:
                if failure is not None:
                    raise failure
                return
            b, done = pending.popleft()
            done.result()
            yield b
    finally:
        pool.shutdown(wait=True)


__all__ = ["prefetch_structures"]
