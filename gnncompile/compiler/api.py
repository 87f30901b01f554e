"""``gnncompile.compile(model)``: the model wrapped around ``torch.compile`` with the gnncompile
backend and its :class:`~gnncompile.settings.Settings` (defaults <- configuration <- device
profile <- the call's arguments), which the model carries."""
from __future__ import annotations

import functools
import os
import itertools
import warnings
from typing import Any, Mapping, Optional

import torch
import torch.nn.modules.module as _mm

from .._log import error_line, get_logger
from ..hardware import memory as _memory
from ..settings import Settings
from . import backend as _backend
from . import guard as _guard
from . import lean as _lean

_log = get_logger(__name__)


_INNER = "_orig_mod."  # the wrapper's own name for the model, hidden from state_dict keys


class CompiledModule(torch.nn.Module):
    """Behaves like the wrapped model: same parameters (the very same tensors), same
    ``state_dict`` keys (no prefix), ``train()`` / ``eval()`` reach the model; ``forward`` runs
    the compiled version. Attributes not found here are looked up on the model.

    Transparent as another module's child too: the parent's ``state_dict`` /
    ``load_state_dict`` keys and ``named_parameters`` / ``named_buffers`` / ``named_modules``
    names are those it has with the uncompiled model in its place (no ``_orig_mod.`` level), so
    checkpoints move both ways between compiled and uncompiled models, nested ones included.
    Pickling (``torch.save``, ``copy.deepcopy``) stores the model and the ``compile`` options;
    unpickling compiles again (see :func:`compile`)."""

    def __init__(self, model: torch.nn.Module, compiled, options: Optional[dict] = None,
                 settings: Optional[Settings] = None) -> None:
        super().__init__()
        self._orig_mod = model
        self.training = model.training  # train()/eval() set both from here on
        object.__setattr__(self, "_compiled", compiled)  # not a registered submodule
        object.__setattr__(self, "_options", dict(options or {}))  # compile()'s, for pickling
        object.__setattr__(self, "_loading", [])  # (prefix, error list) of loads under way
        # what the compiled graphs run with (their knobs are baked into them as op arguments)
        object.__setattr__(self, "gnncompile_settings", Settings() if settings is None else settings)
        object.__setattr__(self, "_capture", self.gnncompile_settings.capture_dynamic)
        # the lean forwards of PyG layers Dynamo traces (gnncompile.compiler.lean): on unless
        # settings choices['lean_layers'] is 'off'; what they did per layer, as last traced
        object.__setattr__(self, "_lean", self.gnncompile_settings.lean_layers != "off")
        object.__setattr__(self, "lean_record", _lean.Record())
        # set by compile(): the backend, and how to compile the model again (_capture_switch)
        object.__setattr__(self, "_backend", None)
        object.__setattr__(self, "_earlier", [])  # backends compiled before a capture switch
        object.__setattr__(self, "_recompile", None)
        object.__setattr__(self, "capture_note", "")
        # the whole call timed against the model as written (set by compile() unless the guard
        # is off; gnncompile.compiler.guard.ModelGuard)
        object.__setattr__(self, "_guard", None)
        # grad mode -> the model as written, where the guard kept it (ModelGuard.as_written)
        object.__setattr__(self, "_as_written", {})
        object.__setattr__(self, "_failed", None)  # why compiling failed, once it did: runs eagerly
        self.register_load_state_dict_post_hook(_restore_key_names)

    def __call__(self, *args, **kwargs):
        # Without hooks on this module (or global ones), tracing and exporting, a call goes
        # straight to what forward would call (Module.__call__'s _call_impl would call forward
        # and nothing else): where the speed guard kept the model as written for this grad mode,
        # the model itself (its own call's cost: 3.5 us a call on this project's CPU, 1.6 us
        # left; HISTORY section 29), else the guard or the compiled model. Hooks on this module,
        # tracing and exporting take the usual way.
        if (self._forward_pre_hooks or self._forward_hooks or self._backward_pre_hooks
                or self._backward_hooks or _mm._global_forward_pre_hooks or _mm._global_forward_hooks
                or _mm._global_backward_pre_hooks or _mm._global_backward_hooks
                or self._compiled_call_impl is not None or torch._C._get_tracing_state()
                or torch.compiler.is_exporting()):
            return torch.nn.Module.__call__(self, *args, **kwargs)
        run = self._as_written.get(torch.is_grad_enabled())
        if run is not None:
            return run(*args, **kwargs)
        if self._guard is not None:
            return self._guard(*args, **kwargs)
        return self._run_compiled(*args, **kwargs)

    def forward(self, *args, **kwargs):
        if torch.compiler.is_exporting():
            raise RuntimeError(
                "torch.export of a module returned by gnncompile.compile would export the model "
                "without gnncompile's rewrite (torch.compile does not run under torch.export): use "
                "gnncompile.export(model, example_inputs, path, format='pt2') for the rewritten "
                "graph, or torch.export.export(model.model, ...) for the model as written")
        if self._guard is not None:
            return self._guard(*args, **kwargs)
        return self._run_compiled(*args, **kwargs)

    def _run_compiled(self, *args, **kwargs):
        if self._failed is not None:
            return self._orig_mod(*args, **kwargs)
        try:
            with _backend.dynamic_output_shapes(self._capture), _lean.scope(self._lean, self.lean_record):
                out = self._compiled(*args, **kwargs)
            if self._capture is True and self._backend is not None and self._backend.data_dependent_breaks:
                self._capture_switch()
            return out
        except Exception as compiled_error:
            if self._options.get("fullgraph"):
                raise  # compile(fullgraph=True): the user asked for the error
            # the model itself on the same inputs: an error of its own (bad input) is raised as
            # eager raises it; a model that runs eagerly had torch.compile fail on it
            try:
                out = self._orig_mod(*args, **kwargs)
            except Exception as own:
                raise own from None
            why = error_line(compiled_error, 300) + known_cause(compiled_error)
            object.__setattr__(self, "_failed", why)
            warnings.warn(f"gnncompile: compiling {type(self._orig_mod).__name__} failed inside torch.compile "
                          f"({why}); the model runs as written (eagerly) from now on",
                          CompileFallbackWarning, stacklevel=3)
            _log.warning("compile %s failed (%s): running eagerly", type(self._orig_mod).__name__, why)
            return out

    def _capture_switch(self) -> None:
        """A piece ended at a graph break on a data-dependent guard in torch's attention
        (``backend.SWITCH_CALLS``): a size read from a tensor (captured as an unbacked symbolic
        size) that torch then had to compare, as ``scaled_dot_product_attention`` does with
        ``to_dense_batch``'s padded length in GPSConv. The attention ran as written, outside
        every graph. The model is compiled
        again with scalar reads left to eager (``capture_dynamic_output_shape_ops`` stays on): the
        graph breaks where the value is read, and what follows is compiled with it as an input
        (a symbolic size with a value, which torch can compare). Once per model; explain()
        reports it."""
        why = self._backend.data_dependent_breaks[0]
        be, compiled = self._recompile()
        # Dynamo may still run pieces of the first compile where a frame's guards hold (a frame
        # without the break): their speed guards go on deciding, and are listed too
        self._earlier.append(self._backend)
        object.__setattr__(self, "_backend", be)
        object.__setattr__(self, "_compiled", compiled)
        object.__setattr__(self, "_capture", _backend.CAPTURE_OUTPUTS)
        object.__setattr__(self, "capture_note", (
            "compiled again with scalar reads left to eager: a graph piece ended at a data-dependent "
            f"guard ({why[:160]}{' ...' if len(why) > 160 else ''}); the graph now breaks where the "
            "value is read and what follows compiles with it known"))
        _log.info("compile %s: %s", type(self._orig_mod).__name__, self.capture_note)

    @property
    def model(self) -> torch.nn.Module:
        return self._orig_mod

    def __getattr__(self, name: str):
        try:
            return super().__getattr__(name)
        except AttributeError:
            return getattr(self._modules["_orig_mod"], name)

    def __reduce__(self):
        return (_rebuild, (self._orig_mod, self._options))

    # the model's own names, without the wrapper's prefix. A parent's state_dict() calls this
    # with its destination and prefix; its named_* go through named_modules.
    def state_dict(self, *args, **kwargs):
        return self._orig_mod.state_dict(*args, **kwargs)

    def load_state_dict(self, state_dict, *args, **kwargs):
        """The model's ``load_state_dict``; a checkpoint saved from ``torch.compile(model, ...)``
        (every key under torch's ``_orig_mod.`` wrapper) loads too."""
        return self._orig_mod.load_state_dict(_model_keys(state_dict), *args, **kwargs)

    def named_parameters(self, *args, **kwargs):
        return self._orig_mod.named_parameters(*args, **kwargs)

    def named_buffers(self, *args, **kwargs):
        return self._orig_mod.named_buffers(*args, **kwargs)

    def named_modules(self, memo=None, prefix: str = "", remove_duplicate: bool = True):
        """This wrapper, then the model's modules under the wrapper's own name."""
        memo = set() if memo is None else memo
        if self in memo:
            return
        if remove_duplicate:
            memo.add(self)
        yield prefix, self
        yield from self._orig_mod.named_modules(memo, prefix, remove_duplicate)

    def _load_from_state_dict(self, state_dict, prefix, local_metadata, strict, missing_keys,
                              unexpected_keys, error_msgs):
        # Reached only as a child (load_state_dict above delegates): a parent's load_state_dict
        # calls this, then recurses into _orig_mod with the keys under prefix + "_orig_mod.".
        # Move this subtree's keys there; _restore_key_names maps the reported names back.
        inner = prefix + _INNER
        for key in [k for k in state_dict if k.startswith(prefix)]:
            state_dict[inner + key[len(prefix):]] = state_dict.pop(key)
        self._loading.append((prefix, error_msgs))
        super()._load_from_state_dict(state_dict, prefix, local_metadata, strict, missing_keys,
                                      unexpected_keys, error_msgs)

    def extra_repr(self) -> str:
        return f"inner={self.gnncompile_settings.inner}"


# torch.compile failures whose cause torch's message does not name: a part of the message -> the cause
_KNOWN_CAUSES = {
    # torch's DDPOptimizer (Dynamo splitting the graph of a model run by DDP at its gradient
    # buckets) asserts that DDP's first bucket (1 MiB) is no larger than bucket_cap_mb
    "First bucket should be smaller/equal to other buckets": (
        "DistributedDataParallel(bucket_cap_mb=...) is below 1: torch.compile's DDP optimizer, which splits "
        "the compiled graph at DDP's gradient buckets, needs bucket_cap_mb >= 1 (MiB), the size of DDP's first "
        "bucket"),
}


def known_cause(error: BaseException) -> str:
    """' (cause: ...)' for a torch.compile failure listed in _KNOWN_CAUSES, else ''."""
    text = str(error)
    return next((f" (cause: {c})" for k, c in _KNOWN_CAUSES.items() if k in text), "")


class CompileFallbackWarning(UserWarning):
    """torch.compile failed on a model that runs eagerly: the compiled module runs it as written."""


def _model_keys(state_dict: Mapping) -> Mapping:
    """``state_dict`` with torch.compile's ``_orig_mod.`` prefix taken off when every key has it
    (a checkpoint of ``torch.compile(model).state_dict()``); otherwise as it is."""
    keys = [k for k in state_dict if not k.startswith("_metadata")]
    if not keys or not all(k.startswith(_INNER) for k in keys):
        return state_dict
    out = type(state_dict)() if isinstance(state_dict, dict) else {}
    for k, v in state_dict.items():
        out[k[len(_INNER):]] = v
    meta = getattr(state_dict, "_metadata", None)
    if meta is not None:
        out._metadata = type(meta)((k[len(_INNER):] if k.startswith(_INNER) else ("" if k == _INNER[:-1] else k), v)
                                   for k, v in meta.items())
    return out


def unwrap(module: torch.nn.Module) -> torch.nn.Module:
    """The model as written inside ``gnncompile.compile(model)`` or ``torch.compile(model, ...)``
    (both, nested); any other module as it is."""
    while isinstance(module, (CompiledModule, torch._dynamo.eval_frame.OptimizedModule)):
        module = module._orig_mod
    return module


def state_dict(module: torch.nn.Module, *args, **kwargs) -> dict:
    """The model's ``state_dict`` with the model's own key names, whichever way it was compiled
    (``torch.compile`` adds ``_orig_mod.`` to every key of its wrapper's ``state_dict``;
    ``gnncompile.compile`` adds nothing): a checkpoint that loads into the model as written,
    ``gnncompile.compile(model)`` and (with :func:`load_state_dict`) ``torch.compile(model)``."""
    return unwrap(module).state_dict(*args, **kwargs)


def load_state_dict(module: torch.nn.Module, state_dict: Mapping, strict: bool = True, assign: bool = False):
    """Loads a checkpoint of the model saved in any of its forms (as written,
    ``gnncompile.compile``, ``torch.compile``: with or without ``_orig_mod.`` keys) into
    ``module`` in any of those forms; returns what ``load_state_dict`` returns."""
    return unwrap(module).load_state_dict(_model_keys(state_dict), strict=strict, assign=assign)


def _restore_key_names(module: CompiledModule, incompatible) -> None:
    """load_state_dict post-hook: the missing / unexpected keys and error messages of a child
    wrapper's subtree under the names the caller's state dict uses (without ``_orig_mod.``)."""
    if not module._loading:
        return
    prefix, errors = module._loading.pop()
    inner = prefix + _INNER
    for keys in (incompatible.missing_keys, incompatible.unexpected_keys):
        keys[:] = [prefix + k[len(inner):] if k.startswith(inner) else k for k in keys]
    errors[:] = [e.replace(inner, prefix) for e in errors]


def _rebuild(model: torch.nn.Module, options: dict) -> CompiledModule:
    """Unpickling a CompiledModule: compiles the model again with the recorded options."""
    return compile(model, **options)


def _portable_profile(request: Any, prof) -> Any:
    """What a pickled CompiledModule records of its profile: 'auto' and None resolve again where
    it is loaded; a profile read from a file or given as a document travels as that document
    (validated again there: a foreign one warns and gives the defaults)."""
    if request is None or (isinstance(request, str) and request == "auto"):
        return request
    if prof.source == "transfer" or prof.transfer:  # another device's profile: found again there
        return str(request) if isinstance(request, (str, os.PathLike)) else None
    return dict(prof.raw) if prof.raw else None


def _settings(prof, inner: str, reassociate: bool, settings: Any) -> Settings:
    """defaults <- configuration <- profile ``prof`` <- inner / reassociate <- ``settings``."""
    if isinstance(settings, Settings):
        return settings
    s = Settings.build(prof, inner=inner, reassociate=True if reassociate else None)
    if settings is None:
        return s
    if not isinstance(settings, Mapping):
        raise TypeError(f"gnncompile.compile: settings must be a Settings or a dict of settings, got "
                        f"{type(settings).__name__}")
    given = dict(settings)
    if isinstance(given.get("choices"), (Mapping, tuple, list)):
        # choices merge key by key: {"choices": {"guard": "off"}} keeps the configuration's and
        # the profile's other choices ($GNNCOMPILE_EDGE_ENCODER, $GNNCOMPILE_PROGRAMS, ...)
        given["choices"] = {**dict(s.choices), **dict(given["choices"])}
    return s.replace(**given)


def _device_types(model) -> set:
    """The device types of a module's parameters and buffers (empty for a function, or a module
    without any: the devices are known only when it runs)."""
    if not isinstance(model, torch.nn.Module):
        return set()
    return {t.device.type for t in itertools.chain(model.parameters(), model.buffers())}


def compile(model, *, profile: Any = "auto", inner: str = "auto", dynamic: Optional[bool] = None,
            fullgraph: bool = False, workload: Optional[dict] = None, reassociate: bool = False,
            settings: Any = None):
    """Compiles a PyG model (or any callable) with the gnncompile backend.

    Args:
        model: an ``nn.Module`` (returned wrapped in :class:`CompiledModule`, sharing its
            parameters and state) or a function (returned as ``torch.compile`` returns it).
        profile: the device profile whose kernel knobs the fused ops use
            (:mod:`gnncompile.profiles`): 'auto' (default) loads the profile for the detected
            device from the cache folder, the one nearest to ``workload`` when there is no
            exact match, else the defaults; a path loads that file (or the nearest in that
            folder); None uses the defaults of :func:`gnncompile.hardware.default_settings`. A
            corrupt, foreign or stale profile warns and falls back to the defaults. The
            profile used is recorded as ``.gnncompile_profile`` on the returned module
            (its loader settings: ``.gnncompile_profile.loader_kwargs()``); its kernel knobs
            go into the model's settings, so models compiled with different profiles in one
            process each run with their own.
        inner: compiler for the rest of the graph: 'auto' (the profile's ``inner`` when the
            profile has one, else ``$GNNCOMPILE_INNER``, else chosen per graph piece by
            :func:`gnncompile.compiler.backend.choose_inner`: inductor for graphs of at least
            ``AUTO_INDUCTOR_MIN_SIZE`` nodes + edges; "eager" below, where inductor's compile
            time would not be repaid; 'aot_eager' makes small training steps faster for about
            1 s more at the first call, see ``AUTO_SMALL_FUSED_TRAINING``), 'eager', 'aot_eager'
            or 'inductor'.
        dynamic: passed to ``torch.compile``. ``None`` (automatic dynamic shapes): the first call
            compiles each graph piece for its exact sizes, and the first call with other sizes
            recompiles it once with symbolic sizes, after which changing N and E (mini-batches)
            recompiles nothing. ``True`` compiles symbolic from the start.
        fullgraph: passed to ``torch.compile`` (raise on graph breaks).
        workload: optional description used to pick the nearest profile, e.g.
            ``{"kind": "graphs", "model": "gin"}``; by default the model's class name.
        reassociate: also distribute linear maps over sums and differences of gathered rows
            (``W (x_j - x_i) -> (W x)_j - (W x)_i``: the GEMM runs over the nodes instead of the
            edges). Off by default, because it is not exact: ``W a - W b`` cancels where
            ``a - b`` does not (coordinates sharing a large offset lose every digit of their
            difference in float32). Turn it on for features without such offsets. It also
            sums a graph input that needs no gradient over the edges before its linear map
            (GCNConv's ``A (X W) -> (A X) W`` where X is at most as wide as the output: no spmm
            in the backward; the products are added in another order).
        settings: a dict of settings applied last (``{"knobs": {"cpu": [4]}, "inner":
            "eager"}``; see :class:`gnncompile.settings.Settings`; its ``choices`` are merged
            key by key over those of the configuration and the profile), or a ``Settings`` used
            as it is (the profile is then only recorded).

    Each rewritten graph piece is timed against its unrewritten form on its first calls and
    the faster is kept (the speed guard, :mod:`gnncompile.compiler.guard`; ``settings={"choices":
    {"guard": "off"}}`` turns it off); then the whole compiled call is timed against the model as
    written (Dynamo's own cost included) in pairs of back-to-back calls, and unless eager is at
    least 3% slower by the median over the pairs, the returned module calls the model as written
    from then on (per grad mode; a win of the compiled call by less than 2x is timed again once,
    150 calls later, 20 pairs, by the same rule); ``.guard_decisions()`` on the returned module
    (or function) lists what was kept and why, and :func:`gnncompile.explain` prints it.

    Sizes read from tensors are captured into the graph (``settings.capture_dynamic``, True by
    default). Where such a size then ended a graph piece at a data-dependent guard in torch's
    attention (over ``to_dense_batch``'s padded length, in GPSConv), the returned module compiles
    the model again after its first call with scalar reads left to eager (as
    ``capture_dynamic='outputs'``); ``.capture_note`` and :func:`gnncompile.explain` say so.

    The settings the model runs with are ``.gnncompile_settings`` on the returned module (or
    function); :func:`gnncompile.explain` prints them and :func:`gnncompile.export` of the
    returned module uses them. The returned module pickles (``torch.save(m)``; ``torch.load(path, weights_only=False)``):
    it is stored as the model plus these options, and loading compiles again, which applies the
    profile there as this call does: 'auto' and None are resolved on the loading machine, a
    profile from a file travels as its document and is validated again.
    """
    from .. import profiles as _profiles

    if workload is None and isinstance(model, torch.nn.Module):
        workload = {"model": type(model).__name__.lower()}
    if inner != "auto" and inner not in _backend.INNERS:
        raise ValueError(f"gnncompile: unknown inner compiler {inner!r}; expected 'auto' or one of "
                         f"{_backend.INNERS}")
    prof = _profiles.resolve(profile, workload=workload)
    s = _settings(prof, inner, reassociate, settings)
    options = dict(profile=_portable_profile(profile, prof), inner=inner, dynamic=dynamic,
                   fullgraph=fullgraph, workload=workload, reassociate=reassociate, settings=settings)
    _log.info("compile %s: profile %s; settings: %s", type(model).__name__, prof.summary(), s)
    huge_pages = _memory.apply(s.huge_pages, _device_types(model))
    buffer_cache = _memory.apply_cache(s.buffer_cache, _device_types(model))
    def build():
        be = _backend.Backend(s)  # a new backend: Dynamo compiles its frames again for it
        return be, torch.compile(model, backend=be, dynamic=dynamic, fullgraph=fullgraph)

    be, compiled = build()
    if isinstance(model, torch.nn.Module):
        out = CompiledModule(model, compiled, options, s)
        object.__setattr__(out, "gnncompile_profile", prof)
        object.__setattr__(out, "gnncompile_huge_pages", huge_pages)
        object.__setattr__(out, "gnncompile_buffer_cache", buffer_cache)
        object.__setattr__(out, "_backend", be)
        object.__setattr__(out, "_recompile", build)
        guard = None
        if s.guard != "off":
            guard = _guard.ModelGuard(out._run_compiled, model, lambda grad: out._backend.verdict(grad))
            object.__setattr__(out, "_guard", guard)
            object.__setattr__(out, "_as_written", guard.as_written)
        object.__setattr__(out, "guard_decisions",
                           lambda: [d for b in out._earlier + [out._backend] for d in b.guard_decisions()]
                           + (guard.decisions if guard is not None else []))
        return out
    compiled_fn, capture = compiled, s.capture_dynamic
    lean_on, lean_record = s.lean_layers != "off", _lean.Record()

    @functools.wraps(model)
    def compiled(*args, **kwargs):
        with _backend.dynamic_output_shapes(capture), _lean.scope(lean_on, lean_record):
            return compiled_fn(*args, **kwargs)

    compiled.gnncompile_profile = prof
    compiled.gnncompile_settings = s
    compiled.gnncompile_huge_pages = huge_pages
    compiled.gnncompile_buffer_cache = buffer_cache
    compiled.guard_decisions = be.guard_decisions
    compiled.lean_record = lean_record
    return compiled


__all__ = ["compile", "CompiledModule", "CompileFallbackWarning", "unwrap", "state_dict", "load_state_dict"]
