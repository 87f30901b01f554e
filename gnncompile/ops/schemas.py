"""The kernel ops' schemas, their fake kernels and the reference fallbacks.

The native module (:mod:`._native`) adds CPU and CUDA kernels to these schemas; the autograd
formulas are in :mod:`.autograd`, the structure ops (Python custom ops over the structure
cache) in :mod:`.structure`.

Structure tensors (``rowptr``, ``col``, ``perm``) describe a graph sorted by destination
(CSR): ``col[j]`` is the source node of CSR slot ``j`` and ``perm[j]`` its original edge id,
so per-edge tensors (weights, scores) always stay in the user's original edge order. The
optional ``*_t`` tensors are the same structure sorted by source (CSC), used by backward.
``knobs`` are the kernels' launch knobs (CPU: ``[chunks_per_thread, prefetch_distance, block_budget_kib]``,
native/cpu/glue.h, the third read by the spmm alone; CUDA:
:mod:`gnncompile.hardware.cuda_knobs`), which the rewrite takes from the model's
:class:`gnncompile.settings.Settings`; ``[]`` means the kernels' defaults.
"""
from __future__ import annotations

import torch

from . import reference

NAMESPACE = "gnncompile"

_lib = torch.library.Library(NAMESPACE, "FRAGMENT")
_lib.define(
    "build_csr(Tensor dst, Tensor src, int num_dst, int num_src) -> (Tensor rowptr, Tensor col, Tensor perm)"
)
_lib.define(
    "spmm(Tensor rowptr, Tensor col, Tensor perm, Tensor? weight, Tensor x, str reduce, int[] knobs, "
    "Tensor? rowptr_t=None, Tensor? col_t=None, Tensor? perm_t=None, bool relu_input=False) "
    "-> (Tensor out, Tensor arg)"
)
# spmm's sum plus each row's own term scaled: out[i] = sum_j x[col_j] + scale * x[i] (GINConv's
# `propagate(x) + (1 + eps) * x`, bit for bit; square structures, float32 / float64; scale a
# one-element tensor, (1 + eps)). Its backward is the same op over the transpose (ops/autograd.py).
_lib.define(
    "spmm_self(Tensor rowptr, Tensor col, Tensor perm, Tensor x, Tensor scale, int[] knobs, "
    "Tensor? rowptr_t=None, Tensor? col_t=None, Tensor? perm_t=None) -> Tensor"
)
# spmm's sum / mean over bfloat16 features xb (and a bfloat16 weight), accumulated in float32 and
# returned as float32: what the opt-in choices['precision'] = 'bf16' runs (passes/precision.py).
# x is the float32 tensor xb was cast from (xb = x.to(bfloat16)): the op is differentiated with
# respect to x (ops/autograd.py: the transposed spmm_bf16 of the gradient, float32 out), never xb.
_lib.define(
    "spmm_bf16(Tensor rowptr, Tensor col, Tensor perm, Tensor? weight, Tensor x, Tensor xb, str reduce, "
    "int[] knobs, Tensor? rowptr_t=None, Tensor? col_t=None, Tensor? perm_t=None) -> Tensor"
)
_lib.define(
    "edge_dot(Tensor rowptr, Tensor col, Tensor perm, Tensor x, Tensor g, int heads, int[] knobs) -> Tensor"
)
_lib.define("edge_softmax(Tensor rowptr, Tensor perm, Tensor scores, int[] knobs) -> Tensor")
_lib.define("gather(Tensor x, Tensor index, Tensor rowptr, Tensor perm, int[] knobs) -> Tensor")
_lib.define(
    "edge_softmax_backward(Tensor rowptr, Tensor perm, Tensor out, Tensor grad, int[] knobs) -> Tensor"
)
# The max / min backward's fast form (ops/autograd.py): each gradient goes to the winner the
# forward recorded in `arg` (a CSR slot; the other records, -1, ties and NaN, route nothing), with
# no sort and no atomics. arg_route: the gradient of the gathered rows, [num_src, *F], by one pass
# over the CSC (rowptr_t, col_t, perm_t: the CSR's transpose; CUDA needs it) or, on the CPU, over
# the records where that costs less or no CSC is given (native/cpu/arg_route_core.h), weight as
# spmm's; arg_edge_dot: the gradient of spmm's edge weight, [E, heads], by one pass over the CSR.
_lib.define(
    "arg_route(Tensor rowptr, Tensor col, Tensor perm, Tensor? weight, Tensor arg, Tensor grad, int num_src, "
    "int[] knobs, Tensor? rowptr_t=None, Tensor? col_t=None, Tensor? perm_t=None) -> Tensor"
)
_lib.define(
    "arg_edge_dot(Tensor rowptr, Tensor col, Tensor perm, Tensor x, Tensor arg, Tensor grad, int heads, "
    "int[] knobs) -> Tensor"
)
# torch's max / min gradient (ops/extremes.py) of messages computed beforehand and reduced as they
# are (a message program that loads one per-edge input: EdgeCNN's max over its MLP's output), in one
# pass per CSR row: count the messages equal to the extreme, then share the gradient among them,
# (m == y) * (g / N) per edge, ties, NaN and infinities as torch's scatter_reduce backward gives
# them. messages and the result: [E, F] in the user's edge order (through perm), or in CSR slot
# order with by_slot; out (the reduced values) and grad [M, F]; count_zeros and nan_gives_nan: the
# installed torch's rule (extremes.torch_rule). float32 / float64.
_lib.define(
    "extreme_edges_backward(Tensor rowptr, Tensor perm, Tensor messages, Tensor out, Tensor grad, bool by_slot, "
    "bool count_zeros, bool nan_gives_nan, int[] knobs) -> Tensor"
)
# Copies of a structure's tensors (any tensors: Tensor.clone each) that keep what the native code
# knows of each original (built by build_csr, or validated once: native/common/trust.h), so that
# ops need not validate the copies again: the copies the compiled path hands out (ops/structure.py,
# ops/hoisted.py).
_lib.define("clone_structure(Tensor[] tensors) -> Tensor[]")
# The CSC (by source, num_src rows) of a CSR (by destination), perm_t in original edge ids; the
# native kernel records it as valid where the CSR's perm is known (no validation at first use).
_lib.define("transpose_structure(Tensor rowptr, Tensor col, Tensor perm, int num_src) -> (Tensor, Tensor, Tensor)")
# Records a CPU structure that build_csr built in one of the PooledLoader's worker processes (in a
# slot shared with this process) as valid, as build_csr's own outputs are (native/common/trust.cpp:
# the loader's entry point, not for other callers; without the native module there is no record:
# a no-op).
_lib.define("adopt_worker_structure(Tensor rowptr, Tensor col, Tensor perm, int num_src) -> ()")
# A 64-bit content fingerprint of an index tensor (0-d int64 on its device; native/common/
# fingerprint.h): the structure cache compares it to notice edits that bypass the version counter.
_lib.define("fingerprint(Tensor index) -> Tensor")
# A per-edge tensor in CSR slot order: out[j] = a[perm[j]] (any dtype, a's first dim the edges;
# native/cpu/slot_rows.cpp, index_select elsewhere). What the message kernels read in order
# (sides slot / enc_slot) instead of through perm; made once per structure and tensor by
# gnncompile::cached_slot_rows (ops/slots.py). Its gradient goes back through perm (ops/slots.py).
_lib.define("slot_rows(Tensor a, Tensor perm) -> Tensor")
# Dropout whose mask is a counter-based function of (seed, element index): x / (1 - p) where
# kept, x * 0 elsewhere (0, or NaN for a NaN / inf, as torch's x * mask); its backward is the
# same op on the gradient (nothing stored). seed: a 0-d int64 tensor (the compiled graph draws
# it from torch's generator each call).
_lib.define("dropout(Tensor x, float p, Tensor seed) -> Tensor")

# Graph attention in one pass (native/cpu/attention_core.h; passes/attention.py fuses GATConv's
# chain into it): per CSR slot j (source col[j], edge perm[j], destination row i) the logit
# leaky_relu(a_src[col[j]] + a_dst[i] (+ a_edge[perm[j]]), negative_slope), PyG's softmax over the
# row, dropout p with the dropout op's mask of the [E, H] coefficients (seed as dropout's; None when
# p == 0), and out[i] = sum of the coefficients times x[col[j]]. x: [N, H, C]; a_src [N, H]; a_dst
# [M, H]; a_edge [E, H] in edge order. Also stats [M, 2, H] (float32, float64 for float64 x): the
# softmax's max and 1 / (sum + 1e-16) per row and head, from which the backward recomputes every
# coefficient. The CSC (rowptr_t, col_t, perm_t) is for the backward.
_lib.define(
    "attention(Tensor rowptr, Tensor col, Tensor perm, Tensor x, Tensor a_src, Tensor a_dst, Tensor? a_edge, "
    "float negative_slope, float p, Tensor? seed, int[] knobs, Tensor? rowptr_t=None, Tensor? col_t=None, "
    "Tensor? perm_t=None) -> (Tensor out, Tensor stats)"
)
_lib.define(
    "attention_backward(Tensor rowptr, Tensor col, Tensor perm, Tensor x, Tensor a_src, Tensor a_dst, "
    "Tensor? a_edge, float negative_slope, float p, Tensor? seed, Tensor out, Tensor stats, Tensor grad, "
    "int[] knobs, Tensor rowptr_t, Tensor col_t, Tensor perm_t) -> (Tensor grad_x, Tensor grad_src, "
    "Tensor grad_dst, Tensor grad_edge)"
)

# GATv2's attention in one pass (native/cpu/attention_v2_core.h; passes/attention.py fuses
# GATv2Conv's chain into it): per CSR slot j (source col[j], edge perm[j], destination row i)
# z = x_l[col[j]] + x_r[i] (+ e_term[perm[j]]), the logit sum_c att[h, c] leaky_relu(z[h, c],
# negative_slope), PyG's softmax over the row, dropout as attention's (the dropout op's mask of the
# [E, H] coefficients), out[i] = sum of the coefficients times x_l[col[j]]. x_l [N, H, C]; x_r
# [M, H, C]; att [H, C] or [1, H, C]; e_term [E, H, C] in edge order. stats [M, 2, H] as attention's.
# A CUDA kernel too (native/cuda/attention_v2_core.cuh; matched the CPU's on an H200, not timed):
# the pass keeps the chain on CUDA unless the settings opt in (choices['cuda_unverified']).
_lib.define(
    "attention_v2(Tensor rowptr, Tensor col, Tensor perm, Tensor x_l, Tensor x_r, Tensor att, Tensor? e_term, "
    "float negative_slope, float p, Tensor? seed, int[] knobs, Tensor? rowptr_t=None, Tensor? col_t=None, "
    "Tensor? perm_t=None) -> (Tensor out, Tensor stats)"
)
_lib.define(
    "attention_v2_backward(Tensor rowptr, Tensor col, Tensor perm, Tensor x_l, Tensor x_r, Tensor att, "
    "Tensor? e_term, float negative_slope, float p, Tensor? seed, Tensor out, Tensor stats, Tensor grad, "
    "int[] knobs, Tensor rowptr_t, Tensor col_t, Tensor perm_t) -> (Tensor grad_x_l, Tensor grad_x_r, "
    "Tensor grad_att, Tensor grad_e)"
)

# Dot-product (transformer) attention in one pass (native/cpu/attention_dot_core.h;
# passes/attention_dot.py fuses TransformerConv's chain into it): per CSR slot j (source col[j],
# edge perm[j], destination row i) the logit scale * (<q[i, h], k[col[j], h]> + <qe[i, h],
# edge_attr[perm[j]]>), PyG's softmax over the row, dropout as attention's (the dropout op's mask of
# the [E, H] coefficients), out[i] = sum of the coefficients times v[col[j]] and out_e[i, h] = sum
# of the coefficients times edge_attr[perm[j]]. q [M, H, C]; k, v [N, H, C]; qe [M, H, De] and
# edge_attr [E, De] (edge order) together or neither (out_e is then [M, H, 0]). TransformerConv's
# edge term lin_edge(edge_attr) (no bias) enters as qe = W_h^T q and out + W_h out_e, outside the op.
# stats [M, 2, H] as attention's. The backward's grad_edge_attr=False (edge features that need no
# gradient, as a model's input features) skips their gradient: its output is then [0, De]. A CUDA kernel too (native/cuda/attention_dot_core.cuh; matched
# the CPU's on an H200, not timed): the pass keeps the chain on CUDA unless the settings opt in
# (choices['cuda_unverified']).
_lib.define(
    "attention_dot(Tensor rowptr, Tensor col, Tensor perm, Tensor q, Tensor k, Tensor v, Tensor? qe, "
    "Tensor? edge_attr, float scale, float p, Tensor? seed, int[] knobs, Tensor? rowptr_t=None, "
    "Tensor? col_t=None, Tensor? perm_t=None) -> (Tensor out, Tensor out_e, Tensor stats)"
)
_lib.define(
    "attention_dot_backward(Tensor rowptr, Tensor col, Tensor perm, Tensor q, Tensor k, Tensor v, Tensor? qe, "
    "Tensor? edge_attr, float scale, float p, Tensor? seed, Tensor out, Tensor out_e, Tensor stats, Tensor grad, "
    "Tensor grad_e, int[] knobs, Tensor rowptr_t, Tensor col_t, Tensor perm_t, bool grad_edge_attr=True) -> "
    "(Tensor grad_q, "
    "Tensor grad_k, Tensor grad_v, Tensor grad_qe, Tensor grad_edge_attr)"
)

# Scaled dot-product attention over dense [B, H, L, D] tensors with a key padding mask [B, S] (bool,
# true: the key is ignored; or of q's dtype, added to the logits: its -inf keys are skipped), for the dense attention of graph transformers (GPSConv's
# nn.MultiheadAttention; passes/dense_attention.py): out [B, H, L, D] and the logsumexp of each
# row's scaled logits, lse [B, H, L] (q's dtype); rows whose keys are all masked give 0 (and lse
# -inf), as torch's scaled_dot_product_attention. float32 / float64, D <= 64. A CPU kernel
# (native/cpu/dense_attention_core.h); no CUDA kernel: on CUDA the pass leaves torch's attention.
_lib.define(
    "dense_attention(Tensor q, Tensor k, Tensor v, Tensor? key_padding_mask, float scale, int[] knobs) "
    "-> (Tensor out, Tensor lse)"
)
_lib.define(
    "dense_attention_backward(Tensor q, Tensor k, Tensor v, Tensor? key_padding_mask, float scale, Tensor out, "
    "Tensor lse, Tensor grad, int[] knobs) -> (Tensor grad_q, Tensor grad_k, Tensor grad_v)"
)

# Message programs (gnncompile/ops/program.py; the ops in gnncompile/ops/message.py): a per-edge
# elementwise expression over inputs read per neighbour / destination / edge / not at all
# (`sides`), reduced over each CSR row in one pass (message_reduce: sum, mean, max, min; `arg`
# as spmm's), or written per edge in the user's edge order (message_edges, column g summing
# `width / out_width` features). `csc`: the transposed structure
# (rowptr_t, col_t, perm_t) for the backward pass, or [] (then built when needed). `slot`: where
# the structure is not the CSR (a CSC in backward), the CSR slot of each of its slots, for the
# inputs stored in CSR order; None on the CSR itself. message_edges writes row j (by_slot) or perm[j].
_lib.define(
    "message_reduce(Tensor rowptr, Tensor col, Tensor perm, Tensor[] inputs, int[] sides, int[] code, "
    "float[] consts, int width, str reduce, int[] knobs, Tensor[] csc, Tensor? slot) -> (Tensor out, Tensor arg)"
)
_lib.define(
    "message_edges(Tensor rowptr, Tensor col, Tensor perm, Tensor[] inputs, int[] sides, int[] code, "
    "float[] consts, int width, int out_width, bool by_slot, int[] knobs, Tensor[] csc, Tensor? slot) -> Tensor"
)

# PyG's softmax aggregation (SoftmaxAggregation) of a program's messages m with temperature t
# ([1, Wt], Wt dividing width: one per channel or one for all): out = sum over each row's edges of
# softmax(t * m) * m, per feature, in one pass per row with an online maximum; lse = the per-row,
# per-feature log-sum-exp of t * m (0 for a row without edges), which the backward reads.
_lib.define(
    "message_softmax(Tensor rowptr, Tensor col, Tensor perm, Tensor[] inputs, int[] sides, int[] code, "
    "float[] consts, int width, Tensor t, int[] knobs, Tensor[] csc) -> (Tensor out, Tensor lse)"
)

# Several results of one program (their slots: `results`), each summed over every row: [K, M, F].
# The backward passes of message programs (no autograd of its own).
_lib.define(
    "message_sum_multi(Tensor rowptr, Tensor col, Tensor perm, Tensor[] inputs, int[] sides, int[] code, "
    "float[] consts, int[] results, int width, int[] knobs, Tensor? slot) -> Tensor"
)

# The gradients of the edge encoder at input `enc` (features a [E, D], Wt [D, W], b [1, W]:
# program.py) from a derivative program whose value per edge is the gradient of the encoder's
# values (grouped to W columns as message_edges' out_width = W), accumulated over the edges
# without its [E, W] values: (da [E, D], or [0, D] without need_features; dWt [D, W]; db [1, W]).
# The backward of message_reduce / message_edges (ops/message.py; no autograd of its own).
_lib.define(
    "message_encoder_grad(Tensor rowptr, Tensor col, Tensor perm, Tensor[] inputs, int[] sides, int[] code, "
    "float[] consts, int width, int enc, bool need_features, int[] knobs) -> (Tensor, Tensor, Tensor)"
)

# The pooled loader's collation (gnncompile.data): copies of whole graphs into a batch buffer.
_lib.define("collate_rows(Tensor values, Tensor starts, Tensor sizes, Tensor idx, Tensor(a!) out, "
            "Tensor? incs=None) -> ()")
_lib.define("segment_ids(Tensor sizes, Tensor idx, Tensor(a!) out, Tensor(b!) ptr) -> ()")

# Multi-hop neighbor sampling from a CSC (colptr over destinations, row = sources) for mini-batch
# training (gnncompile.data.NeighborSampler): seeds first, then each hop's new nodes; row/col are
# local indices (source, destination) of the sampled edges, edge their CSC slots (their edge ids
# perm[slot] when perm is given); batch is the
# seed of each node's tree (disjoint) or empty. Not traceable: a loader step, not a model op.
_lib.define("neighbor_sample(Tensor colptr, Tensor row, Tensor seeds, int[] num_neighbors, bool replace, "
            "bool directed, bool disjoint, int seed, Tensor? perm=None) -> (Tensor node, Tensor row, Tensor col, Tensor edge, "
            "Tensor batch, Tensor num_sampled_nodes, Tensor num_sampled_edges)")
# The same on a heterogeneous graph: one CSC per edge type (its destination type's nodes ->
# sources of its source type), num_neighbors[t * num_hops + h] per edge type t and hop h; node
# per node type, row/col/edge per edge type, num_sampled_nodes [node types, num_hops + 1] and
# num_sampled_edges [edge types, num_hops]. Directed, not disjoint.
_lib.define("hetero_neighbor_sample(Tensor[] colptrs, Tensor[] rows, Tensor?[] perms, int[] edge_src, "
            "int[] edge_dst, int[] num_nodes, Tensor seeds, int input_type, int[] num_neighbors, int num_hops, "
            "bool replace, int seed) -> (Tensor[] node, Tensor[] row, Tensor[] col, Tensor[] edge, "
            "Tensor num_sampled_nodes, Tensor num_sampled_edges)")

# Kernels: the native module registers CPU (and CUDA) implementations when it loads; the
# references fill every other backend, and all of them when the native module is missing.
from . import _native  # noqa: E402,F401  (must come after the schemas are defined)

for _name in ("build_csr", "spmm", "spmm_self", "edge_dot", "edge_softmax", "edge_softmax_backward", "collate_rows",
              "segment_ids", "clone_structure", "transpose_structure", "adopt_worker_structure", "fingerprint",
              "neighbor_sample",
              "hetero_neighbor_sample", "dropout", "arg_route", "arg_edge_dot", "extreme_edges_backward", "attention", "attention_backward",
              "attention_v2", "attention_v2_backward", "attention_dot", "attention_dot_backward",
              "dense_attention", "dense_attention_backward"):
    _lib.impl(_name, getattr(reference, _name), "CompositeExplicitAutograd")

ops = torch.ops.gnncompile


def _gather_impl(x, index, rowptr, perm, knobs):
    return x.index_select(0, index)


# gather: x.index_select(0, index) whose gradient is a segment sum over a structure that groups
# the edges by `index` (the CSR when index is the destination row, the CSC when it is the source
# row): deterministic and parallel, where index_select's own backward is a serial index_add of
# the E x * gradient. The forward is plain index_select on every backend.
_lib.impl("gather", _gather_impl, "CompositeExplicitAutograd")


def _spmm_bf16_impl(rowptr, col, perm, weight, x, xb, reduce, knobs, rowptr_t=None, col_t=None, perm_t=None):
    """spmm_bf16 where no native kernel is registered: spmm over xb, then cast to float32 (the
    output rounded to bfloat16 once more than the native kernel's)."""
    if reduce not in ("sum", "mean"):
        raise ValueError(f"gnncompile.spmm_bf16: reduce must be sum or mean, got '{reduce}'")
    if x.shape != xb.shape:
        raise ValueError(f"gnncompile.spmm_bf16: x and xb must have one shape, got {tuple(x.shape)} "
                         f"and {tuple(xb.shape)}")
    return ops.spmm(rowptr, col, perm, weight, xb, reduce, knobs, rowptr_t, col_t, perm_t)[0].to(torch.float32)


_lib.impl("spmm_bf16", _spmm_bf16_impl, "CompositeExplicitAutograd")

# ----------------------------------------------------------------------------- fake kernels
@torch.library.register_fake("gnncompile::build_csr")
def _build_csr_fake(dst, src, num_dst, num_src):
    E = dst.shape[0]
    return dst.new_empty(num_dst + 1), dst.new_empty(E), dst.new_empty(E)


@torch.library.register_fake("gnncompile::spmm")
def _spmm_fake(rowptr, col, perm, weight, x, reduce, knobs, rowptr_t=None, col_t=None, perm_t=None,
               relu_input=False):
    shape = (rowptr.shape[0] - 1,) + tuple(x.shape[1:])
    out = x.new_empty(shape)
    if reduce in ("max", "min"):
        arg = x.new_empty(shape, dtype=torch.long)
    else:
        arg = x.new_empty((0,), dtype=torch.long)
    return out, arg


@torch.library.register_fake("gnncompile::spmm_self")
def _spmm_self_fake(rowptr, col, perm, x, scale, knobs, rowptr_t=None, col_t=None, perm_t=None):
    return x.new_empty((rowptr.shape[0] - 1,) + tuple(x.shape[1:]))


@torch.library.register_fake("gnncompile::spmm_bf16")
def _spmm_bf16_fake(rowptr, col, perm, weight, x, xb, reduce, knobs, rowptr_t=None, col_t=None, perm_t=None):
    return x.new_empty((rowptr.shape[0] - 1,) + tuple(x.shape[1:]), dtype=torch.float32)


@torch.library.register_fake("gnncompile::clone_structure")
def _clone_structure_fake(tensors):
    return [torch.empty_like(t) for t in tensors]


@torch.library.register_fake("gnncompile::transpose_structure")
def _transpose_structure_fake(rowptr, col, perm, num_src):
    E = col.shape[0]
    return rowptr.new_empty(num_src + 1), col.new_empty(E), perm.new_empty(E)


@torch.library.register_fake("gnncompile::dropout")
def _dropout_fake(x, p, seed):
    return torch.empty_like(x, memory_format=torch.contiguous_format)


@torch.library.register_fake("gnncompile::fingerprint")
def _fingerprint_fake(index):
    return index.new_empty((), dtype=torch.long)


@torch.library.register_fake("gnncompile::edge_dot")
def _edge_dot_fake(rowptr, col, perm, x, g, heads, knobs):
    return x.new_empty((col.shape[0], heads))


@torch.library.register_fake("gnncompile::gather")
def _gather_fake(x, index, rowptr, perm, knobs):
    return x.new_empty((index.shape[0],) + tuple(x.shape[1:]))


@torch.library.register_fake("gnncompile::edge_softmax")
def _edge_softmax_fake(rowptr, perm, scores, knobs):
    return torch.empty_like(scores, memory_format=torch.contiguous_format)


@torch.library.register_fake("gnncompile::edge_softmax_backward")
def _edge_softmax_backward_fake(rowptr, perm, out, grad, knobs):
    return torch.empty_like(out, memory_format=torch.contiguous_format)


@torch.library.register_fake("gnncompile::arg_route")
def _arg_route_fake(rowptr, col, perm, weight, arg, grad, num_src, knobs, rowptr_t=None, col_t=None, perm_t=None):
    return grad.new_empty((num_src,) + tuple(grad.shape[1:]))


@torch.library.register_fake("gnncompile::extreme_edges_backward")
def _extreme_edges_backward_fake(rowptr, perm, messages, out, grad, by_slot, count_zeros, nan_gives_nan, knobs):
    return torch.empty_like(messages, memory_format=torch.contiguous_format)


@torch.library.register_fake("gnncompile::arg_edge_dot")
def _arg_edge_dot_fake(rowptr, col, perm, x, arg, grad, heads, knobs):
    return x.new_empty((col.shape[0], heads))


def _stats_dtype(x):
    return torch.float64 if x.dtype == torch.float64 else torch.float32


@torch.library.register_fake("gnncompile::attention")
def _attention_fake(rowptr, col, perm, x, a_src, a_dst, a_edge, negative_slope, p, seed, knobs, rowptr_t=None,
                    col_t=None, perm_t=None):
    M, H = rowptr.shape[0] - 1, x.shape[1]
    return x.new_empty((M, H, x.shape[2])), x.new_empty((M, 2, H), dtype=_stats_dtype(x))


@torch.library.register_fake("gnncompile::attention_backward")
def _attention_backward_fake(rowptr, col, perm, x, a_src, a_dst, a_edge, negative_slope, p, seed, out, stats, grad,
                             knobs, rowptr_t, col_t, perm_t):
    g_edge = x.new_empty((col.shape[0] if a_edge is not None else 0, x.shape[1]))
    c = torch.contiguous_format
    return (torch.empty_like(x, memory_format=c), torch.empty_like(a_src, memory_format=c),
            torch.empty_like(a_dst, memory_format=c), g_edge)


@torch.library.register_fake("gnncompile::attention_v2")
def _attention_v2_fake(rowptr, col, perm, x_l, x_r, att, e_term, negative_slope, p, seed, knobs, rowptr_t=None,
                       col_t=None, perm_t=None):
    M, H = rowptr.shape[0] - 1, x_l.shape[1]
    return x_l.new_empty((M, H, x_l.shape[2])), x_l.new_empty((M, 2, H), dtype=_stats_dtype(x_l))


@torch.library.register_fake("gnncompile::attention_v2_backward")
def _attention_v2_backward_fake(rowptr, col, perm, x_l, x_r, att, e_term, negative_slope, p, seed, out, stats,
                                grad, knobs, rowptr_t, col_t, perm_t):
    g_e = x_l.new_empty((col.shape[0] if e_term is not None else 0, x_l.shape[1], x_l.shape[2]))
    c = torch.contiguous_format
    return (torch.empty_like(x_l, memory_format=c), torch.empty_like(x_r, memory_format=c),
            torch.empty_like(att, memory_format=c), g_e)


@torch.library.register_fake("gnncompile::attention_dot")
def _attention_dot_fake(rowptr, col, perm, q, k, v, qe, edge_attr, scale, p, seed, knobs, rowptr_t=None,
                        col_t=None, perm_t=None):
    M, H, C = rowptr.shape[0] - 1, k.shape[1], k.shape[2]
    De = edge_attr.shape[1] if edge_attr is not None else 0
    return (k.new_empty((M, H, C)), k.new_empty((M, H, De)), k.new_empty((M, 2, H), dtype=_stats_dtype(k)))


@torch.library.register_fake("gnncompile::attention_dot_backward")
def _attention_dot_backward_fake(rowptr, col, perm, q, k, v, qe, edge_attr, scale, p, seed, out, out_e, stats,
                                 grad, grad_e, knobs, rowptr_t, col_t, perm_t, grad_edge_attr=True):
    c = torch.contiguous_format
    M, H = rowptr.shape[0] - 1, k.shape[1]
    g_qe = torch.empty_like(qe, memory_format=c) if qe is not None else k.new_empty((M, H, 0))
    if edge_attr is None:
        g_ea = k.new_empty((col.shape[0], 0))
    elif not grad_edge_attr:
        g_ea = k.new_empty((0, edge_attr.shape[1]))
    else:
        g_ea = torch.empty_like(edge_attr, memory_format=c)
    return (torch.empty_like(q, memory_format=c), torch.empty_like(k, memory_format=c),
            torch.empty_like(v, memory_format=c), g_qe, g_ea)


@torch.library.register_fake("gnncompile::dense_attention")
def _dense_attention_fake(q, k, v, key_padding_mask, scale, knobs):
    B, H, L, D = q.shape
    return q.new_empty((B, H, L, D)), q.new_empty((B, H, L))


@torch.library.register_fake("gnncompile::dense_attention_backward")
def _dense_attention_backward_fake(q, k, v, key_padding_mask, scale, out, lse, grad, knobs):
    c = torch.contiguous_format
    return (torch.empty_like(q, memory_format=c), torch.empty_like(k, memory_format=c),
            torch.empty_like(v, memory_format=c))
