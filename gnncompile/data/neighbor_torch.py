"""A vectorized pure-PyTorch neighbor sampler: the peer the native ``neighbor_sample`` op is
measured against (benchmarks/sampler.py) and a second implementation to test it with.

Same semantics as ``gnncompile::neighbor_sample`` with ``directed=True,
disjoint=False`` (homogeneous graph in CSC form, as ``gnncompile::build_csr(dst, src, N, N)``
returns it): ``node`` starts with the seeds; hop ``h`` samples, for each node added in the
previous hop (hop 0: the seeds), ``num_neighbors[h]`` of its in-edges (``-1``: all; without
replacement and in-degree <= fanout: all of them; with replacement: that many draws) and
appends the sources not yet in ``node`` in order of first appearance.

Design (no Python loop over nodes or edges; per hop a fixed number of tensor ops):

* Degrees and CSC start of the frontier from ``colptr``; the number of edges each frontier
  node yields (``min(deg, k)``, ``k`` or ``deg``) gives, by an exclusive cumsum, the slot of
  every output edge, so the three cases below fill one output tensor by scatter, already
  grouped by frontier node in frontier order (no sort of the output).
* ``deg <= k`` (or ``k = -1``): every in-edge, expanded with ``repeat_interleave``.
* ``k < deg <= 4k``: a ``[nodes, max deg]`` matrix of random float64 keys (padding past a
  node's degree set above every key); ``topk(k, largest=False)`` per row picks a uniform
  k-subset of the in-edges.
* ``deg > 4k`` (hubs, up to ~10^5 in-edges on the benchmark graph): expanding every in-edge
  would cost O(deg), so ``2k`` random offsets are drawn per node into a ``[nodes, 2k]`` matrix,
  duplicates are found by sorting each row, and the first ``k`` distinct offsets in draw
  order are kept (a uniform k-subset by symmetry); the rare row with fewer than ``k``
  distinct offsets is drawn again with twice as many.
* With replacement: ``k`` uniform offsets per node of positive degree.
* New nodes, without sorting: the first edge position of each source by
  ``scatter_reduce(amin)`` into an N-sized scratch array (only the touched entries are
  initialised), so the edges that are their source's first appearance give the distinct
  sources in order of first appearance; membership in ``node`` through an N-sized map used as
  a sparse set (``map[v]`` is trusted only if ``node[map[v]] == v``, so the map is never
  initialised). Both arrays are kept per thread between calls (:func:`_workspace`).
"""
from __future__ import annotations

import threading
from typing import List, Optional, Sequence, Tuple

import torch

_KEY_FACTOR = 4  # k < deg <= _KEY_FACTOR * k: random keys over all in-edges; above: draws


def _excl_cumsum(t: torch.Tensor) -> torch.Tensor:
    return torch.cumsum(t, 0) - t


def _take(t: torch.Tensor, i: torch.Tensor) -> torch.Tensor:
    return t.index_select(0, i)  # several times faster than t[i] on CPU for 1-D gathers


def _expand(counts: torch.Tensor) -> Tuple[torch.Tensor, torch.Tensor]:
    """For segments of sizes ``counts``: the segment of every element and its rank in it."""
    seg = torch.repeat_interleave(counts)
    rank = torch.arange(seg.numel()) - _take(_excl_cumsum(counts), seg)
    return seg, rank


def _keyed_subset(deg: torch.Tensor, k: int, gen) -> Tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """A uniform k-subset of ``range(deg[i])`` for each i (all deg > k), by random keys.
    Returns (segment, offset, rank) of the kept elements."""
    n, width = deg.numel(), int(deg.max())
    keys = torch.rand(n, width, generator=gen, dtype=torch.float64)
    keys.masked_fill_(torch.arange(width) >= deg[:, None], 2.0)  # padding: never among the k lowest
    off = torch.topk(keys, k, dim=1, largest=False, sorted=False).indices
    return _rows(n, k), off.reshape(-1), torch.arange(k).repeat(n)


def _rows(n: int, k: int) -> torch.Tensor:
    return torch.arange(n).repeat_interleave(k)


def _drawn_subset(deg: torch.Tensor, k: int, gen) -> Tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """A uniform k-subset of ``range(deg[i])`` for each i (all deg > k): the first k distinct
    offsets of a sequence of uniform draws. Returns (segment, offset, rank) of the kept elements."""
    n = deg.numel()
    offs = torch.empty(n, k, dtype=torch.int64)
    todo = torch.arange(n)
    m = 2 * k
    while todo.numel():
        draws = (torch.rand(todo.numel(), m, generator=gen, dtype=torch.float64)
                 * deg[todo, None]).to(torch.int64)
        vals, order = torch.sort(draws, dim=1, stable=True)
        first = torch.ones_like(vals, dtype=torch.bool)
        first[:, 1:] = vals[:, 1:] != vals[:, :-1]
        is_first = torch.empty_like(first).scatter_(1, order, first)
        cum = torch.cumsum(is_first, 1)
        ok = cum[:, -1] >= k
        sel = is_first & (cum <= k) & ok[:, None]
        offs[todo[ok]] = draws[sel].view(-1, k)
        todo, m = todo[~ok], 2 * m
    return _rows(n, k), offs.view(-1), torch.arange(k).repeat(n)


def _sample_hop(colptr, frontier: torch.Tensor, k: int, replace: bool, gen
                ) -> Tuple[torch.Tensor, torch.Tensor]:
    """Sampled in-edges of the frontier nodes (global ids): (CSC position, frontier index),
    grouped by frontier node in frontier order."""
    start = _take(colptr, frontier)
    deg = _take(colptr, frontier + 1) - start
    if k < 0:
        seg, rank = _expand(deg)
        return _take(start, seg) + rank, seg
    if k == 0:
        empty = torch.empty(0, dtype=torch.int64)
        return empty, empty
    if replace:
        cnt = torch.where(deg > 0, k, 0)
        seg, _ = _expand(cnt)
        off = (torch.rand(seg.numel(), generator=gen, dtype=torch.float64) * _take(deg, seg)).to(torch.int64)
        return _take(start, seg) + off, seg
    cnt = deg.clamp(max=k)
    out_start = _excl_cumsum(cnt)
    pos = torch.empty(int(cnt.sum()), dtype=torch.int64)
    seg = torch.repeat_interleave(cnt)
    small = deg <= k
    s_seg, s_rank = _expand(torch.where(small, deg, 0))
    pos.index_copy_(0, _take(out_start, s_seg) + s_rank, _take(start, s_seg) + s_rank)
    for mask, pick in ((~small & (deg <= _KEY_FACTOR * k), _keyed_subset),
                       (deg > _KEY_FACTOR * k, _drawn_subset)):
        idx = mask.nonzero().view(-1)
        if idx.numel():
            sub, off, rank = pick(_take(deg, idx), k, gen)
            g = _take(idx, sub)
            pos.index_copy_(0, _take(out_start, g) + rank, _take(start, g) + off)
    return pos, seg


_local = threading.local()


def _workspace(N: int) -> Tuple[torch.Tensor, torch.Tensor]:
    """Two N-sized int64 scratch arrays, kept per thread for the last N: ``where`` (a sparse
    set: ``where[v]`` is valid iff ``node[where[v]] == v``) and ``first`` (initialised per hop at
    the entries used). Neither needs clearing, so reusing them saves the page faults of fresh
    allocations (8 MB each at N = 1M)."""
    ws = getattr(_local, "ws", None)
    if ws is None or ws[0].numel() != N:
        ws = _local.ws = (torch.empty(N, dtype=torch.int64), torch.empty(N, dtype=torch.int64))
    return ws


def _check(colptr, row, seeds, num_neighbors) -> List[int]:
    for name, t in (("colptr", colptr), ("row", row), ("seeds", seeds)):
        if not isinstance(t, torch.Tensor) or t.dim() != 1 or t.dtype != torch.int64:
            raise ValueError(f"sample_neighbors_torch: {name} must be a 1-D int64 tensor")
    if colptr.numel() == 0 or int(colptr[-1]) != row.numel():
        raise ValueError("sample_neighbors_torch: colptr must have N + 1 entries ending at row.numel()")
    N = colptr.numel() - 1
    if N == 0 and seeds.numel():
        raise ValueError("sample_neighbors_torch: seeds given for a graph with no nodes")
    if seeds.numel() and (int(seeds.min()) < 0 or int(seeds.max()) >= N):
        raise IndexError(f"sample_neighbors_torch: seed out of range [0, {N})")
    if seeds.unique().numel() != seeds.numel():
        raise ValueError("sample_neighbors_torch: seeds must be distinct")
    ks = [int(k) for k in num_neighbors]
    if any(k < -1 for k in ks):
        raise ValueError(f"sample_neighbors_torch: num_neighbors must be >= 0 or -1, got {ks}")
    return ks


def sample_neighbors_torch(colptr: torch.Tensor, row: torch.Tensor, seeds: torch.Tensor,
                           num_neighbors: Sequence[int], replace: bool = False,
                           generator: Optional[torch.Generator] = None):
    """Samples a multi-hop neighborhood of ``seeds`` (see the module docstring).

    Returns ``(node, row, col, edge, num_sampled_nodes, num_sampled_edges)``: ``node`` the
    global ids (seeds first), ``row`` / ``col`` the local index of each sampled edge's source /
    destination, ``edge`` its CSC position, and the per-hop counts as int64 tensors.
    """
    ks = _check(colptr, row, seeds, num_neighbors)
    N = colptr.numel() - 1
    where, first = _workspace(N)
    where.index_copy_(0, seeds, torch.arange(seeds.numel()))
    nodes, rows, cols, edges = [seeds], [], [], []
    n_nodes, n_edges = [seeds.numel()], []
    frontier, f_first, total = seeds, 0, seeds.numel()
    for k in ks:
        pos, seg = _sample_hop(colptr, frontier, k, replace, generator)
        src = _take(row, pos)
        arange_e = torch.arange(src.numel())
        first.index_fill_(0, src, src.numel()).scatter_reduce_(0, src, arange_e, "amin")
        cand = src.masked_select(_take(first, src) == arange_e)  # distinct, in first-appearance order
        all_nodes = torch.cat(nodes) if len(nodes) > 1 else nodes[0]
        known = _take(all_nodes, _take(where, cand).clamp_(0, max(total - 1, 0))) == cand
        new = cand.masked_select(~known)
        where.index_copy_(0, new, torch.arange(total, total + new.numel()))
        rows.append(_take(where, src))
        cols.append(seg + f_first)
        edges.append(pos)
        nodes.append(new)
        n_nodes.append(new.numel())
        n_edges.append(pos.numel())
        frontier, f_first, total = new, total, total + new.numel()
    empty = torch.empty(0, dtype=torch.int64)
    return (torch.cat(nodes), torch.cat(rows) if rows else empty, torch.cat(cols) if cols else empty,
            torch.cat(edges) if edges else empty, torch.tensor(n_nodes, dtype=torch.int64),
            torch.tensor(n_edges, dtype=torch.int64))
