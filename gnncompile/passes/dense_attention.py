"""Part of phase 5 (rewrite): dense multi-head attention (``nn.MultiheadAttention``, GPSConv's
global attention over ``to_dense_batch``'s padded batch) on ``gnncompile::dense_attention``.

Dynamo keeps ``nn.MultiheadAttention``'s attention as one call of
``F.multi_head_attention_forward`` (in training and in eval). Where the call computes what
:func:`gnncompile.ops.dense.mha_forward` computes exactly, :func:`fuse_dense_attention` replaces
it with a call of that function: the projections as torch writes them, the scaled dot-product
attention by ``gnncompile::dense_attention`` (native/cpu/dense_attention_core.h: only the keys
the padding mask keeps are read; measured 1.5x torch's fused attention, forward and backward,
at GPSConv's head dim 8, benchmarks/results/dense_attention.md). It does so when all of these
hold, and otherwise leaves the call as written with the reason in the report (explain):

* the attention weights are not returned (``need_weights=False``, as GPSConv asks);
* no ``attn_mask``, no ``is_causal``, no ``bias_k`` / ``bias_v``, no ``add_zero_attn``, no
  ``static_k`` / ``static_v``; the key padding mask, if any, is boolean or a float mask of the
  inputs' dtype (``nn.MultiheadAttention`` turns a boolean one into 0 / -inf before the call:
  the op skips the -inf keys and adds the other values to the logits, as torch does);
* no attention dropout while training (``dropout_p == 0`` or ``training=False``);
* batched float32 / float64 inputs on the CPU (the op has no CUDA kernel: on CUDA torch's
  fused attention stays);
* head dim (embed_dim / num_heads) at most :data:`MAX_HEAD_DIM`.

Settings: ``choices['attention'] = 'chain'`` leaves it, as it leaves the graph attentions.

GPSConv: under the full dynamic capture, ``to_dense_batch``'s padded length is an unbacked size;
torch's attention compares it with 1 (a data-dependent guard), so Dynamo breaks the graph at the
call and runs it as written, outside any graph this pass sees. A module of
:func:`gnncompile.compile` then compiles the model again with scalar reads left to eager
(``capture_dynamic='outputs'``, ``CompiledModule._capture_switch``): the graph breaks at
``to_dense_batch``'s read and the call is rewritten. (Dynamo refuses a substitution of the call:
it is one of torch's in-graph functions.)
"""
from __future__ import annotations

import inspect
from typing import List

import torch
import torch.nn.functional as F
from torch.fx import Node

from ..ops import targets
from .canonical import fake_tensor, layer_of
from .report import Fused, PassReport, Unfused

#: The largest head dim rewritten. The op runs up to 64, but measured against torch's fused
#: attention (forward + backward, B 8, H 4, L 260, 2 threads, AMD EPYC Zen 2,
#: benchmarks/results/dense_attention.md) it wins at D 4 and 8 (1.48x, 1.50x) and loses from 16 up
#: (0.89x at 16, 0.62x at 32, 0.48x at 64).
MAX_HEAD_DIM = 8

_SIGNATURE = inspect.signature(F.multi_head_attention_forward)


class _Skip(Exception):
    pass


def _check(n: Node) -> dict:
    """The call's arguments when the rewrite computes what it computes; raises _Skip(reason)."""
    try:
        a = _SIGNATURE.bind(*n.args, **n.kwargs)
    except TypeError as exc:
        raise _Skip(f"arguments not understood ({exc})") from None
    a.apply_defaults()
    a = a.arguments
    if a["need_weights"] is not False:
        raise _Skip("the attention weights are returned (need_weights=True); dense_attention does not compute them")
    for name in ("attn_mask", "bias_k", "bias_v", "static_k", "static_v"):
        if a[name] is not None:
            raise _Skip(f"{name} given; dense_attention takes a key padding mask only")
    if a["is_causal"] is not False:
        raise _Skip("is_causal; dense_attention has no causal mask")
    if a["add_zero_attn"] is not False:
        raise _Skip("add_zero_attn; not supported")
    p, training = a["dropout_p"], a["training"]
    if not isinstance(p, (int, float)) or not isinstance(training, bool):
        raise _Skip("dropout_p or training is not a constant")
    if p > 0 and training:
        raise _Skip(f"attention dropout in training (p={p}); dense_attention has no dropout")
    if not isinstance(a["num_heads"], int) or not isinstance(a["embed_dim_to_check"], int):
        raise _Skip("num_heads or embed_dim is not a constant")
    q, k, v = (fake_tensor(a[x]) for x in ("query", "key", "value"))
    if q is None or k is None or v is None:
        raise _Skip("query, key or value is not a tensor of the graph")
    if q.dim() != 3:
        raise _Skip("unbatched input (query is not [L, B, E])")
    if q.device.type != "cpu":
        raise _Skip(f"on {q.device.type}: gnncompile::dense_attention has a CPU kernel only "
                    f"(torch's fused attention stays)")
    if q.dtype not in (torch.float32, torch.float64) or not q.dtype == k.dtype == v.dtype:
        raise _Skip(f"dtype {q.dtype}: dense_attention runs float32 and float64")
    heads, embed = a["num_heads"], a["embed_dim_to_check"]
    if heads <= 0 or embed % heads:
        raise _Skip("embed_dim is not a multiple of num_heads")
    if embed // heads > MAX_HEAD_DIM:
        raise _Skip(f"head dim {embed // heads} > {MAX_HEAD_DIM}: torch's fused attention is the faster there")
    kpm = a["key_padding_mask"]
    if kpm is not None:
        m = fake_tensor(kpm)
        if m is None or m.dim() != 2 or m.dtype not in (torch.bool, q.dtype):
            raise _Skip("the key padding mask is neither boolean nor a [B, S] float mask of the inputs' dtype")
    if a["use_separate_proj_weight"] is not True and a["in_proj_weight"] is None:
        raise _Skip("no in_proj_weight")
    return a


def fuse_dense_attention(graph, report: PassReport) -> int:
    """Every ``F.multi_head_attention_forward`` call of ``graph`` that :func:`_check` accepts,
    replaced by :func:`gnncompile.ops.dense.mha_forward`; the others reported as unfused with
    the reason. Returns how many were replaced."""
    done = 0
    for n in [n for n in graph.nodes if n.op == "call_function" and n.target is F.multi_head_attention_forward]:
        try:
            a = _check(n)
        except _Skip as why:
            report.unfused.append(Unfused("multi_head_attention", layer_of(n), str(why), n.name))
            continue
        sep = a["use_separate_proj_weight"] is True
        with graph.inserting_before(n):
            call = graph.call_function(targets.MHA_FORWARD, (
                a["query"], a["key"], a["value"], a["num_heads"], a["in_proj_weight"], a["in_proj_bias"],
                a["out_proj_weight"], a["out_proj_bias"], a["key_padding_mask"],
                a["q_proj_weight"] if sep else None, a["k_proj_weight"] if sep else None,
                a["v_proj_weight"] if sep else None))
        call.meta.update(n.meta)
        n.replace_all_uses_with(call)
        graph.erase_node(n)
        head_dim = a["embed_dim_to_check"] // a["num_heads"]
        report.fused.append(Fused("dense_attention", "softmax", layer_of(call), node=call.name,
                                  detail=f"{a['num_heads']} heads of {head_dim}"
                                  + (", key padding mask" if a["key_padding_mask"] is not None else "")))
        done += 1
    return done


__all__ = ["fuse_dense_attention", "MAX_HEAD_DIM"]
