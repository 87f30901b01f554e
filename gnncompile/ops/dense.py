"""Dense attention (graph transformers' global attention over ``to_dense_batch``'s padded
batch): :func:`mha_forward`, ``F.multi_head_attention_forward`` without the attention weights
(``need_weights=False``), its scaled dot-product attention run by ``gnncompile::dense_attention``
(native/cpu/dense_attention_core.h). :mod:`gnncompile.passes.dense_attention` puts a call of it
where a compiled graph called ``F.multi_head_attention_forward`` (``nn.MultiheadAttention``,
GPSConv's attention) in a form it computes exactly.
"""
from __future__ import annotations

import math

import torch
import torch.nn.functional as F

from . import autograd  # noqa: F401  (the op's autograd formula)
from .schemas import ops


def mha_forward(query, key, value, num_heads: int, in_proj_weight, in_proj_bias, out_proj_weight, out_proj_bias,
                key_padding_mask=None, q_proj_weight=None, k_proj_weight=None, v_proj_weight=None):
    """``F.multi_head_attention_forward(..., need_weights=False)`` for batched inputs (query
    [L, B, E], key and value [S, B, *]) with no attention mask, no bias_k / bias_v, no zero
    attention and no dropout (what the rewrite checks): the projections as torch computes them,
    the attention by ``gnncompile::dense_attention`` with the key padding mask [B, S] (bool, true:
    the key is ignored; or float, added to the logits, as nn.MultiheadAttention hands it over). Returns (output [L, B, E], None), as torch's."""
    tgt_len, bsz, embed_dim = query.shape
    src_len = key.shape[0]
    head_dim = embed_dim // num_heads
    if q_proj_weight is None:
        q, k, v = F._in_projection_packed(query, key, value, in_proj_weight, in_proj_bias)
    else:
        b_q, b_k, b_v = (None, None, None) if in_proj_bias is None else in_proj_bias.chunk(3)
        q, k, v = F._in_projection(query, key, value, q_proj_weight, k_proj_weight, v_proj_weight, b_q, b_k, b_v)
    q = q.view(tgt_len, bsz * num_heads, head_dim).transpose(0, 1).view(bsz, num_heads, tgt_len, head_dim)
    k = k.view(src_len, bsz * num_heads, head_dim).transpose(0, 1).view(bsz, num_heads, src_len, head_dim)
    v = v.view(src_len, bsz * num_heads, head_dim).transpose(0, 1).view(bsz, num_heads, src_len, head_dim)
    out, _ = ops.dense_attention(q, k, v, key_padding_mask, 1.0 / math.sqrt(head_dim), [])
    out = out.permute(2, 0, 1, 3).contiguous().view(bsz * tgt_len, embed_dim)
    out = F.linear(out, out_proj_weight, out_proj_bias)
    return out.view(tgt_len, bsz, out.size(1)), None


__all__ = ["mha_forward"]
