"""gnncompile::dense_attention (native/cpu/dense_attention_core.h): scaled dot-product attention
over [B, H, L, D] with a key padding mask; forward and gradients against torch's
scaled_dot_product_attention and against the op's reference, fully masked rows as torch's,
gradcheck in float64, opcheck, bad input."""
from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F

import gnncompile  # noqa: F401  (loads the ops)
from gnncompile.ops import reference

ops = torch.ops.gnncompile


def _inputs(B, H, L, D, S=None, dtype=torch.float32, seed=0, ragged=True):
    g = torch.Generator().manual_seed(seed)
    S = L if S is None else S
    q = torch.randn(B, H, L, D, generator=g, dtype=dtype)
    k = torch.randn(B, H, S, D, generator=g, dtype=dtype)
    v = torch.randn(B, H, S, D, generator=g, dtype=dtype)
    kpm = torch.zeros(B, S, dtype=torch.bool)
    if ragged:  # to_dense_batch's padding: batch b keeps its first S - 7 b keys, ragged lengths
        for b in range(B):
            kpm[b, max(1, S - 7 * b):] = True
    return q, k, v, kpm


def _torch_sdpa(q, k, v, kpm, scale):
    mask = None if kpm is None else ~kpm[:, None, None, :]
    return F.scaled_dot_product_attention(q, k, v, attn_mask=mask, scale=scale)


def _grads(fn, q, k, v, g):
    q, k, v = (t.detach().requires_grad_() for t in (q, k, v))
    out = fn(q, k, v)
    return (out, *torch.autograd.grad(out, (q, k, v), g))


@pytest.mark.parametrize("D", [4, 5, 8, 16, 32])
def test_forward_and_gradients_equal_torch_sdpa(native, D):
    q, k, v, kpm = _inputs(3, 2, 70, D)
    scale = 1 / math.sqrt(D)
    g = torch.randn(3, 2, 70, D, generator=torch.Generator().manual_seed(1))
    got = _grads(lambda q, k, v: ops.dense_attention(q, k, v, kpm, scale, [])[0], q, k, v, g)
    want = _grads(lambda q, k, v: _torch_sdpa(q, k, v, kpm, scale), q, k, v, g)
    for a, b in zip(got, want):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-5 * b.abs().max().item())
    # the masked keys get no gradient
    for gk in got[2:]:
        assert (gk[kpm[:, None, :, None].expand_as(gk)] == 0).all()


@pytest.mark.parametrize("masked", [True, False])
def test_cross_attention_strided_inputs_and_no_mask(native, masked):
    # q from a transposed projection (MultiheadAttention's view), S != L, mask or none
    B, H, L, S, D = 2, 3, 33, 41, 8
    base = torch.randn(L, B * H, D)
    q = base.transpose(0, 1).view(B, H, L, D)
    assert not q.is_contiguous()
    _, k, v, kpm = _inputs(B, H, S, D, seed=2)
    kpm = kpm if masked else None
    out, lse = ops.dense_attention(q, k, v, kpm, 0.3, [])
    torch.testing.assert_close(out, _torch_sdpa(q, k, v, kpm, 0.3), rtol=1e-5, atol=1e-6)
    ref_out, ref_lse = reference.dense_attention(q, k, v, kpm, 0.3)
    torch.testing.assert_close(lse, ref_lse, rtol=1e-5, atol=1e-5)


def test_a_float_mask_is_added_to_the_logits_and_its_minus_inf_keys_skipped(native):
    q, k, v, kpm = _inputs(3, 2, 40, 8, seed=6)
    fmask = torch.randn(3, 40).masked_fill(kpm, float("-inf"))
    g = torch.randn(3, 2, 40, 8)
    got = _grads(lambda q, k, v: ops.dense_attention(q, k, v, fmask, 0.3, [])[0], q, k, v, g)
    want = _grads(lambda q, k, v: F.scaled_dot_product_attention(q, k, v, attn_mask=fmask[:, None, None, :],
                                                                  scale=0.3), q, k, v, g)
    for a, b in zip(got, want):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-5 * b.abs().max().item())
    # MultiheadAttention's form of a boolean mask (0 / -inf) gives the boolean mask's result bit for bit
    zero_inf = torch.zeros(3, 40).masked_fill(kpm, float("-inf"))
    assert torch.equal(ops.dense_attention(q, k, v, zero_inf, 0.3, [])[0], ops.dense_attention(q, k, v, kpm, 0.3, [])[0])


def test_rows_whose_keys_are_all_masked_give_zero_as_torch(native):
    q, k, v, kpm = _inputs(3, 2, 20, 8)
    kpm[1] = True  # an empty graph in the padded batch
    qr, kr, vr = (t.detach().requires_grad_() for t in (q, k, v))
    out, lse = ops.dense_attention(qr, kr, vr, kpm, 0.5, [])
    want = _torch_sdpa(q, k, v, kpm, 0.5)
    assert (out[1] == 0).all() and (want[1] == 0).all()
    assert torch.isinf(lse[1]).all() and (lse[1] < 0).all()
    torch.testing.assert_close(out, want, rtol=1e-5, atol=1e-6)
    out.square().sum().backward()
    assert torch.isfinite(qr.grad).all() and (qr.grad[1] == 0).all() and (kr.grad[1] == 0).all()


def test_native_equals_reference_and_is_deterministic(native):
    q, k, v, kpm = _inputs(4, 4, 90, 16, seed=3)
    g = torch.randn(4, 4, 90, 16)
    out, lse = ops.dense_attention(q, k, v, kpm, 0.25, [])
    r_out, r_lse = reference.dense_attention(q, k, v, kpm, 0.25)
    torch.testing.assert_close(out, r_out, rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(lse, r_lse, rtol=1e-5, atol=1e-5)
    got = ops.dense_attention_backward(q, k, v, kpm, 0.25, out, lse, g, [])
    want = reference.dense_attention_backward(q, k, v, kpm, 0.25, out, lse, g)
    for a, b in zip(got, want):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-5 * b.abs().max().item())
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:  # the same bits whatever the number of threads
        out1, _ = ops.dense_attention(q, k, v, kpm, 0.25, [])
        again = ops.dense_attention_backward(q, k, v, kpm, 0.25, out, lse, g, [])
    finally:
        torch.set_num_threads(threads)
    assert torch.equal(out, out1)
    for a, b in zip(got, again):
        assert torch.equal(a, b)


def test_gradcheck_float64(native):
    q, k, v, kpm = _inputs(2, 2, 9, 5, dtype=torch.float64, seed=4)
    kpm[1, 3:] = True
    q, k, v = (t.requires_grad_() for t in (q, k, v))
    assert torch.autograd.gradcheck(lambda q, k, v: ops.dense_attention(q, k, v, kpm, 0.4, [])[0], (q, k, v))


def test_opcheck(native):
    q, k, v, kpm = _inputs(2, 2, 12, 8, seed=5)
    q, k, v = (t.requires_grad_() for t in (q, k, v))
    torch.library.opcheck(ops.dense_attention.default, (q, k, v, kpm, 0.35, []))


@pytest.mark.parametrize("case, message", [
    ("dtype", "supports float32 and float64"),
    ("mixed", "share one dtype"),
    ("dims", r"\[B, H, L, D\]"),
    ("kv", "k and v must have one shape"),
    ("heads", "disagree"),
    ("mask_dtype", "key_padding_mask must be bool"),
    ("mask_float64", "key_padding_mask must be bool"),
    ("mask_shape", r"key_padding_mask must be \[B, S\]"),
    ("big_d", "head dim D must be at most 64"),
    ("scale", "scale must be finite"),
])
def test_bad_input_raises_a_clear_error(native, case, message):
    q, k, v, kpm = _inputs(2, 2, 6, 8)
    scale = 0.5
    if case == "dtype":
        q, k, v = q.half(), k.half(), v.half()
    elif case == "mixed":
        k = k.double()
    elif case == "dims":
        q = q[0]
    elif case == "kv":
        v = v[:, :, :3]
    elif case == "heads":
        q = q[:, :1]
    elif case == "mask_dtype":
        kpm = kpm.int()
    elif case == "mask_float64":
        kpm = kpm.double()
    elif case == "mask_shape":
        kpm = kpm[:, :3]
    elif case == "big_d":
        q, k, v = (torch.randn(1, 1, 3, 65) for _ in range(3))
        kpm = None
    elif case == "scale":
        scale = float("nan")
    with pytest.raises(ValueError, match=message):
        ops.dense_attention(q, k, v, kpm, scale, [])
    with pytest.raises(ValueError, match=message):
        reference.dense_attention(q, k, v, kpm, scale)
