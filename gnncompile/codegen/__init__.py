"""Generated message kernels (issue 25, CPU target): every message op a training step runs on a
message program (``message_reduce``, the backward's ``message_sum_multi``, ``message_edges`` and
``message_encoder_grad``)
as a C++ kernel of its own, emitted (:mod:`.emit`), compiled at first use and cached on disk
(:mod:`.build`), run by the native glue inside its checks and balanced row split.

How a generated kernel is called, and why: the native glue of the message ops
(native/cpu/message.cpp) keeps a registry from the key of a call (op, program, constants, input
sides and width classes, dtypes; the reduction, the result slots or the output order and width
class: :meth:`.emit.Spec.key`) to the address of a C ABI function (native/cpu/codegen_abi.h).
:func:`prepare` builds or loads a kernel and registers its address; from then on every call of
that key, eager or inside a compiled graph, runs it instead of the interpreter, after the same
checks and over the same row split on torch's thread pool, once per chunk. The ops, their
schemas, their autograd and what they save for backward are the interpreter's, unchanged. Who
prepares: the rewrite pass, at compile time, the forward's ``message_reduce`` / ``message_edges``;
the autograd of the message ops (ops/message.py), through :func:`prepare_call`, each derivative
program's kernel at its first use, which is at trace time when the backward is traced (so a
compiled training step has them all before its first run). Calling the kernel from Python
through :mod:`ctypes` inside a custom op was the other route; it would need a row split of its
own outside torch's pool and a second op (schema, fake kernel, autograd) for every message op,
for nothing the registry does not give.

The choice: ``$GNNCOMPILE_CODEGEN`` (:mod:`gnncompile.config`): ``off`` (also ``interpreter``)
or ``auto``. The compiler (``$GNNCOMPILE_CXX``, else ``c++``) missing or a build failing gives one
warning per process and the interpreter, which computes the same numbers (tests/codegen check
both bit for bit).
"""
from __future__ import annotations

import logging
import threading
import warnings
from typing import Dict, Optional, Sequence

import torch

from .. import config as _config
from . import build
from .build import BuildError
from .emit import Spec, emit, make_spec

_log = logging.getLogger(__name__)
_lock = threading.Lock()
_failed: Dict[str, str] = {}  # key -> why (not retried in this process)
_addresses: Dict[str, int] = {}  # key -> the loaded kernel's address (libraries are never unloaded)
_warned = False


def mode() -> str:
    """``$GNNCOMPILE_CODEGEN``: 'off' or 'auto'."""
    return _config.current().codegen


def enabled() -> bool:
    """The mode is 'auto' and the native module (whose glue runs the kernels) is loaded; without
    it the message ops run their torch references, and nothing is built or warned about."""
    if mode() != "auto":
        return False
    from ..ops import _native as n
    return n._C is not None


def _native():
    from ..ops import _native as n
    if n._C is None:
        raise BuildError(f"the native module is not loaded ({n.LOAD_ERROR})")
    return n._C.codegen


def _warn_once(why: str) -> None:
    global _warned
    if _warned:
        _log.info("generated message kernel unavailable: %s", why)
        return
    _warned = True
    warnings.warn(f"gnncompile.codegen: generated message kernels are unavailable ({why}); message programs "
                  "run the interpreter (the same numbers, slower)", RuntimeWarning, stacklevel=3)


def prepare_spec(spec: Spec, force: bool = False) -> bool:
    """Builds or loads the kernel of ``spec`` and registers it with the native glue. Returns
    whether ``message_reduce`` calls of this key now run it; False (the interpreter, with one
    warning per process) when no compiler works or the build fails. Does nothing and returns
    False while the mode is off, unless ``force``."""
    if not (force or enabled()):
        return False
    key = spec.key()
    with _lock:
        if key in _failed:
            return False
        try:
            address = _addresses.get(key)
            if address is None:
                address = build.load_kernel(emit(spec))
            _native().register(key, address)
            _addresses[key] = address
        except (BuildError, OSError) as exc:
            _failed[key] = str(exc)
            _warn_once(str(exc).splitlines()[0][:300])
            return False
    return True


def prepare(inputs: Sequence[torch.Tensor], sides: Sequence[int], code: Sequence[int], consts: Sequence[float],
            width: int, reduce: str = "sum", index_dtype=torch.int64, force: bool = False, *, op: str = "reduce",
            results: Sequence[int] = (), out_width: Optional[int] = None, by_slot: bool = False,
            enc: Optional[int] = None, need_features: bool = False) -> bool:
    """:func:`prepare_spec` for the call over ``inputs`` (tensors or anything with ``dtype`` and
    ``shape``: fake tensors at compile time) with a structure of ``index_dtype``: of
    ``message_reduce`` (``reduce``), or with ``op='multi'`` of ``message_sum_multi`` (``results``),
    with ``op='edges'`` of ``message_edges`` (``out_width``, ``by_slot``), with ``op='encgrad'`` of
    ``message_encoder_grad`` (``enc``, ``need_features``, ``out_width`` the encoder's width)."""
    if not inputs:
        raise ValueError("gnncompile.codegen.prepare: a message program needs at least one input")
    spec = make_spec(code, consts, sides, [int(t.shape[1]) for t in inputs], int(width), reduce, inputs[0].dtype,
                     index_dtype, op=op, results=results, out_width=out_width, by_slot=by_slot, enc=enc,
                     need_features=need_features)
    return prepare_spec(spec, force=force)


_seen: Dict[tuple, bool] = {}  # what prepare_call answered, per call shape (cleared by reset)


def prepare_call(op: str, index: torch.Tensor, inputs: Sequence[torch.Tensor], sides: Sequence[int],
                 code: Sequence[int], consts: Sequence[float], width: int, reduce: str = "sum",
                 results: Sequence[int] = (), out_width: Optional[int] = None, by_slot: bool = False,
                 enc: Optional[int] = None, need_features: bool = False) -> bool:
    """The hook of the message ops' callers (the backward of ops/message.py): with the mode
    'auto', the kernel of this CPU float32 / float64 call prepared at its first use (at trace time
    when the backward is traced, with fake tensors), then a dictionary look-up. Anything else
    (mode off, another device or dtype, a program the op will refuse with its own message):
    False, the interpreter or the reference runs."""
    if not enabled() or not inputs:
        return False
    x = inputs[0]
    if x.device.type != "cpu" or x.dtype not in (torch.float32, torch.float64):
        return False
    # the key as given (numbers compare and hash by value: 1, 1.0 and True are one key), made at
    # C speed: the backward calls this at every layer of every step (8 us a call with each
    # element converted in Python, for a derivative program of 30 entries)
    memo = (op, tuple(code), tuple(consts), tuple(sides), tuple([t.shape[1] for t in inputs]), width, reduce,
            x.dtype, index.dtype, tuple(results), out_width, by_slot, enc, need_features)
    try:
        hit = _seen.get(memo)
    except TypeError:  # an unhashable element (not a plain number): the key in plain numbers
        memo = (op, tuple(int(c) for c in code), tuple(float(c) for c in consts), tuple(int(s) for s in sides),
                tuple(int(t.shape[1]) for t in inputs), int(width), reduce, x.dtype, index.dtype,
                tuple(int(r) for r in results), out_width, bool(by_slot), enc, bool(need_features))
        hit = _seen.get(memo)
    if hit is not None:
        return hit
    try:
        spec = make_spec(code, consts, sides, [int(t.shape[1]) for t in inputs], int(width), reduce, x.dtype,
                         index.dtype, op=op, results=results, out_width=out_width, by_slot=by_slot, enc=enc,
                         need_features=need_features)
    except (ValueError, TypeError):  # the op itself raises its own error for this call
        return False
    ok = prepare_spec(spec)
    with _lock:
        _seen[memo] = ok
    return ok


def reset() -> None:
    """Every message_reduce call runs the interpreter again (kernels stay loaded); failures are
    forgotten and the warning may come again (for tests)."""
    global _warned
    with _lock:
        _failed.clear()
        _seen.clear()
        _addresses.clear()  # the next prepare finds its library again through build (in memory or on disk)
        _warned = False
        try:
            _native().unregister_all()
        except BuildError:
            pass


def suspend() -> None:
    """Every message op call runs the interpreter until :func:`resume`; the kernels stay loaded
    and prepared (for side-by-side timing: tests and benchmarks/codegen.py switch a compiled model
    between the two without recompiling). Meant with the mode off, so that the backward's
    prepare_call does not take its cached answer for a registered kernel."""
    with _lock:
        try:
            _native().unregister_all()
        except BuildError:
            pass


def resume() -> None:
    """Registers every kernel prepared in this process again (after :func:`suspend`)."""
    with _lock:
        for key, address in _addresses.items():
            _native().register(key, address)


def describe() -> str:
    """One line for explain(): which kernels the CPU message ops run in this process."""
    if mode() != "auto":
        return "the interpreter (GNNCOMPILE_CODEGEN=off)"
    if not enabled():
        return "the torch references (the native module is not loaded)"
    with _lock:
        n, failed = len(_addresses), len(_failed)
    return (f"generated C++ per program and op (GNNCOMPILE_CODEGEN=auto, the default): {n} kernel(s) ready in "
            f"this process" + (f", {failed} failed to build (those run the interpreter)" if failed else "")
            + "; the backward's kernels are prepared when it is traced")


def registered() -> Sequence[str]:
    """The keys of the registered kernels (none without the native module)."""
    try:
        return list(_native().keys())
    except BuildError:
        return []


def calls() -> int:
    """message op calls (message_reduce, message_sum_multi, message_edges) of this process that
    ran a generated kernel."""
    try:
        return int(_native().calls())
    except BuildError:
        return 0


__all__ = ["Spec", "make_spec", "emit", "prepare", "prepare_spec", "prepare_call", "reset", "suspend", "resume", "describe", "registered", "calls", "mode",
           "enabled", "BuildError", "build"]


def _hook() -> None:
    """The message ops' autograd prepares its derivative kernels through prepare_call."""
    from ..ops import message
    message.PREPARE = prepare_call


_hook()
