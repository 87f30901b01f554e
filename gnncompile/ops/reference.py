"""Pure-torch reference implementations of every gnncompile op.

They are the fallback when the native build is missing (registered for
CompositeExplicitAutograd, so a native CPU/CUDA kernel takes precedence when loaded) and the
oracle in tests. They favour clarity over speed and materialise E x F tensors freely.
16-bit inputs are computed in float32 and rounded once, like the kernels.
"""
from __future__ import annotations

import math
from typing import Optional, Sequence

import torch

from .checks import check_range

_REDUCES = ("sum", "mean", "max", "min")


def _acc(t: torch.Tensor) -> torch.Tensor:
    return t.float() if t.dtype in (torch.float16, torch.bfloat16) else t


def _rows(rowptr: torch.Tensor) -> torch.Tensor:
    """Destination row of every CSR slot."""
    deg = (rowptr[1:] - rowptr[:-1]).long()
    return torch.repeat_interleave(torch.arange(deg.numel(), device=rowptr.device), deg)


def check_structure(rowptr: torch.Tensor, col: torch.Tensor, perm: torch.Tensor, num_src: int,
                    op: str) -> None:
    """The checks the native kernels make before reading through a structure they were handed."""
    E = col.numel()
    M = rowptr.numel() - 1
    if rowptr.dim() != 1 or M < 0 or col.dim() != 1 or perm.dim() != 1 or perm.numel() != E:
        raise ValueError(f"{op}: rowptr, col and perm must be 1-D, col and perm of one length")
    if int(rowptr[0]) != 0 or int(rowptr[-1]) != E:
        raise ValueError(f"{op}: rowptr must start at 0 and end at the number of edges ({E})")
    if M > 0 and not bool((rowptr[1:] >= rowptr[:-1]).all()):
        raise ValueError(f"{op}: rowptr must be non-decreasing")
    if E == 0:
        return
    lo, hi = (int(v) for v in torch.aminmax(col))
    if lo < 0 or hi >= num_src:
        raise IndexError(f"{op}: source index out of range [{lo}, {hi}] for {num_src} source nodes")
    lo, hi = (int(v) for v in torch.aminmax(perm))
    if lo < 0 or hi >= E:
        raise IndexError(f"{op}: perm holds an edge id outside [0, {E})")


def check_perm_unique(perm: torch.Tensor, op: str) -> None:
    """edge_dot / edge_softmax write out[perm[j]] for every slot: perm must be a permutation."""
    E = perm.numel()
    if E and not bool((torch.bincount(perm.long(), minlength=E) == 1).all()):
        raise IndexError(f"{op}: perm must hold every edge id in [0, {E}) exactly once (a permutation); "
                         "it repeats some")


def _features(t: torch.Tensor) -> int:
    """Number of features per row (product of the trailing dims), valid for zero rows too."""
    n = 1
    for d in t.shape[1:]:
        n *= d
    return n


def spmm_self(rowptr, col, perm, x: torch.Tensor, scale: torch.Tensor, knobs: Sequence[int] = (),
              rowptr_t=None, col_t=None, perm_t=None) -> torch.Tensor:
    """spmm's sum plus each row's own term: ``spmm(x, 'sum') + scale * x`` (GINConv's
    ``propagate(x) + (1 + eps) * x``), the two ops it replaces, in their order."""
    op = "gnncompile.spmm_self"
    if x.dtype not in (torch.float32, torch.float64):
        raise ValueError(f"{op}: x must be float32 or float64, got {x.dtype}")
    if rowptr.numel() - 1 != x.size(0):
        raise ValueError(f"{op}: the structure must be square ({rowptr.numel() - 1} rows) for x's {x.size(0)} rows")
    if scale.numel() != 1:
        raise ValueError(f"{op}: scale must hold one value, got {scale.numel()}")
    return spmm(rowptr, col, perm, None, x, "sum", knobs)[0] + scale.reshape(()).to(x.dtype) * x


def build_csr(dst: torch.Tensor, src: torch.Tensor, num_dst: int, num_src: int):
    if dst.dtype == torch.int32 and max(dst.numel(), num_dst) > 2**31 - 1:
        raise ValueError("gnncompile.build_csr: graph too large for int32 indices; use int64 edge_index")
    check_range(dst, num_dst, "edge_index[1] (destination)")
    check_range(src, num_src, "edge_index[0] (source)")
    counts = torch.bincount(dst.long(), minlength=num_dst)[:num_dst]
    rowptr = torch.zeros(num_dst + 1, dtype=dst.dtype, device=dst.device)
    rowptr[1:] = torch.cumsum(counts, 0)
    perm = torch.sort(dst, stable=True).indices.to(dst.dtype)
    col = src[perm.long()]
    return rowptr, col, perm


def _weight_view(weight: torch.Tensor, x: torch.Tensor, perm: torch.Tensor) -> torch.Tensor:
    """weight in CSR order, shaped to broadcast against x[col]."""
    w = _acc(weight)[perm.long()]
    if w.dim() == 2 and w.size(1) > 1:  # per head: x is [N, H, C]
        return w.unsqueeze(-1)
    return w.reshape(w.size(0), *([1] * (x.dim() - 1)))


def spmm(rowptr, col, perm, weight: Optional[torch.Tensor], x: torch.Tensor, reduce: str,
         knobs: Sequence[int] = (), rowptr_t=None, col_t=None, perm_t=None, relu_input: bool = False):
    if reduce not in _REDUCES:
        raise ValueError(f"gnncompile.spmm: unknown reduce '{reduce}' (expected sum, mean, max or min)")
    M = rowptr.numel() - 1
    check_structure(rowptr, col, perm, x.size(0), "gnncompile.spmm")
    rows = _rows(rowptr)
    msg = _acc(x).index_select(0, col.long())
    if weight is not None:
        msg = msg * _weight_view(weight, x, perm)
    shape = (M,) + tuple(x.shape[1:])
    idx = rows.view(-1, *([1] * (x.dim() - 1))).expand_as(msg)
    arg = torch.empty(0, dtype=torch.long, device=x.device)
    if reduce in ("sum", "mean"):
        out = torch.zeros(shape, dtype=msg.dtype, device=x.device).index_add_(0, rows, msg)
        if reduce == "mean":
            deg = (rowptr[1:] - rowptr[:-1]).clamp(min=1).to(msg.dtype)
            out = out / deg.view(-1, *([1] * (x.dim() - 1)))
    else:
        op = "amax" if reduce == "max" else "amin"
        out = torch.zeros(shape, dtype=msg.dtype, device=x.device).scatter_reduce_(
            0, idx, msg, op, include_self=False)
        E, Fw = col.numel(), math.prod(shape[1:])
        arg = arg_record(msg.reshape(E, Fw), out.reshape(M, Fw), rows, rowptr, relu_input and weight is None
                         ).reshape(shape)
    return out.to(x.dtype), arg


def arg_record(m: torch.Tensor, best: torch.Tensor, rows: torch.Tensor, rowptr: torch.Tensor,
               zero_ties_free: bool = False) -> torch.Tensor:
    """The max / min record of the kernels (``arg_fold`` in native/common/macros.h) for the
    messages ``m`` [E, F] (in CSR slot order, row ``rows[j]``) and the reduced values ``best``
    [M, F]: -1 for a row without edges; the CSR slot of the extreme when exactly one message
    equals it; -N when N >= 2 messages do (a tie); ``extremes.NAN_RECORD`` for a NaN extreme.
    ``zero_ties_free`` (spmm of a relu's output): a tie at 0 is recorded as its first slot (the
    backward drops it)."""
    from .extremes import NAN_RECORD

    E, F = m.shape
    M = best.shape[0]
    at = best.index_select(0, rows)
    equal = m == at
    idx = rows.view(-1, 1).expand(E, F)
    slots = torch.arange(E, device=m.device).view(-1, 1).expand(E, F)
    first = torch.full((M, F), E, dtype=torch.long, device=m.device).scatter_reduce(
        0, idx, torch.where(equal, slots, torch.full_like(slots, E)), "amin")
    count = torch.zeros((M, F), dtype=torch.long, device=m.device).scatter_add(0, idx, equal.long())
    one = count == 1
    if zero_ties_free:
        one = one | (best == 0)
    arg = torch.where(one, first, -count)
    arg = torch.where(torch.isnan(best), torch.full_like(arg, NAN_RECORD), arg)
    has = (rowptr[1:] > rowptr[:-1]).view(-1, 1)
    return torch.where(has, arg, torch.full_like(arg, -1))


def edge_dot(rowptr, col, perm, x, g, heads: int, knobs: Sequence[int] = ()):
    E = col.numel()
    check_structure(rowptr, col, perm, x.size(0), "gnncompile.edge_dot")
    check_perm_unique(perm, "gnncompile.edge_dot")
    F = _features(x)
    if heads < 1 or F % heads:
        raise ValueError(f"gnncompile.edge_dot: heads ({heads}) must divide the feature count ({F})")
    C = F // heads
    rows = _rows(rowptr)
    xe = _acc(x).index_select(0, col.long()).reshape(E, heads, C)
    ge = _acc(g).index_select(0, rows).reshape(E, heads, C)
    out = torch.empty(E, heads, dtype=x.dtype, device=x.device)
    out[perm.long()] = (xe * ge).sum(-1).to(x.dtype)
    return out


def _check_records(arg: torch.Tensor, grad: torch.Tensor, op: str) -> None:
    if arg.shape != grad.shape or arg.dtype != torch.long:
        raise ValueError(f"{op}: arg must be int64 of grad's shape {list(grad.shape)}, got {arg.dtype} "
                         f"{list(arg.shape)}")


def arg_route(rowptr, col, perm, weight: Optional[torch.Tensor], arg, grad, num_src: int,
              knobs: Sequence[int] = (), rowptr_t=None, col_t=None, perm_t=None):
    """out[s] = the sum over the edges e = (s -> r) of source s, in CSR slot order, of grad[r] (times
    the weight of e) where arg[r] records e's CSR slot; 0 elsewhere. (The CSC is the native
    kernels' way there: the reference reads the CSR, and only checks the CSC.)"""
    op = "gnncompile.arg_route"
    _check_records(arg, grad, op)
    N, M, E = int(num_src), rowptr.numel() - 1, col.numel()
    check_structure(rowptr, col, perm, N, op)
    if (rowptr_t is None) != (col_t is None) or (col_t is None) != (perm_t is None):
        raise ValueError(f"{op}: rowptr_t, col_t and perm_t come together (the CSC) or not at all")
    if rowptr_t is not None:
        check_structure(rowptr_t, col_t, perm_t, M, op)
        if col_t.numel() != E or rowptr_t.numel() != N + 1:
            raise ValueError(f"{op}: the CSC is not the transpose of a CSR of {E} edges from {N} sources")
    if grad.shape[0] != M:
        raise ValueError(f"{op}: grad has {grad.shape[0]} rows for {M} destination rows")
    rows = _rows(rowptr)
    g = _acc(grad).index_select(0, rows)  # [E, *F]: the gradient of every slot's row
    if weight is not None:
        g = g * _weight_view(weight, grad, perm)
    slots = torch.arange(E, device=grad.device).view(-1, *([1] * (grad.dim() - 1)))
    hit = arg.index_select(0, rows) == slots
    out = torch.zeros((N,) + tuple(grad.shape[1:]), dtype=g.dtype, device=grad.device)
    # index_add_ adds the slots in order, sources apart: per source, its edges in CSR slot order
    out.index_add_(0, col.long(), torch.where(hit, g, torch.zeros_like(g)))
    return out.to(grad.dtype)


def arg_edge_dot(rowptr, col, perm, x, arg, grad, heads: int, knobs: Sequence[int] = ()):
    """out[perm[j], h] = the sum, over the features f of head h in order, of grad[r, f] *
    x[col[j], f] where arg[r, f] == j (j a slot of row r)."""
    op = "gnncompile.arg_edge_dot"
    _check_records(arg, grad, op)
    E, M = col.numel(), rowptr.numel() - 1
    check_structure(rowptr, col, perm, x.size(0), op)
    check_perm_unique(perm, op)
    F = _features(x)
    if heads < 1 or F % heads or grad.shape[0] != M or _features(grad) != F:
        raise ValueError(f"{op}: grad must be [{M}, ...] with x's {F} features, heads ({heads}) dividing them")
    acc = _acc(x).dtype
    out = torch.zeros(E * heads + 1, dtype=acc, device=x.device)  # + 1: where nothing is routed
    if E and M and F:
        a = arg.reshape(M, F)
        valid = (a >= rowptr[:-1].long().view(-1, 1)) & (a < rowptr[1:].long().view(-1, 1))
        j = torch.where(valid, a, torch.zeros_like(a))
        xs = _acc(x).reshape(-1, F).gather(0, col.long()[j])
        h = torch.div(torch.arange(F, device=x.device), F // heads, rounding_mode="floor").view(1, F)
        flat = torch.where(valid, perm.long()[j] * heads + h, torch.full_like(j, E * heads))
        out.scatter_add_(0, flat.reshape(-1), (xs * _acc(grad).reshape(M, F)).reshape(-1))
    return out[:E * heads].reshape(E, heads).to(x.dtype)


def _edge_rows(rowptr, perm, op: str):
    """(E, M, perm as int64, CSR row of every slot) of a structure an edge op writes through."""
    E = perm.numel()
    check_structure(rowptr, perm, perm, E, op)
    check_perm_unique(perm, op)
    return E, rowptr.numel() - 1, perm.long(), _rows(rowptr)


def edge_softmax(rowptr, perm, scores, knobs: Sequence[int] = ()):
    E, M, p, rows = _edge_rows(rowptr, perm, "gnncompile.edge_softmax")
    s = _acc(scores).reshape(E, _features(scores))[p]
    idx = rows.view(-1, 1).expand_as(s)
    smax = torch.full((M, s.size(1)), float("-inf"), dtype=s.dtype, device=s.device)
    smax = smax.scatter_reduce(0, idx, s, "amax", include_self=True)
    smax = torch.where(torch.isinf(smax) & (smax < 0), torch.zeros_like(smax), smax)
    ex = (s - smax.index_select(0, rows)).exp()
    den = torch.zeros_like(smax).index_add_(0, rows, ex) + 1e-16
    y = ex / den.index_select(0, rows)
    out = torch.empty_like(y)
    out[p] = y
    return out.reshape(scores.shape).to(scores.dtype)


def edge_softmax_backward(rowptr, perm, out, grad, knobs: Sequence[int] = ()):
    E, M, p, rows = _edge_rows(rowptr, perm, "gnncompile.edge_softmax_backward")
    H = _features(out)
    y = _acc(out).reshape(E, H)[p]
    g = _acc(grad).reshape(E, H)[p]
    s = torch.zeros(M, y.size(1), dtype=y.dtype, device=y.device).index_add_(0, rows, y * g)
    gs = y * (g - s.index_select(0, rows))
    res = torch.empty_like(gs)
    res[p] = gs
    return res.reshape(out.shape).to(out.dtype)


def extreme_edges_backward(rowptr, perm, messages, out, grad, by_slot: bool, count_zeros: bool,
                           nan_gives_nan: bool, knobs: Sequence[int] = ()):
    """torch's max / min gradient (``scatter_reduce`` amax / amin, ops/extremes.py) of per-edge
    messages reduced over a CSR: ``(m == y) * (g / N)`` per edge and feature, ``N`` the messages
    of the row equal to its extreme ``y`` (``out``), plus 1 where ``count_zeros`` and ``y == 0``;
    ``N = 0`` (a NaN extreme) divides by zero where ``nan_gives_nan``, else counts as 1.
    ``messages`` and the result are [E, F] in the user's edge order (through perm), or in CSR slot
    order with ``by_slot``; ``out`` and ``grad`` [M, F]."""
    op = "gnncompile.extreme_edges_backward"
    E, M, p, rows = _edge_rows(rowptr, perm, op)
    _check_extreme_edges(messages, out, grad, E, M, op)
    m = messages if by_slot else messages.index_select(0, p)
    y = out.index_select(0, rows)
    eq = (m == y).to(messages.dtype)
    n = torch.zeros_like(out)
    if count_zeros:
        n = n + (out == 0).to(out.dtype)
    n = n.index_add(0, rows, eq)
    if not nan_gives_nan:
        n = torch.where(n == 0, torch.ones_like(n), n)
    res = eq * (grad / n).index_select(0, rows)
    if by_slot:
        return res
    ret = torch.empty_like(res)
    ret[p] = res
    return ret


def _check_extreme_edges(messages, out, grad, E: int, M: int, op: str) -> None:
    """The shapes and dtypes extreme_edges_backward takes (the native glue's checks, same words)."""
    if messages.dim() != 2 or messages.shape[0] != E:
        raise ValueError(f"{op}: messages must be [E, F] with E = {E} edges, got {list(messages.shape)}")
    F = messages.shape[1]
    for name, t in (("out", out), ("grad", grad)):
        if t.dim() != 2 or list(t.shape) != [M, F]:
            raise ValueError(f"{op}: {name} must be [M, F] = [{M}, {F}], got {list(t.shape)}")
    if messages.dtype not in (torch.float32, torch.float64) or out.dtype != messages.dtype or \
            grad.dtype != messages.dtype:
        raise TypeError(f"{op}: messages, out and grad must share one dtype, float32 or float64; got "
                        f"{messages.dtype}, {out.dtype}, {grad.dtype}")


def clone_structure(tensors):
    """Copies of the tensors (the native kernel also carries over what is known of each, so that
    the copies are not validated again)."""
    return [t.clone() for t in tensors]


def adopt_worker_structure(rowptr, col, perm, num_src: int):
    """Without the native module there is no record of validated structures: nothing to do."""
    return None


def transpose_structure(rowptr, col, perm, num_src: int):
    """CSC (by source) from CSR (by destination), with perm_t in original edge ids: build_csr of
    the (col, row) pairs in CSR slot order, perm_t = perm[slot]."""
    deg = rowptr[1:] - rowptr[:-1]
    rows = torch.repeat_interleave(
        torch.arange(deg.shape[0], device=rowptr.device, dtype=rowptr.dtype), deg.long()
    )
    rowptr_t, col_t, slot = torch.ops.gnncompile.build_csr(col, rows, num_src, deg.shape[0])
    return rowptr_t, col_t, perm[slot.long()]


# ----------------------------------------------------------------------------- fingerprint
_U64 = (1 << 64) - 1
_FP_POS = 0x9e3779b97f4a7c15  # the constants of native/common/fingerprint.h


def _i64(u: int) -> int:
    """The int64 with the bits of the uint64 ``u``."""
    u &= _U64
    return u - (1 << 64) if u >> 63 else u


def _shr(x: torch.Tensor, s: int) -> torch.Tensor:
    """Logical right shift of int64 words (torch's ``>>`` is arithmetic)."""
    return (x >> s) & ((1 << (64 - s)) - 1)


def _fp_mix(x: torch.Tensor) -> torch.Tensor:
    x = x ^ _shr(x, 30)
    x = x * _i64(0xbf58476d1ce4e5b9)
    x = x ^ _shr(x, 27)
    x = x * _i64(0x94d049bb133111eb)
    return x ^ _shr(x, 31)


def fingerprint(index: torch.Tensor) -> torch.Tensor:
    """``mix(sum_i mix(v[i] ^ i * K) ^ mix(n + K))`` modulo 2^64 over the elements in row-major
    order (native/common/fingerprint.h explains the choice); int64 arithmetic wraps like uint64."""
    if index.dtype not in (torch.int32, torch.int64):
        raise TypeError(f"gnncompile.fingerprint: unsupported index dtype {index.dtype} (expected int32 or int64)")
    v = index.reshape(-1).long()
    n = v.numel()
    pos = torch.arange(n, dtype=torch.long, device=v.device) * _i64(_FP_POS)
    total = _fp_mix(v ^ pos).sum()
    size_key = _fp_mix(torch.tensor(_i64(n + _FP_POS), dtype=torch.long, device=v.device))
    return _fp_mix(total ^ size_key)


# ----------------------------------------------------------------------------- dropout
def _splitmix_int(z: int) -> int:
    """splitmix64 of a Python int, as uint64 (native/cpu/dropout.cpp)."""
    z = (z + _FP_POS) & _U64
    z = ((z ^ (z >> 30)) * 0xbf58476d1ce4e5b9) & _U64
    z = ((z ^ (z >> 27)) * 0x94d049bb133111eb) & _U64
    return z ^ (z >> 31)


_M32 = 0xFFFFFFFF


def _fmix32(h: torch.Tensor) -> torch.Tensor:
    """murmur3's 32-bit finaliser on int64 words holding uint32 values."""
    h = h ^ (h >> 16)
    h = (h * 0x85ebca6b) & _M32
    h = h ^ (h >> 13)
    h = (h * 0xc2b2ae35) & _M32
    return h ^ (h >> 16)


def dropout(x: torch.Tensor, p: float, seed: torch.Tensor) -> torch.Tensor:
    """The mask of native/cpu/dropout.cpp, bit for bit: element i is kept when
    draw(splitmix64(seed), i) >= floor(p * 2^32) (two murmur3 finaliser rounds, there)."""
    if not 0.0 <= p < 1.0:
        raise ValueError(f"gnncompile.dropout: p must be in [0, 1), got {p}")
    if seed.numel() != 1 or seed.dtype != torch.long:
        raise ValueError("gnncompile.dropout: seed must be one int64")
    key = _splitmix_int(int(seed.reshape(()).item()) & _U64)
    i = torch.arange(x.numel(), dtype=torch.long, device=x.device)
    k1 = (key & _M32) ^ (((i >> 32) * 0x9e3779b1) & _M32)
    k2 = key >> 32
    r = _fmix32(_fmix32(((i & _M32) * 0x9e3779b1 & _M32) ^ k1) ^ k2)
    keep = (r >= int(p * 4294967296.0)).reshape(x.shape)
    acc = torch.float64 if x.dtype == torch.float64 else torch.float32
    scale = torch.where(keep, torch.tensor(1.0 / (1.0 - p), dtype=acc, device=x.device),
                        torch.zeros((), dtype=acc, device=x.device))
    return (x.to(acc) * scale).to(x.dtype).contiguous()  # a dropped NaN / inf gives NaN, as x * mask


# ----------------------------------------------------------------------------- attention
def _check_attention(rowptr, col, perm, x, a_src, a_dst, a_edge, negative_slope, p, seed, op: str,
                     read_col: bool = True):
    """The checks of native/common/attention_glue.h, with its messages, and of the structure as
    the kernels read it (the backward reads the CSR's rowptr and perm, not its col)."""
    if x.dim() != 3:
        raise ValueError(f"{op}: x must be [num_src, heads, channels], got {list(x.shape)}")
    N, H, _ = x.shape
    M, E = rowptr.numel() - 1, col.numel()
    if a_src.dim() != 2 or tuple(a_src.shape) != (N, H):
        raise ValueError(f"{op}: a_src must be [{N}, {H}] (a score per source node and head), got {list(a_src.shape)}")
    if a_dst.dim() != 2 or tuple(a_dst.shape) != (M, H):
        raise ValueError(f"{op}: a_dst must be [{M}, {H}] (a score per destination row and head), "
                         f"got {list(a_dst.shape)}")
    if a_edge is not None and (a_edge.dim() != 2 or tuple(a_edge.shape) != (E, H)):
        raise ValueError(f"{op}: a_edge must be [{E}, {H}] (a score per edge and head), got {list(a_edge.shape)}")
    for t in (a_src, a_dst) + ((a_edge,) if a_edge is not None else ()):
        if t.dtype != x.dtype:
            raise TypeError(f"{op}: a_src, a_dst and a_edge must have x's dtype {x.dtype}")
    if not math.isfinite(negative_slope):
        raise ValueError(f"{op}: negative_slope must be finite, got {negative_slope}")
    if not 0.0 <= p < 1.0:
        raise ValueError(f"{op}: dropout p must be in [0, 1), got {p}")
    if p > 0 and (seed is None or seed.numel() != 1 or seed.dtype != torch.long or seed.device.type != "cpu"):
        raise ValueError(f"{op}: dropout p > 0 needs a seed, one int64 on the CPU")
    if not read_col and (col.dim() != 1 or col.numel() != perm.numel()):
        raise ValueError(f"{op}: rowptr, col and perm must be 1-D, col and perm of one length")
    check_structure(rowptr, col if read_col else perm, perm, N if read_col else col.numel(), op)


def _keep_factors(E: int, H: int, p: float, seed, device, dtype) -> Optional[torch.Tensor]:
    """The dropout op's factors (1 / (1 - p) or 0) of the [E, H] coefficients, in edge order."""
    if p == 0:
        return None
    return dropout(torch.ones(E, H, dtype=torch.float64, device=device), p, seed).to(dtype)


def _raw_logits(a_src, a_dst, a_edge, src, dst, e):
    raw = a_src[src] + a_dst[dst]  # added in x's dtype, as the layer does
    if a_edge is not None:
        raw = raw + a_edge[e]
    return _acc(raw)


def attention(rowptr, col, perm, x, a_src, a_dst, a_edge, negative_slope: float, p: float, seed,
              knobs: Sequence[int] = (), rowptr_t=None, col_t=None, perm_t=None):
    """Graph attention as the chain it fuses (native/cpu/attention_core.h): leaky_relu of
    a_src[src] + a_dst[dst] (+ a_edge), edge_softmax, dropout, the weighted spmm; also the
    softmax's statistics per row and head ([M, 2, H]: max, 1 / (sum + 1e-16))."""
    op = "gnncompile.attention"
    _check_attention(rowptr, col, perm, x, a_src, a_dst, a_edge, negative_slope, p, seed, op)
    M, (_, H, C) = rowptr.numel() - 1, x.shape
    rows, src, e = _rows(rowptr), col.long(), perm.long()
    raw = _raw_logits(a_src, a_dst, a_edge, src, rows, e)
    ks = _keep_factors(col.numel(), H, p, seed, x.device, raw.dtype)
    ks = ks[e] if ks is not None else None
    s = torch.nn.functional.leaky_relu(raw, negative_slope)
    smax = torch.full((M, H), float("-inf"), dtype=s.dtype, device=s.device)
    smax = smax.scatter_reduce(0, rows.view(-1, 1).expand_as(s), s, "amax", include_self=True)
    smax = torch.where(torch.isinf(smax) & (smax < 0), torch.zeros_like(smax), smax)
    ex = (s - smax.index_select(0, rows)).exp()
    inv = 1.0 / (torch.zeros_like(smax).index_add_(0, rows, ex) + 1e-16)
    w = (ex * inv.index_select(0, rows)).to(x.dtype)
    if ks is not None:
        w = (_acc(w) * ks).to(x.dtype)  # (a float product, as the kernel's)
    out = torch.zeros(M, H, C, dtype=_acc(x).dtype, device=x.device)
    out.index_add_(0, rows, _acc(x)[src] * _acc(w).unsqueeze(-1))
    empty = (rowptr[1:] == rowptr[:-1]).view(-1, 1)
    stats = torch.stack([smax, torch.where(empty, torch.zeros_like(inv), inv)], 1)  # (0 for an empty row)
    return out.to(x.dtype), stats.to(torch.float64 if x.dtype == torch.float64 else torch.float32)


def attention_backward(rowptr, col, perm, x, a_src, a_dst, a_edge, negative_slope: float, p: float, seed,
                       out, stats, grad, knobs: Sequence[int], rowptr_t, col_t, perm_t):
    """The gradients of :func:`attention` for x, a_src, a_dst and a_edge ([0, H] without one),
    from the forward's output and statistics, as the kernels compute them: over the CSC (its slot
    k: source j, destination col_t[k], edge perm_t[k]) D = <out, grad> per row and head, the
    coefficient alpha recomputed, ds = alpha (keep <x[j], grad[dst]> - D[dst]) through
    leaky_relu's derivative, summed per source (g_src) and written per edge (d_edge, g_edge);
    g_dst sums d_edge over each CSR row."""
    op = "gnncompile.attention_backward"
    _check_attention(rowptr, col, perm, x, a_src, a_dst, a_edge, negative_slope, p, seed, op, read_col=False)
    M, (N, H, C) = rowptr.numel() - 1, x.shape
    if tuple(out.shape) != (M, H, C) or tuple(grad.shape) != (M, H, C):
        raise ValueError(f"{op}: out and grad must be [{M}, {H}, {C}], got {list(out.shape)} and {list(grad.shape)}")
    if tuple(stats.shape) != (M, 2, H):
        raise ValueError(f"{op}: stats must be [{M}, 2, {H}] (the forward's), got {list(stats.shape)}")
    if rowptr_t.numel() != N + 1 or col_t.numel() != col.numel():
        raise ValueError(f"{op}: the CSC ({rowptr_t.numel() - 1} sources, {col_t.numel()} edges) is not the "
                         f"transpose of a CSR of {col.numel()} edges from {N} sources")
    check_structure(rowptr_t, col_t, perm_t, M, op)
    check_perm_unique(perm_t, op)
    srcs, dsts, e = _rows(rowptr_t), col_t.long(), perm_t.long()  # per CSC slot
    raw = _raw_logits(a_src, a_dst, a_edge, srcs, dsts, e)
    st = stats.to(raw.dtype)
    s = torch.nn.functional.leaky_relu(raw, negative_slope)
    alpha = _acc(((s - st[:, 0].index_select(0, dsts)).exp() * st[:, 1].index_select(0, dsts)).to(x.dtype))
    ks = _keep_factors(col.numel(), H, p, seed, x.device, alpha.dtype)
    ks = torch.ones_like(alpha) if ks is None else ks[e]
    w = _acc((alpha * ks).to(x.dtype))
    g, xa = _acc(grad), _acc(x)
    D = (_acc(out) * g).sum(-1)
    gr = g.index_select(0, dsts)
    gx = torch.zeros(N, H, C, dtype=g.dtype, device=g.device).index_add_(0, srcs, w.unsqueeze(-1) * gr)
    ds = alpha * ((xa.index_select(0, srcs) * gr).sum(-1) * ks - D.index_select(0, dsts))
    dr = torch.where(raw > 0, ds, ds * negative_slope)
    g_src = torch.zeros(N, H, dtype=dr.dtype, device=dr.device).index_add_(0, srcs, dr)
    d_edge = torch.zeros(col.numel(), H, dtype=dr.dtype, device=dr.device)
    d_edge[e] = dr
    g_dst = torch.zeros(M, H, dtype=dr.dtype, device=dr.device).index_add_(0, _rows(rowptr), d_edge[perm.long()])
    g_edge = d_edge.to(x.dtype) if a_edge is not None else torch.zeros(0, H, dtype=x.dtype, device=x.device)
    return gx.to(x.dtype), g_src.to(x.dtype), g_dst.to(x.dtype), g_edge


# ----------------------------------------------------------------------------- attention_v2
def _check_attention_v2(rowptr, col, perm, x_l, x_r, att, e_term, negative_slope, p, seed, op: str):
    """The checks of native/cpu/attention_v2.cpp, with its messages."""
    if x_l.dim() != 3:
        raise ValueError(f"{op}: x_l must be [num_src, heads, channels], got {list(x_l.shape)}")
    N, H, C = x_l.shape
    M, E = rowptr.numel() - 1, col.numel()
    if x_r.dim() != 3 or tuple(x_r.shape) != (M, H, C):
        raise ValueError(f"{op}: x_r must be [{M}, {H}, {C}] (a row per destination), got {list(x_r.shape)}")
    if att.numel() != H * C or att.dim() not in (2, 3) or att.shape[-1] != C:
        raise ValueError(f"{op}: att must be [{H}, {C}] (or [1, {H}, {C}]), got {list(att.shape)}")
    if e_term is not None and (e_term.dim() != 3 or tuple(e_term.shape) != (E, H, C)):
        raise ValueError(f"{op}: e_term must be [{E}, {H}, {C}] (a term per edge), got {list(e_term.shape)}")
    for t in (x_r, att) + ((e_term,) if e_term is not None else ()):
        if t.dtype != x_l.dtype:
            raise TypeError(f"{op}: x_r, att and e_term must have x_l's dtype {x_l.dtype}")
    if not math.isfinite(negative_slope):
        raise ValueError(f"{op}: negative_slope must be finite, got {negative_slope}")
    if not 0.0 <= p < 1.0:
        raise ValueError(f"{op}: dropout p must be in [0, 1), got {p}")
    if p > 0 and (seed is None or seed.numel() != 1 or seed.dtype != torch.long or seed.device.type != "cpu"):
        raise ValueError(f"{op}: dropout p > 0 needs a seed, one int64 on the CPU")
    check_structure(rowptr, col, perm, N, op)


def _v2_logits(x_l, x_r, att, e_term, src, dst, e, negative_slope):
    """z (in x's dtype, as the layer adds), leaky_relu(z) and the logits, per CSR slot."""
    z = x_l[src] + x_r[dst]
    if e_term is not None:
        z = z + e_term[e]
    z = _acc(z)
    lz = torch.nn.functional.leaky_relu(z, negative_slope)
    H, C = x_l.shape[1:]
    return z, lz, (lz * _acc(att).reshape(1, H, C)).sum(-1)


def attention_v2(rowptr, col, perm, x_l, x_r, att, e_term, negative_slope: float, p: float, seed,
                 knobs: Sequence[int] = (), rowptr_t=None, col_t=None, perm_t=None):
    """GATv2's attention as the chain it fuses (native/cpu/attention_v2_core.h): z = x_l[src] +
    x_r[dst] (+ e_term), logits sum_c att * leaky_relu(z), edge softmax, dropout, the weighted sum
    of x_l[src]; also the softmax's statistics per row and head ([M, 2, H]: max, 1 / (sum + 1e-16))."""
    op = "gnncompile.attention_v2"
    _check_attention_v2(rowptr, col, perm, x_l, x_r, att, e_term, negative_slope, p, seed, op)
    M, (_, H, C) = rowptr.numel() - 1, x_l.shape
    rows, src, e = _rows(rowptr), col.long(), perm.long()
    _, _, s = _v2_logits(x_l, x_r, att, e_term, src, rows, e, negative_slope)
    ks = _keep_factors(col.numel(), H, p, seed, x_l.device, s.dtype)
    ks = ks[e] if ks is not None else None
    smax = torch.full((M, H), float("-inf"), dtype=s.dtype, device=s.device)
    smax = smax.scatter_reduce(0, rows.view(-1, 1).expand_as(s), s, "amax", include_self=True)
    smax = torch.where(torch.isinf(smax) & (smax < 0), torch.zeros_like(smax), smax)
    ex = (s - smax.index_select(0, rows)).exp()
    inv = 1.0 / (torch.zeros_like(smax).index_add_(0, rows, ex) + 1e-16)
    w = (ex * inv.index_select(0, rows)).to(x_l.dtype)
    if ks is not None:
        w = (_acc(w) * ks).to(x_l.dtype)
    out = torch.zeros(M, H, C, dtype=_acc(x_l).dtype, device=x_l.device)
    out.index_add_(0, rows, _acc(x_l)[src] * _acc(w).unsqueeze(-1))
    empty = (rowptr[1:] == rowptr[:-1]).view(-1, 1)
    stats = torch.stack([smax, torch.where(empty, torch.zeros_like(inv), inv)], 1)
    return out.to(x_l.dtype), stats.to(torch.float64 if x_l.dtype == torch.float64 else torch.float32)


def attention_v2_backward(rowptr, col, perm, x_l, x_r, att, e_term, negative_slope: float, p: float, seed,
                          out, stats, grad, knobs: Sequence[int], rowptr_t, col_t, perm_t):
    """The gradients of :func:`attention_v2` for x_l, x_r, att and e_term ([0, H, C] without one),
    from the forward's output and statistics, as the kernels compute them: per edge alpha
    recomputed, dlogit = alpha (keep <x_l[src], grad[dst]> - <out[dst], grad[dst]>), dz = dlogit
    att leaky_relu'(z); g_x_r sums dz per destination, g_x_l sums w grad[dst] + dz per source,
    g_att sums dlogit leaky_relu(z), g_e is dz per edge."""
    op = "gnncompile.attention_v2_backward"
    _check_attention_v2(rowptr, col, perm, x_l, x_r, att, e_term, negative_slope, p, seed, op)
    M, (N, H, C) = rowptr.numel() - 1, x_l.shape
    if tuple(out.shape) != (M, H, C) or tuple(grad.shape) != (M, H, C):
        raise ValueError(f"{op}: out and grad must be [{M}, {H}, {C}], got {list(out.shape)} and {list(grad.shape)}")
    if tuple(stats.shape) != (M, 2, H):
        raise ValueError(f"{op}: stats must be [{M}, 2, {H}] (the forward's), got {list(stats.shape)}")
    if rowptr_t.numel() != N + 1 or col_t.numel() != col.numel():
        raise ValueError(f"{op}: the CSC ({rowptr_t.numel() - 1} sources, {col_t.numel()} edges) is not the "
                         f"transpose of a CSR of {col.numel()} edges from {N} sources")
    check_perm_unique(perm, op)
    rows, src, e = _rows(rowptr), col.long(), perm.long()
    z, lz, s = _v2_logits(x_l, x_r, att, e_term, src, rows, e, negative_slope)
    st = stats.to(s.dtype)
    alpha = _acc(((s - st[:, 0].index_select(0, rows)).exp() * st[:, 1].index_select(0, rows)).to(x_l.dtype))
    ks = _keep_factors(col.numel(), H, p, seed, x_l.device, alpha.dtype)
    ks = torch.ones_like(alpha) if ks is None else ks[e]
    w = _acc((alpha * ks).to(x_l.dtype))
    g, xa = _acc(grad), _acc(x_l)
    D = (_acc(out) * g).sum(-1)
    gr = g.index_select(0, rows)
    dl = alpha * ((xa.index_select(0, src) * gr).sum(-1) * ks - D.index_select(0, rows))
    dz = dl.unsqueeze(-1) * _acc(att).reshape(1, H, C) * torch.where(z > 0, torch.ones_like(z), torch.full_like(z, negative_slope))
    g_xr = torch.zeros(M, H, C, dtype=g.dtype, device=g.device).index_add_(0, rows, dz)
    g_xl = torch.zeros(N, H, C, dtype=g.dtype, device=g.device).index_add_(0, src, w.unsqueeze(-1) * gr + dz)
    g_att = (dl.unsqueeze(-1) * lz).sum(0).reshape(att.shape)
    if e_term is not None:
        g_e = torch.zeros_like(dz)
        g_e[e] = dz
        g_e = g_e.to(x_l.dtype)
    else:
        g_e = torch.zeros(0, H, C, dtype=x_l.dtype, device=x_l.device)
    return g_xl.to(x_l.dtype), g_xr.to(x_l.dtype), g_att.to(x_l.dtype), g_e


# ----------------------------------------------------------------------------- attention_dot
def _check_attention_dot(rowptr, col, perm, q, k, v, qe, edge_attr, scale, p, seed, op: str):
    """The checks of native/cpu/attention_dot.cpp, with its messages."""
    if k.dim() != 3:
        raise ValueError(f"{op}: k must be [num_src, heads, channels], got {list(k.shape)}")
    N, H, C = k.shape
    M, E = rowptr.numel() - 1, col.numel()
    if q.dim() != 3 or tuple(q.shape) != (M, H, C):
        raise ValueError(f"{op}: q must be [{M}, {H}, {C}] (a row per destination), got {list(q.shape)}")
    if v.dim() != 3 or tuple(v.shape) != (N, H, C):
        raise ValueError(f"{op}: v must be [{N}, {H}, {C}] (k's shape), got {list(v.shape)}")
    if (qe is None) != (edge_attr is None):
        raise ValueError(f"{op}: qe and edge_attr come together (both or neither)")
    if edge_attr is not None:
        if edge_attr.dim() != 2 or edge_attr.shape[0] != E:
            raise ValueError(f"{op}: edge_attr must be [{E}, edge_dim] (a row per edge), got {list(edge_attr.shape)}")
        De = edge_attr.shape[1]
        if qe.dim() != 3 or tuple(qe.shape) != (M, H, De):
            raise ValueError(f"{op}: qe must be [{M}, {H}, {De}] (a row per destination), got {list(qe.shape)}")
    for t in (q, v) + ((qe, edge_attr) if edge_attr is not None else ()):
        if t.dtype != k.dtype:
            raise TypeError(f"{op}: q, v, qe and edge_attr must have k's dtype {k.dtype}")
    if not math.isfinite(scale):
        raise ValueError(f"{op}: scale must be finite, got {scale}")
    if not 0.0 <= p < 1.0:
        raise ValueError(f"{op}: dropout p must be in [0, 1), got {p}")
    if p > 0 and (seed is None or seed.numel() != 1 or seed.dtype != torch.long or seed.device.type != "cpu"):
        raise ValueError(f"{op}: dropout p > 0 needs a seed, one int64 on the CPU")
    check_structure(rowptr, col, perm, N, op)


def _dot_logits(q, k, qe, edge_attr, src, dst, e, scale):
    """The logits per CSR slot ([E, H]) in the accumulator dtype."""
    s = (_acc(q).index_select(0, dst) * _acc(k).index_select(0, src)).sum(-1)
    if edge_attr is not None:
        s = s + (_acc(qe).index_select(0, dst) * _acc(edge_attr).index_select(0, e).unsqueeze(1)).sum(-1)
    return s * scale


def attention_dot(rowptr, col, perm, q, k, v, qe, edge_attr, scale: float, p: float, seed,
                  knobs: Sequence[int] = (), rowptr_t=None, col_t=None, perm_t=None):
    """Dot-product attention as the chain it fuses (native/cpu/attention_dot_core.h): logits
    scale (<q[dst], k[src]> + <qe[dst], edge_attr[e]>), edge softmax, dropout, the weighted sums
    of v[src] ([M, H, C]) and of edge_attr[e] per head ([M, H, De]); also the softmax's statistics
    per row and head ([M, 2, H]: max, 1 / (sum + 1e-16))."""
    op = "gnncompile.attention_dot"
    _check_attention_dot(rowptr, col, perm, q, k, v, qe, edge_attr, scale, p, seed, op)
    M, (_, H, C) = rowptr.numel() - 1, k.shape
    De = edge_attr.shape[1] if edge_attr is not None else 0
    rows, src, e = _rows(rowptr), col.long(), perm.long()
    s = _dot_logits(q, k, qe, edge_attr, src, rows, e, scale)
    ks = _keep_factors(col.numel(), H, p, seed, k.device, s.dtype)
    ks = ks[e] if ks is not None else None
    smax = torch.full((M, H), float("-inf"), dtype=s.dtype, device=s.device)
    smax = smax.scatter_reduce(0, rows.view(-1, 1).expand_as(s), s, "amax", include_self=True)
    smax = torch.where(torch.isinf(smax) & (smax < 0), torch.zeros_like(smax), smax)
    ex = (s - smax.index_select(0, rows)).exp()
    inv = 1.0 / (torch.zeros_like(smax).index_add_(0, rows, ex) + 1e-16)
    w = (ex * inv.index_select(0, rows)).to(k.dtype)
    if ks is not None:
        w = (_acc(w) * ks).to(k.dtype)
    wa = _acc(w).unsqueeze(-1)
    out = torch.zeros(M, H, C, dtype=wa.dtype, device=k.device)
    out.index_add_(0, rows, _acc(v).index_select(0, src) * wa)
    out_e = torch.zeros(M, H, De, dtype=wa.dtype, device=k.device)
    if edge_attr is not None:
        out_e.index_add_(0, rows, _acc(edge_attr).index_select(0, e).unsqueeze(1) * wa)
    empty = (rowptr[1:] == rowptr[:-1]).view(-1, 1)
    stats = torch.stack([smax, torch.where(empty, torch.zeros_like(inv), inv)], 1)
    return (out.to(k.dtype), out_e.to(k.dtype),
            stats.to(torch.float64 if k.dtype == torch.float64 else torch.float32))


def attention_dot_backward(rowptr, col, perm, q, k, v, qe, edge_attr, scale: float, p: float, seed, out, out_e,
                           stats, grad, grad_e, knobs: Sequence[int], rowptr_t, col_t, perm_t,
                           grad_edge_attr: bool = True):
    """The gradients of :func:`attention_dot` for q, k, v, qe and edge_attr ([M, H, 0] and [E, 0]
    without edge features), from the forward's outputs and statistics, as the kernels compute them:
    alpha recomputed, g_a = <grad[dst], v[src]> + <grad_e[dst], edge_attr[e]>, ds = scale alpha
    (keep g_a - D) with D = <out, grad> + <out_e, grad_e> per row and head, over the CSR; g_q
    sums ds k[src], g_qe ds edge_attr[e] per destination, and g_edge_attr[e] = sum over heads of
    w grad_e[dst] + ds qe[dst]. g_k and g_v are sums over the CSC (its slot k: source j,
    destination col_t[k], edge perm_t[k]), as the kernel's second pass reads it: ds q[col_t[k]]
    and w grad[col_t[k]] with the ds and w of edge perm_t[k]. With the CSC that is the CSR's
    transpose (the compiled model's, from one edge_index) these are the sums over the edges into
    the sources; the op trusts that pairing as spmm_backward does. With ``grad_edge_attr=False``
    edge_attr's gradient is not computed: [0, De] in its place."""
    op = "gnncompile.attention_dot_backward"
    _check_attention_dot(rowptr, col, perm, q, k, v, qe, edge_attr, scale, p, seed, op)
    M, (N, H, C) = rowptr.numel() - 1, k.shape
    De = edge_attr.shape[1] if edge_attr is not None else 0
    if tuple(out.shape) != (M, H, C) or tuple(grad.shape) != (M, H, C):
        raise ValueError(f"{op}: out and grad must be [{M}, {H}, {C}], got {list(out.shape)} and {list(grad.shape)}")
    if tuple(out_e.shape) != (M, H, De) or tuple(grad_e.shape) != (M, H, De):
        raise ValueError(f"{op}: out_e and grad_e must be [{M}, {H}, {De}], got {list(out_e.shape)} and "
                         f"{list(grad_e.shape)}")
    if tuple(stats.shape) != (M, 2, H):
        raise ValueError(f"{op}: stats must be [{M}, 2, {H}] (the forward's), got {list(stats.shape)}")
    if rowptr_t.numel() != N + 1 or col_t.numel() != col.numel():
        raise ValueError(f"{op}: the CSC ({rowptr_t.numel() - 1} sources, {col_t.numel()} edges) is not the "
                         f"transpose of a CSR of {col.numel()} edges from {N} sources")
    check_structure(rowptr_t, col_t, perm_t, M, op)
    check_perm_unique(perm, op)
    rows, src, e = _rows(rowptr), col.long(), perm.long()
    s = _dot_logits(q, k, qe, edge_attr, src, rows, e, scale)
    st = stats.to(s.dtype)
    alpha = _acc(((s - st[:, 0].index_select(0, rows)).exp() * st[:, 1].index_select(0, rows)).to(k.dtype))
    ks = _keep_factors(col.numel(), H, p, seed, k.device, alpha.dtype)
    ks = torch.ones_like(alpha) if ks is None else ks[e]
    w = _acc((alpha * ks).to(k.dtype))
    g = _acc(grad)
    gr = g.index_select(0, rows)
    D = (_acc(out) * g).sum(-1)
    ga = (_acc(v).index_select(0, src) * gr).sum(-1)
    if edge_attr is not None:
        ge = _acc(grad_e)
        ger = ge.index_select(0, rows)
        ea = _acc(edge_attr).index_select(0, e)
        D = D + (_acc(out_e) * ge).sum(-1)
        ga = ga + (ger * ea.unsqueeze(1)).sum(-1)
    ds = scale * alpha * (ga * ks - D.index_select(0, rows))
    zeros = dict(dtype=g.dtype, device=g.device)
    g_q = torch.zeros(M, H, C, **zeros).index_add_(0, rows, ds.unsqueeze(-1) * _acc(k).index_select(0, src))
    # the CSC pass: ds and w by edge id, read per CSC slot
    ds_e, w_e = torch.empty_like(ds), torch.empty_like(w)
    ds_e[e], w_e[e] = ds, w
    srcs_t, dsts_t, e_t = _rows(rowptr_t), col_t.long(), perm_t.long()
    g_k = torch.zeros(N, H, C, **zeros).index_add_(
        0, srcs_t, ds_e[e_t].unsqueeze(-1) * _acc(q).index_select(0, dsts_t))
    g_v = torch.zeros(N, H, C, **zeros).index_add_(0, srcs_t, w_e[e_t].unsqueeze(-1) * g.index_select(0, dsts_t))
    if edge_attr is not None:
        g_qe = torch.zeros(M, H, De, **zeros).index_add_(0, rows, ds.unsqueeze(-1) * ea.unsqueeze(1))
        per_slot = (w.unsqueeze(-1) * ger + ds.unsqueeze(-1) * _acc(qe).index_select(0, rows)).sum(1)
        g_ea = torch.zeros(col.numel(), De, **zeros)
        g_ea[e] = per_slot
    else:
        g_qe = torch.zeros(M, H, 0, **zeros)
        g_ea = torch.zeros(col.numel(), 0, **zeros)
    if edge_attr is not None and not grad_edge_attr:
        g_ea = torch.zeros(0, De, **zeros)
    dt = k.dtype
    return g_q.to(dt), g_k.to(dt), g_v.to(dt), g_qe.to(dt), g_ea.to(dt)


# ----------------------------------------------------------------------------- collation
def _segment_offsets(sizes: torch.Tensor, idx: torch.Tensor):
    sel = sizes[idx]
    return sel, torch.cumsum(sel, 0) - sel


def _check_graphs(idx: torch.Tensor, num_graphs: int, op: str) -> None:
    if idx.numel() and (int(idx.min()) < 0 or int(idx.max()) >= num_graphs):
        raise IndexError(f"{op}: graph index out of range for {num_graphs} graphs")


def collate_rows(values, starts, sizes, idx, out, incs=None) -> None:
    """``out[o_b : o_b + n_b] = values[starts[g] : starts[g] + n_b] (+ inc_b)`` for the graphs
    ``g = idx[b]`` in turn (``n_b = sizes[g]``, ``o_b`` and ``inc_b`` the running sums of the sizes
    and of ``incs`` over the graphs before ``b``). The native CPU kernel is native/cpu/collate_core.h."""
    _check_graphs(idx, starts.numel(), "gnncompile.collate_rows")
    sel, offs = _segment_offsets(sizes, idx)
    total = int(sel.sum())
    if total > out.shape[0]:
        raise ValueError(f"gnncompile.collate_rows: the batch needs {total} rows, out holds {out.shape[0]}")
    seg = torch.repeat_interleave(torch.arange(idx.numel()), sel)
    rows = starts[idx][seg] + (torch.arange(total) - offs[seg])
    res = values.index_select(0, rows)
    if incs is not None:
        add = (torch.cumsum(incs[idx], 0) - incs[idx])[seg]
        res = res + add.view([-1] + [1] * (res.dim() - 1)).to(res.dtype)
    out[:total].copy_(res)


def segment_ids(sizes, idx, out, ptr) -> None:
    """``out[o_b : o_b + sizes[idx[b]]] = b`` (PyG's ``batch`` vector) and ``ptr = [0, o_1, ...]``."""
    _check_graphs(idx, sizes.numel(), "gnncompile.segment_ids")
    sel = sizes[idx]
    total = int(sel.sum())
    out[:total] = torch.repeat_interleave(torch.arange(idx.numel()), sel)
    ptr[0] = 0
    torch.cumsum(sel, 0, out=ptr[1:idx.numel() + 1])


# ----------------------------------------------------------------------------- neighbor sampling
# The same algorithm as native/cpu/neighbor_sample{_core.h,.cpp}, bit for bit (a Python loop:
# for tests and for devices without the native kernel).
_M64 = (1 << 64) - 1
_GOLDEN = 0x9E3779B97F4A7C15


def _mix64(z: int) -> int:
    z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & _M64
    z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & _M64
    return z ^ (z >> 31)


class _NodeStream:
    def __init__(self, seed: int, hop: int, local: int) -> None:
        base = _mix64(((seed & _M64) + _GOLDEN * (hop + 1)) & _M64)
        self.state = base ^ ((local * 0xD1B54A32D192ED03) & _M64)

    def below(self, n: int) -> int:
        self.state = (self.state + _GOLDEN) & _M64
        return (_mix64(self.state) * n) >> 64


def _draw_offsets(rng: _NodeStream, deg: int, k: int, replace: bool) -> list:
    if k < 0 or (not replace and deg <= k):
        return list(range(deg))
    if deg == 0:
        return []
    if replace:
        return [rng.below(deg) for _ in range(k)]
    out: list = []
    for t in range(deg - k, deg):
        r = rng.below(t + 1)
        out.append(t if r in out else r)
    return sorted(out)


def _draw_count(deg: int, k: int, replace: bool) -> int:
    if k < 0:
        return deg
    if deg == 0:
        return 0
    return k if replace else min(deg, k)


def _available_bytes() -> int:
    """As available_bytes() in native/cpu/neighbor_sample.cpp: MemAvailable (else the free
    pages), at most what the address-space limit (RLIMIT_AS) leaves above this process's size."""
    import os

    try:
        page = os.sysconf("SC_PAGE_SIZE")
    except (AttributeError, ValueError, OSError):  # pragma: no cover - not POSIX
        return _I64_MAX
    avail = None
    try:
        with open("/proc/meminfo") as f:
            avail = next((int(ln.split()[1]) * 1024 for ln in f if ln.startswith("MemAvailable:")), None)
    except (OSError, ValueError, IndexError):
        pass
    if avail is None:
        avail = os.sysconf("SC_AVPHYS_PAGES") * page
    try:
        import resource

        cur = resource.getrlimit(resource.RLIMIT_AS)[0]
    except ImportError:  # pragma: no cover - not POSIX
        cur = None
    if cur is not None and cur != resource.RLIM_INFINITY:
        try:
            with open("/proc/self/statm") as f:
                used = int(f.read().split()[0]) * page
        except (OSError, ValueError, IndexError):
            used = 0
        avail = min(avail, max(cur - used, 0))
    return min(avail, _I64_MAX)


_I64_MAX = 2**63 - 1
_CHECK_BYTES = 64 << 20  # kCheckBytes: smaller hops are not checked


def _check_hop_fits(hop: int, k: int, replace: bool, F: int, total: int, per_edge: int) -> None:
    """check_hop_fits of the native op: a hop whose draws cannot fit in the memory available
    raises before anything is drawn."""
    what = f"(fanout {k}{' with replacement' if replace else ''}, frontier of {F} nodes)"
    if total > _I64_MAX:
        raise ValueError(f"gnncompile.neighbor_sample: hop {hop} would sample more than 2^63 - 1 edges {what}")
    if total <= _CHECK_BYTES // per_edge:
        return
    avail = _available_bytes()
    if total > avail // per_edge:
        raise ValueError(f"gnncompile.neighbor_sample: hop {hop} would sample {total} edges {what}: "
                         f"{total} x {per_edge} bytes, but {avail} bytes are available")


def _check_sample_inputs(colptr, row, seeds, num_neighbors, directed, disjoint, N) -> None:
    op = "gnncompile.neighbor_sample"
    if any(t.dtype != torch.int64 for t in (colptr, row, seeds)):
        raise TypeError(f"{op}: colptr, row and seeds must be int64")
    if colptr.dim() != 1 or colptr.numel() < 1 or row.dim() != 1 or seeds.dim() != 1:
        raise ValueError(f"{op}: colptr (num_nodes + 1 entries), row and seeds must be 1-D")
    if any(k < -1 for k in num_neighbors):
        raise ValueError(f"{op}: num_neighbors entries must be >= 0, or -1 for all")
    if disjoint and not directed:
        raise ValueError(f"{op}: directed=False (the induced subgraph) is not supported with disjoint=True")
    bad = [(i, v) for i, v in enumerate(seeds.tolist()) if not 0 <= v < N]
    if bad:
        raise IndexError(f"{op}: seed node {bad[0][1]} (position {bad[0][0]}) is out of range for a "
                         f"graph of {N} nodes")


def neighbor_sample(colptr, row, seeds, num_neighbors: Sequence[int], replace: bool, directed: bool,
                    disjoint: bool, seed: int, perm: Optional[torch.Tensor] = None):
    N = colptr.numel() - 1
    if row.dim() == 2:  # (source, edge id) pairs
        if perm is not None or row.dtype != torch.int32 or row.size(1) != 2:
            raise ValueError("gnncompile.neighbor_sample: pairs must be int32 [E, 2], without perm")
        row, perm = row[:, 0].long(), row[:, 1].long()
    _check_sample_inputs(colptr, row, seeds, num_neighbors, directed, disjoint, N)
    cp, rw = colptr.tolist(), row.tolist()
    node = seeds.tolist()
    batch = list(range(len(node))) if disjoint else []
    mapping: dict = {}
    for i, v in enumerate(node):
        mapping.setdefault((i if disjoint else 0, v), i)
    out_row, out_col, out_edge, n_nodes, n_edges = [], [], [], [len(node)], []
    per_edge = 8 * (5 + (perm is not None) + bool(disjoint))  # bytes_per_edge of the native op
    begin = 0
    for hop, k in enumerate(num_neighbors):
        end, count = len(node), 0
        total = sum(_draw_count(cp[node[d] + 1] - cp[node[d]], k, replace) for d in range(begin, end))
        _check_hop_fits(hop, k, replace, end - begin, total, per_edge)
        for dst in range(begin, end):
            b = cp[node[dst]]
            tree = batch[dst] if disjoint else 0
            for off in _draw_offsets(_NodeStream(seed, hop, dst), cp[node[dst] + 1] - b, k, replace):
                u = rw[b + off]
                if (tree, u) not in mapping:
                    mapping[(tree, u)] = len(node)
                    node.append(u)
                    if disjoint:
                        batch.append(tree)
                out_row.append(mapping[(tree, u)])
                out_col.append(dst)
                out_edge.append(b + off)
                count += 1
        n_edges.append(count)
        n_nodes.append(len(node) - end)
        begin = end
    if not directed:
        out_row, out_col, out_edge = [], [], []
        for i, v in enumerate(node):
            for p in range(cp[v], cp[v + 1]):
                if (0, rw[p]) in mapping:
                    out_row.append(mapping[(0, rw[p])])
                    out_col.append(i)
                    out_edge.append(p)
        n_edges = [len(out_edge)]
    if perm is not None:
        if perm.dtype != torch.int64 or perm.dim() != 1 or perm.numel() != row.numel():
            raise ValueError("gnncompile.neighbor_sample: perm must be int64 with one entry per slot of row")
        out_edge = perm[torch.tensor(out_edge, dtype=torch.long)].tolist()
    return tuple(torch.tensor(x, dtype=torch.long) for x in
                 (node, out_row, out_col, out_edge, batch, n_nodes, n_edges))


def edge_type_seed(seed: int, t: int) -> int:
    """The seed of edge type ``t``'s streams in :func:`hetero_neighbor_sample`."""
    return _mix64((seed & _M64) ^ (((t + 1) * 0xD6E8FEB86659FD93) & _M64)) >> 1


def hetero_neighbor_sample(colptrs, rows, perms, edge_src: Sequence[int], edge_dst: Sequence[int],
                           num_nodes: Sequence[int], seeds, input_type: int, num_neighbors: Sequence[int],
                           num_hops: int, replace: bool, seed: int):
    """Heterogeneous sampling, as native/cpu/neighbor_sample.cpp (hetero_neighbor_sample_cpu)
    bit for bit: hop ``h`` takes the edge types in order; the nodes of an edge type's destination
    type added by hop ``h - 1`` (hop 0: the seeds, of ``input_type``) draw
    ``num_neighbors[t * num_hops + h]`` of their in-edges of type ``t`` with the streams of
    ``edge_type_seed(seed, t)``; new sources join their type's list in order of first appearance."""
    op = "gnncompile.hetero_neighbor_sample"
    T, NT = len(colptrs), len(num_nodes)
    if not (len(rows) == len(perms) == len(edge_src) == len(edge_dst) == T):
        raise ValueError(f"{op}: colptrs, rows, perms, edge_src and edge_dst need one entry per edge type")
    if num_hops < 0 or len(num_neighbors) != T * num_hops:
        raise ValueError(f"{op}: num_neighbors must hold num_hops entries per edge type")
    if not 0 <= input_type < NT:
        raise ValueError(f"{op}: input_type {input_type} is not a node type")
    graphs = []
    for t in range(T):
        row, perm = rows[t], perms[t]
        if row.dim() == 2:
            if perm is not None or row.dtype != torch.int32 or row.size(1) != 2:
                raise ValueError(f"{op}: pairs must be int32 [E, 2], without perm")
            row, perm = row[:, 0].long(), row[:, 1].long()
        _check_sample_inputs(colptrs[t], row, torch.empty(0, dtype=torch.long),
                             num_neighbors[t * num_hops:(t + 1) * num_hops], True, False, 0)
        if colptrs[t].numel() != num_nodes[edge_dst[t]] + 1:
            raise ValueError(f"{op}: the colptr of edge type {t} has {colptrs[t].numel()} entries for "
                             f"{num_nodes[edge_dst[t]]} destination nodes")
        graphs.append((colptrs[t].tolist(), row.tolist(), None if perm is None else perm.tolist()))
    node = [[] for _ in range(NT)]
    node[input_type] = seeds.tolist()
    for i, v in enumerate(node[input_type]):
        if not 0 <= v < num_nodes[input_type]:
            raise IndexError(f"{op}: seed node {v} (position {i}) is out of range for "
                             f"{num_nodes[input_type]} nodes of the input type")
    mapping = [dict() for _ in range(NT)]
    for i, v in enumerate(node[input_type]):
        mapping[input_type].setdefault(v, i)
    out = [([], [], []) for _ in range(T)]
    n_nodes = [[0] * (num_hops + 1) for _ in range(NT)]
    n_nodes[input_type][0] = len(node[input_type])
    n_edges = [[0] * num_hops for _ in range(T)]
    begin = [0] * NT
    for hop in range(num_hops):
        end = [len(v) for v in node]
        for t in range(T):
            cp, rw, pm = graphs[t]
            src, dst, k = edge_src[t], edge_dst[t], num_neighbors[t * num_hops + hop]
            total = sum(_draw_count(cp[node[dst][d] + 1] - cp[node[dst][d]], k, replace) for d in range(begin[dst], end[dst]))
            _check_hop_fits(hop, k, replace, end[dst] - begin[dst], total, 8 * (5 + (pm is not None)))
            stream_seed = edge_type_seed(seed, t)
            o_row, o_col, o_edge = out[t]
            for d in range(begin[dst], end[dst]):
                b = cp[node[dst][d]]
                for off in _draw_offsets(_NodeStream(stream_seed, hop, d), cp[node[dst][d] + 1] - b, k, replace):
                    u = rw[b + off]
                    if not 0 <= u < num_nodes[src]:
                        raise IndexError(f"{op}: row of edge type {t} holds node {u} at slot {b + off}, out of "
                                         f"range for {num_nodes[src]} nodes")
                    if u not in mapping[src]:
                        mapping[src][u] = len(node[src])
                        node[src].append(u)
                    o_row.append(mapping[src][u])
                    o_col.append(d)
                    o_edge.append(b + off if pm is None else pm[b + off])
            n_edges[t][hop] = len(o_edge) - sum(n_edges[t][:hop])
        for n in range(NT):
            n_nodes[n][hop + 1] = len(node[n]) - end[n]
            begin[n] = end[n]
    long = lambda x: torch.tensor(x, dtype=torch.long)  # noqa: E731
    return ([long(v) for v in node], [long(o[0]) for o in out], [long(o[1]) for o in out],
            [long(o[2]) for o in out], long(n_nodes).reshape(NT, num_hops + 1), long(n_edges).reshape(T, num_hops))


# ----------------------------------------------------------------------------- dense_attention
DENSE_MAX_HEAD_DIM = 64  # native/cpu/dense_attention_core.h, kDenseMaxHeadDim


def _check_dense_attention(q, k, v, key_padding_mask, scale, op: str):
    """The checks of native/cpu/dense_attention.cpp, with its messages."""
    if q.dim() != 4 or k.dim() != 4 or v.dim() != 4:
        raise ValueError(f"{op}: q, k and v must be [B, H, L, D] tensors, got {list(q.shape)}, {list(k.shape)}, "
                         f"{list(v.shape)}")
    if not q.dtype == k.dtype == v.dtype:
        raise ValueError(f"{op}: q, k and v must share one dtype, got {q.dtype}, {k.dtype}, {v.dtype}")
    if q.dtype not in (torch.float32, torch.float64):
        raise ValueError(f"{op}: supports float32 and float64, got {q.dtype}")
    if k.shape != v.shape:
        raise ValueError(f"{op}: k and v must have one shape, got {list(k.shape)} and {list(v.shape)}")
    if q.shape[0] != k.shape[0] or q.shape[1] != k.shape[1] or q.shape[3] != k.shape[3]:
        raise ValueError(f"{op}: q [B, H, L, D] and k [B, H, S, D] disagree: {list(q.shape)} and {list(k.shape)}")
    if q.shape[3] > DENSE_MAX_HEAD_DIM:
        raise ValueError(f"{op}: head dim D must be at most {DENSE_MAX_HEAD_DIM}, got {q.shape[3]}")
    if not math.isfinite(scale):
        raise ValueError(f"{op}: scale must be finite, got {scale}")
    if key_padding_mask is not None:
        if key_padding_mask.dtype not in (torch.bool, q.dtype):
            raise ValueError(f"{op}: key_padding_mask must be bool (true: ignore the key) or q's dtype (added to "
                             f"the logits), got {key_padding_mask.dtype}")
        if key_padding_mask.dim() != 2 or tuple(key_padding_mask.shape) != (k.shape[0], k.shape[2]):
            raise ValueError(f"{op}: key_padding_mask must be [B, S] = [{k.shape[0]}, {k.shape[2]}], got "
                             f"{list(key_padding_mask.shape)}")


def _dense_probs(q, k, key_padding_mask, scale, lse=None):
    """The masked, scaled logits' softmax (rows whose keys are all masked: 0) and its logsumexp."""
    s = torch.matmul(q, k.transpose(-1, -2)) * scale
    if key_padding_mask is not None and key_padding_mask.dtype == torch.bool:
        s = s.masked_fill(key_padding_mask[:, None, None, :], float("-inf"))
    elif key_padding_mask is not None:
        s = s + key_padding_mask[:, None, None, :]
    if lse is None:
        lse = torch.logsumexp(s, -1)
    p = torch.exp(s - lse.unsqueeze(-1))
    return torch.where(torch.isinf(lse).unsqueeze(-1) & (lse.unsqueeze(-1) < 0), torch.zeros_like(p), p), lse


def dense_attention(q, k, v, key_padding_mask, scale: float, knobs: Sequence[int] = ()):
    """Scaled dot-product attention over [B, H, L, D] with a key padding mask [B, S] (bool, true:
    the key is ignored; or float, added to the logits), as native/cpu/dense_attention_core.h: out [B, H, L, D] and the logsumexp of
    each row's logits [B, H, L] (-inf, and out 0, where every key is masked)."""
    _check_dense_attention(q, k, v, key_padding_mask, scale, "gnncompile.dense_attention")
    p, lse = _dense_probs(q, k, key_padding_mask, scale)
    return torch.matmul(p, v).contiguous(), lse.contiguous()


def dense_attention_backward(q, k, v, key_padding_mask, scale: float, out, lse, grad, knobs: Sequence[int] = ()):
    """The gradients of :func:`dense_attention` for q, k and v, the probabilities recomputed from
    the saved logsumexp."""
    _check_dense_attention(q, k, v, key_padding_mask, scale, "gnncompile.dense_attention_backward")
    p, _ = _dense_probs(q, k, key_padding_mask, scale, lse)
    dp = torch.matmul(grad, v.transpose(-1, -2))
    ds = p * (dp - (grad * out).sum(-1, keepdim=True)) * scale
    return (torch.matmul(ds, k).contiguous(), torch.matmul(ds.transpose(-1, -2), q).contiguous(),
            torch.matmul(p.transpose(-1, -2), grad).contiguous())
