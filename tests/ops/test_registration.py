"""gnncompile.ops.registration.register_autograd: torch.library.register_autograd's contract
(setup_context sees every argument, the dropped defaults put back; backward's gradients; tensor
lists; no Function where nothing needs a gradient) with the per-call defaults read once."""
from __future__ import annotations

import pytest
import torch

from gnncompile.ops import registration

_lib = torch.library.Library("gnncompile_regtest", "DEF")
_lib.define("scale(Tensor x, float a=2.0, Tensor? y=None, int[] knobs=[]) -> Tensor")
_lib.define("scale_list(Tensor[] xs, float a=3.0) -> Tensor")
_lib.impl("scale", lambda x, a=2.0, y=None, knobs=(): x * a + (0 if y is None else y), "CompositeExplicitAutograd")
_lib.impl("scale_list", lambda xs, a=3.0: sum(x * a for x in xs), "CompositeExplicitAutograd")
_lib._register_fake("scale", lambda x, a=2.0, y=None, knobs=(): torch.empty_like(x))
_lib._register_fake("scale_list", lambda xs, a=3.0: torch.empty_like(xs[0]))
SEEN = []


def _setup(ctx, inputs, output):
    SEEN.append(tuple(inputs))
    ctx.a, ctx.has_y = inputs[1], inputs[2] is not None


def _backward(ctx, g):
    return g * ctx.a, None, (g if ctx.has_y else None), None


def _setup_list(ctx, inputs, output):
    SEEN.append(tuple(inputs))
    ctx.a, ctx.n = inputs[1], len(inputs[0])


def _backward_list(ctx, g):
    return [g * ctx.a] * ctx.n, None


registration.register_autograd("gnncompile_regtest::scale", _backward, setup_context=_setup)
registration.register_autograd("gnncompile_regtest::scale_list", _backward_list, setup_context=_setup_list)


def test_kernel_is_registered_fast():
    if registration._internals() is None:
        pytest.skip("torch internals moved: torch.library.register_autograd is used as it is")
    assert registration._libs.get("gnncompile_regtest") is not None


def test_defaults_put_back_and_gradients():
    x = torch.randn(5, dtype=torch.float64, requires_grad=True)
    y = torch.randn(5, dtype=torch.float64, requires_grad=True)
    SEEN.clear()
    out = torch.ops.gnncompile_regtest.scale(x)  # a, y and knobs dropped: their defaults
    assert SEEN[-1][1:] == (2.0, None, [])
    assert type(out.grad_fn).__name__ == "GeneratedBackwardFor_gnncompile_regtest_scale_defaultBackward"
    (gx,) = torch.autograd.grad(out.sum(), x)
    torch.testing.assert_close(gx, torch.full_like(x, 2.0))
    assert torch.autograd.gradcheck(lambda x, y: torch.ops.gnncompile_regtest.scale(x, 0.5, y), (x, y))
    assert SEEN[-1][1] == 0.5 and SEEN[-1][2] is not None


def test_no_grad_runs_without_a_function():
    x = torch.randn(4, requires_grad=True)
    SEEN.clear()
    with torch.no_grad():
        out = torch.ops.gnncompile_regtest.scale(x, 3.0)
    assert out.grad_fn is None and not SEEN
    torch.testing.assert_close(out, x.detach() * 3.0)
    out = torch.ops.gnncompile_regtest.scale(x.detach(), 3.0)  # nothing requires grad
    assert out.grad_fn is None and not SEEN


def test_tensor_lists():
    xs = [torch.randn(3, dtype=torch.float64, requires_grad=True) for _ in range(2)]
    SEEN.clear()
    # (a not at its default: the dispatcher would drop it, and a tensor-list backward must then
    # return the structure of the arguments passed, as with torch's own kernel)
    out = torch.ops.gnncompile_regtest.scale_list(xs, 2.5)
    assert SEEN[-1][1] == 2.5 and len(SEEN[-1][0]) == 2
    grads = torch.autograd.grad(out.sum(), xs)
    for g in grads:
        torch.testing.assert_close(g, torch.full_like(g, 2.5))
    assert torch.autograd.gradcheck(lambda a, b: torch.ops.gnncompile_regtest.scale_list([a, b], 1.5), tuple(xs))


def test_opcheck():
    x = torch.randn(4, 3, requires_grad=True)
    torch.library.opcheck(torch.ops.gnncompile_regtest.scale.default, (x, 2.0, None, []))
    torch.library.opcheck(torch.ops.gnncompile_regtest.scale_list.default, ([x, x.detach().clone()], 2.5))


def test_out_variants_found_without_the_out_tag(monkeypatch):
    """torch 2.11 has no ``torch.Tag.out`` (importing gnncompile failed there on a GPU machine):
    out= overloads are still told apart by their schema's out arguments."""
    assert registration._is_out_variant(torch.ops.aten.add.out)
    assert not registration._is_out_variant(torch.ops.aten.add.Tensor)

    class _Tags:  # torch.Tag as torch 2.11 has it: no ``out``
        pass

    monkeypatch.setattr(torch, "Tag", _Tags)
    assert registration._is_out_variant(torch.ops.aten.add.out)
    assert not registration._is_out_variant(torch.ops.aten.add.Tensor)
    assert not registration._is_out_variant(torch.ops.gnncompile.spmm.default)


def test_tensor_lists_without_pytree(monkeypatch):
    """A tensor-list op's forward and backward splice its lists by the schema, not by torch's
    pytree walk (``supports_tensorlist``: about 25 us a call for message_reduce, at every layer of
    every training step); gradients and the arguments setup_context sees are unchanged."""
    if registration._internals() is None:
        pytest.skip("torch internals moved: torch.library.register_autograd is used as it is")
    import torch.utils._pytree as pytree

    xs = [torch.randn(3, dtype=torch.float64, requires_grad=True) for _ in range(3)]

    def walked(*a, **k):
        raise AssertionError("pytree walked the arguments")

    monkeypatch.setattr(pytree, "tree_flatten", walked)
    monkeypatch.setattr(pytree, "tree_unflatten", walked)
    SEEN.clear()
    out = torch.ops.gnncompile_regtest.scale_list(xs, 2.5)
    assert len(SEEN[-1][0]) == 3 and all(a is b for a, b in zip(SEEN[-1][0], xs)) and SEEN[-1][1] == 2.5
    grads = torch.autograd.grad(out.sum(), xs)
    for g in grads:
        torch.testing.assert_close(g, torch.full_like(g, 2.5))


def test_tensor_list_needs_input_grad_and_partial_grads():
    """``ctx.needs_input_grad`` holds a list for a tensor-list argument; a backward may give None
    for a whole list; a list of the wrong length is a clear error."""
    seen, mode = [], ["all"]

    def setup(ctx, inputs, output):
        ctx.n = len(inputs[0])

    def backward(ctx, g):
        seen.append(ctx.needs_input_grad)
        if mode[0] == "none":
            return None, None
        if mode[0] == "short":
            return [g], None
        return [g * 2] * ctx.n, None

    lib = torch.library.Library("gnncompile_regtest2", "DEF")
    lib.define("twice(Tensor[] xs, float a=3.0) -> Tensor")
    lib.impl("twice", lambda xs, a=3.0: sum(x * 2 for x in xs), "CompositeExplicitAutograd")
    registration.register_autograd("gnncompile_regtest2::twice", backward, setup_context=setup)
    x, y = torch.randn(2, requires_grad=True), torch.randn(2)
    for mode[0] in ("all", "none", "short"):
        out = torch.ops.gnncompile_regtest2.twice([x, y], 2.0)
        if mode[0] == "short":
            with pytest.raises(RuntimeError, match="gradients for argument 0"):
                torch.autograd.grad(out.sum(), x)
            continue
        (gx,) = torch.autograd.grad(out.sum(), x, allow_unused=True)
        if mode[0] == "all":
            torch.testing.assert_close(gx, torch.full_like(x, 2.0))
            assert list(seen[-1][0]) == [True, False]
        else:
            assert gx is None
