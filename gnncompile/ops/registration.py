"""``register_autograd``: ``torch.library.register_autograd`` for the kernel ops, with the Python
its kernel runs at every call done once, at registration.

torch's generated kernel (torch/_library/autograd.py, torch 2.13) rebuilds the op's arguments
with their defaults on every forward that records a backward (``fill_defaults``: it reads
``schema.arguments``, a fresh list of argument objects at each access, once per argument: 29 us
a call for spmm's eleven on this project's CPU, AMD EPYC Zen 4) and wraps the dispatch keys in a
dataclass. Here the defaults are read once and appended as a tuple; the kernel is otherwise
torch's: the same ``autograd.Function`` (same name, ``GeneratedBackwardFor_<ns>_<op>_<overload>``,
so profiles read as before), the same ``setup_context(ctx, inputs, output)`` / ``backward(ctx,
*grads)`` contract, below-autograd redispatch, and a forward without the Function where nothing
needs a gradient. Tensor-list arguments are spliced into the Function's arguments by the schema
(:func:`_flattener`) instead of torch's ``supports_tensorlist``, which walks them with pytree at
every forward and backward (about 25 us a call for ``message_reduce``); an op with a tensor list
among its returns keeps torch's wrapper.

Where the op has keyword-only arguments, is an out= variant, or the torch internals this relies on
are missing (another torch version), it is torch's ``register_autograd`` itself.
"""
from __future__ import annotations

from typing import Callable

import torch

_libs: dict = {}  # namespace -> the Library holding the kernels (kept alive: it owns them)


def _internals():
    try:
        from torch._library import autograd as _la

        from torch._library.utils import is_tensorlist_like_type

        return (torch._C._AutoDispatchBelowAutograd, torch._C._after_autograd_keyset, _la.supports_tensorlist,
                is_tensorlist_like_type, torch._C.is_grad_enabled, torch._C._any_requires_grad)
    except (ImportError, AttributeError):  # pragma: no cover - torch internals moved
        return None


def _is_out_variant(op) -> bool:
    """An out= overload: torch 2.13 tags it (``torch.Tag.out``, absent from torch 2.11's tags);
    every version marks its out arguments in the schema (``Argument.is_out``)."""
    out_tag = getattr(torch.Tag, "out", None)
    if out_tag is not None and out_tag in getattr(op, "tags", ()):
        return True
    return any(getattr(a, "is_out", False) for a in op._schema.arguments)


def _flattener(schema, is_tensorlist):
    """For an op with tensor-list arguments and none among its returns: (flatten, unflatten,
    flatten_grads), a schema-driven stand-in for torch's ``supports_tensorlist`` (which walks the
    arguments with pytree at every forward and backward: about 25 us a call for
    ``message_reduce``). ``flatten(args)`` splices each tensor list into the flat arguments
    ``autograd.Function.apply`` takes and returns them with the layout (the lists' lengths, the
    number of arguments passed); ``unflatten(flat, layout)`` rebuilds the arguments (each list a
    list again); ``flatten_grads(result, layout)`` turns the backward's gradients, given per
    argument (a list or None for a tensor list, None for anything not a tensor), into one per
    flat argument."""
    lists = frozenset(i for i, a in enumerate(schema.arguments) if is_tensorlist(a.type))
    if not lists or any(is_tensorlist(r.type) for r in schema.returns):
        return None

    def flatten(args):
        flat, lens = [], []
        for i, a in enumerate(args):
            if i in lists:
                flat.extend(a)
                lens.append(len(a))
            else:
                flat.append(a)
        return flat, (tuple(lens), len(args))

    def unflatten(flat, layout):
        lens, n = layout
        out, j, k = [], 0, 0
        for i in range(n):
            if i in lists:
                out.append(list(flat[j:j + lens[k]]))
                j += lens[k]
                k += 1
            else:
                out.append(flat[j])
                j += 1
        return tuple(out)

    def flatten_grads(result, layout):
        lens, n = layout
        if not isinstance(result, tuple):
            result = (result,)
        if len(result) < n:
            raise RuntimeError(f"{schema.name}: the backward returned {len(result)} gradients for {n} arguments")
        flat, k = [], 0
        for i in range(n):
            g = result[i]
            if i in lists:
                if g is None:
                    flat.extend([None] * lens[k])
                elif len(g) != lens[k]:
                    raise RuntimeError(f"{schema.name}: the backward returned {len(g)} gradients for "
                                       f"argument {i}, a list of {lens[k]} tensors")
                else:
                    flat.extend(g)
                k += 1
            else:  # (an empty int or float list's "gradient" may come as [])
                flat.append(g if isinstance(g, torch.Tensor) else None)
        return flat

    return flatten, unflatten, flatten_grads


def autograd_kernel(op, backward: Callable, setup_context: Callable) -> Callable:
    """The Autograd-key kernel (called with the dispatch key set first) of OpOverload ``op``."""
    below, after, supports_tensorlist, is_tensorlist, grad_enabled, any_requires_grad = _internals()
    schema = op._schema
    defaults = tuple(a.default_value for a in schema.arguments)
    n_args = len(defaults)
    name = f"GeneratedBackwardFor_{op._namespace}_{op._opname}_{op._overloadname}"
    lists = _flattener(schema, is_tensorlist)

    def run(ctx, keyset, args):
        with below():
            result = op.redispatch(keyset & after, *args)
            # the dispatcher drops trailing arguments equal to their defaults: put them back
            if len(args) < n_args:
                args = args + defaults[len(args):]
            setup_context(ctx=ctx, inputs=args, output=result)
        return result

    if lists is not None:  # tensor lists spliced into the Function's arguments (_flattener)
        flatten, unflatten, flatten_grads = lists

        def forward(ctx, *flat):
            keyset, layout = flat[-1]
            ctx._gnc_layout = layout
            return run(ctx, keyset, unflatten(flat[:-1], layout))

        def backward_(ctx, *grads):
            layout, prev = ctx._gnc_layout, ctx.needs_input_grad
            try:
                ctx.needs_input_grad = unflatten(prev[:-1], layout)  # (not the dispatch keys')
                result = backward(ctx, *grads)
            finally:
                ctx.needs_input_grad = prev
            return (*flatten_grads(result, layout), None)

        generated = type(name, (torch.autograd.Function,),
                         {"forward": staticmethod(forward), "backward": staticmethod(backward_)})
        apply = generated.apply

        def kernel(keyset, *args):
            if grad_enabled() and any_requires_grad(*args):
                flat, layout = flatten(args)
                return apply(*flat, (keyset, layout))
            with below():
                return op.redispatch(keyset & after, *args)

        kernel.generated = generated
        return kernel

    def forward(ctx, *args):
        return run(ctx, args[-1], args[:-1])

    def backward_(ctx, *grads):
        prev = ctx.needs_input_grad
        try:
            ctx.needs_input_grad = prev[:-1]  # (not the dispatch keys')
            result = backward(ctx, *grads)
        finally:
            ctx.needs_input_grad = prev
        if isinstance(result, tuple):
            return (*result, None)
        return result, None

    generated = type(name, (torch.autograd.Function,),
                     {"forward": staticmethod(forward), "backward": staticmethod(backward_)})
    if any(is_tensorlist(a.type) for a in (*schema.arguments, *schema.returns)):
        generated = supports_tensorlist(generated)  # (a tensor list among the returns)
    apply = generated.apply

    def kernel(keyset, *args):
        if grad_enabled() and any_requires_grad(*args):
            return apply(*args, keyset)
        with below():
            return op.redispatch(keyset & after, *args)

    kernel.generated = generated
    return kernel


def register_autograd(qualname: str, backward: Callable, setup_context: Callable) -> None:
    """Registers ``backward`` / ``setup_context`` as the autograd formula of ``qualname``
    ('gnncompile::spmm'), as ``torch.library.register_autograd`` does (see the module docstring)."""
    namespace, name = qualname.split("::")
    op = getattr(getattr(torch.ops, namespace), name).default
    schema = op._schema
    if (_internals() is None or any(a.kwarg_only for a in schema.arguments)
            or _is_out_variant(op) or any(a.alias_info is not None for a in schema.arguments)):
        torch.library.register_autograd(qualname, backward, setup_context=setup_context)
        return
    lib = _libs.get(namespace)
    if lib is None:
        lib = _libs[namespace] = torch.library.Library(namespace, "FRAGMENT")
    lib.impl(name, autograd_kernel(op, backward, setup_context), "Autograd", with_keyset=True)


__all__ = ["register_autograd", "autograd_kernel"]
