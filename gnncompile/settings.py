"""The settings a compiled model runs with: one immutable value, carried by the model.

:func:`gnncompile.compile` builds a :class:`Settings` from, in order of precedence (later wins)::

    defaults  <-  configuration (environment, gnncompile.config)  <-  device profile  <-  compile(...) arguments

and hands it to the backend, which hands it to the rewrite: the kernel knobs are baked into the
fused calls of each compiled graph as op arguments, so a compiled graph reads no process-wide
state, and two models compiled with different settings in one process each run with their own.
``model.gnncompile_settings`` shows them, :func:`gnncompile.explain` prints them, and
:func:`gnncompile.export` of a compiled model uses them.

Fields:

* ``knobs``: kernel knobs by device type (``(("cpu", (8,)),)``; a device type that is not
  listed gets the kernels' own defaults), and ``op_knobs`` by op and device type, which win
  over ``knobs`` for that op (ops: :data:`OPS`).
* ``inner``: the inner compiler ('auto': chosen per graph piece by its size, see
  :func:`gnncompile.compiler.backend.choose_inner`).
* ``reassociate``: distribute linear maps over sums and differences of gathered rows, and
  aggregate a graph input that needs no gradient before its linear map (``A (x W) -> (A x) W``)
  (not exact, off by default; see :mod:`gnncompile.passes.algebra` and :mod:`gnncompile.passes.order`).
* ``slot_order``, ``capture_dynamic``: rewrite and capture switches (``gnncompile.config``).
* ``structure_check``: when the structure cache and the hoisted results confirm a hit by a
  content fingerprint (see :func:`gnncompile.ops.set_structure_check`); baked into the
  model's structure ops, so the model keeps the mode it was compiled with.
* ``threads``: torch's intra-op thread count the profile chose (gnncompile never changes a
  process-wide thread count on its own; the tuner applies it in its trials).
* ``loader``: keyword arguments for :class:`gnncompile.data.PooledLoader` from the profile.
* ``choices``: implementation choices. ``programs``: message programs (any elementwise message,
  run by the CPU interpreter) 'auto' (fused where :func:`gnncompile.passes.match.programs_pay`
  says they are faster than the ops as written, or the narrower rules of cheap messages,
  ``match.encoded_cheap`` and ``match.gathered_cheap``, do), 'always' or 'never' (``$GNNCOMPILE_PROGRAMS``).
  ``guard``: the speed guard (:mod:`gnncompile.compiler.guard`), 'time' (each rewritten graph
  piece timed against its unrewritten form on its first calls, the faster kept) or 'off'
  (``$GNNCOMPILE_GUARD``). ``attention``: GATConv's attention (logits, softmax, dropout,
  aggregation) as one op, 'fused' (default, :mod:`gnncompile.passes.attention`), or 'chain'
  (edge_softmax and spmm as separate fused ops: A/B measurements, and models that take a second
  derivative through the attention). ``huge_pages``: transparent huge pages for torch's large
  CPU allocations (:mod:`gnncompile.hardware.memory`), 'auto' (default: turned on, process-wide,
  when a model on the CPU is compiled and the kernel's THP mode is madvise) or 'off'
  (``$GNNCOMPILE_HUGE_PAGES``). ``buffer_cache``: the cache of freed large CPU allocations
  (:mod:`gnncompile.hardware.memory`: a training step's large tensors are reused from step to step
  instead of being mapped and faulted in afresh), 'auto' (default: turned on, process-wide, when a
  model on the CPU is compiled, at most :func:`~gnncompile.hardware.memory.default_cache_cap` idle
  bytes), an int n > 0 (the same with a cap of n MiB) or 'off' (``$GNNCOMPILE_BUFFER_CACHE``).
  ``cuda_unverified``: the fused attention ops of
  :data:`gnncompile.config.CUDA_UNVERIFIED_OPS` whose chains are fused on CUDA too although their
  CUDA kernels are off by default there (one warp per destination row: slower than the chain on
  graphs with hub rows, measured for GAT on an H200), comma-separated ('all', or '' for none,
  the default; ``$GNNCOMPILE_CUDA_UNVERIFIED``). ``spmm_impl``: the implementation each fused spmm
  runs (:mod:`gnncompile.compiler.portfolio`), 'auto' (default: the faster of gnncompile's kernel
  and torch.sparse.mm on a CSR tensor, measured at the first compile that needs it on the device,
  at most 2 s, cached in the profile folder), 'native' (gnncompile's kernel) or 'torch_sparse'
  (the vendor library; either candidate runs only where it gives the native kernel's bits, or
  with ``reassociate``; ``$GNNCOMPILE_SPMM_IMPL``). ``precision``: 'fp32' (default: every graph
  as written) or 'bf16', an opt-in lower precision (``$GNNCOMPILE_PRECISION``): each fused sum /
  mean spmm on float32 CPU features that runs gnncompile's kernel gathers them in bfloat16 (cast
  once before the op, accumulated in float32 inside the kernel, float32 out, ``gnncompile::spmm_bf16``;
  :mod:`gnncompile.passes.precision`); explain says per op whether it does and why not.
  ``edge_encoder``: a linear map of edge features of width <= 32 that only a message program
  reads, 'auto' (default: inside where its products per edge cost less than its ``E x W`` output,
  by its widths and whether its input needs a gradient: GINE's map inside, SchNet's filter outside;
  :func:`gnncompile.passes.messages.encoder_inside`), 'inside' (computed per edge inside
  the message kernels, its ``E x W`` output never stored; :mod:`gnncompile.passes.messages`) or
  'outside' (computed as written, read by the kernels; ``$GNNCOMPILE_EDGE_ENCODER``).
  ``lean_layers``: 'auto' (default: Dynamo traces a lean forward of each GINConv, GINEConv and
  GCNConv layer that may take it, the same ops in the same order as PyG's, for a shorter first
  call; :mod:`gnncompile.compiler.lean`) or 'off' (PyG's code traced as written).
* ``profile``: where the profile's settings came from (:attr:`gnncompile.profiles.Profile.label`:
  a path, "(defaults)", or a transfer: "<path> (transferred from <device key>, checked: 1.07x
  the defaults [0.98, 1.15])", "(defaults; transfer from <key> rejected: <reason>)").
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any, Dict, List, Mapping, Optional, Sequence, Tuple, Union

from . import config as _config

#: the ops a knob list may be given for in ``op_knobs``
OPS = ("spmm", "edge_softmax", "message", "gather", "attention")
ATTENTION_MODES = ("fused", "chain")
#: what choices['lean_layers'] may hold (gnncompile.compiler.lean)
LEAN_MODES = ("auto", "off")
#: what choices['spmm_impl'] may hold (gnncompile.compiler.portfolio)
SPMM_IMPLS = _config.SPMM_IMPLS
#: what choices['precision'] may hold (gnncompile.passes.precision)
PRECISIONS = _config.PRECISIONS
DEVICE_TYPES = ("cpu", "cuda")
_LOADER_KEYS = ("batch_size", "pool_size", "num_workers", "pin_memory", "persistent_workers")


def _knob_tuple(knobs: Any, what: str) -> Tuple[int, ...]:
    if isinstance(knobs, (str, bytes)) or not isinstance(knobs, Sequence):
        raise TypeError(f"gnncompile settings: {what} must be a list of ints >= 0, got {knobs!r}")
    out = []
    for k in knobs:
        if isinstance(k, bool) or not isinstance(k, int) or k < 0:
            raise ValueError(f"gnncompile settings: {what} must be a list of ints >= 0, got {list(knobs)!r}")
        out.append(int(k))
    return tuple(out)


def _device_type(d: Any, what: str) -> str:
    if d not in DEVICE_TYPES:
        raise ValueError(f"gnncompile settings: {what}: device type must be one of {DEVICE_TYPES}, got {d!r}")
    return d


@dataclass(frozen=True)
class Settings:
    """See the module docstring. Build one with :meth:`build` or :meth:`replace`; both check
    every value (a bad one is a ValueError / TypeError naming the setting)."""

    knobs: Tuple[Tuple[str, Tuple[int, ...]], ...] = ()
    op_knobs: Tuple[Tuple[str, str, Tuple[int, ...]], ...] = ()
    inner: str = "auto"
    reassociate: bool = False
    slot_order: bool = True
    capture_dynamic: Union[bool, str] = True
    structure_check: str = "cpu"
    threads: Optional[int] = None
    loader: Tuple[Tuple[str, Any], ...] = ()
    choices: Tuple[Tuple[str, str], ...] = ()
    profile: str = "(defaults)"

    def __post_init__(self) -> None:
        if self.inner != "auto" and self.inner not in _config.INNERS:
            raise ValueError(f"gnncompile settings: inner must be 'auto' or one of {_config.INNERS}, "
                             f"got {self.inner!r}")
        if self.structure_check not in _config.CHECK_MODES:
            raise ValueError(f"gnncompile settings: structure_check must be one of {_config.CHECK_MODES}, "
                             f"got {self.structure_check!r}")
        if not (isinstance(self.capture_dynamic, bool) or self.capture_dynamic == "outputs"):
            raise TypeError(f"gnncompile settings: capture_dynamic must be True, False or 'outputs', got "
                            f"{self.capture_dynamic!r}")
        for name in ("reassociate", "slot_order"):
            if not isinstance(getattr(self, name), bool):
                raise TypeError(f"gnncompile settings: {name} must be True or False, got {getattr(self, name)!r}")
        if self.threads is not None and (isinstance(self.threads, bool) or not isinstance(self.threads, int)
                                         or self.threads < 1):
            raise ValueError(f"gnncompile settings: threads must be None or an int >= 1, got {self.threads!r}")
        # normalised forms: sorted, deduplicated (the last entry for a key wins)
        knobs = {_device_type(d, "knobs"): _knob_tuple(k, f"knobs[{d!r}]") for d, k in self.knobs}
        object.__setattr__(self, "knobs", tuple(sorted(knobs.items())))
        op_knobs = {}
        for op, d, k in self.op_knobs:
            if op not in OPS:
                raise ValueError(f"gnncompile settings: op_knobs: op must be one of {OPS}, got {op!r}")
            op_knobs[(op, _device_type(d, "op_knobs"))] = _knob_tuple(k, f"op_knobs[{op!r}, {d!r}]")
        object.__setattr__(self, "op_knobs", tuple(sorted((o, d, k) for (o, d), k in op_knobs.items())))
        loader = dict(self.loader)
        bad = set(loader) - set(_LOADER_KEYS)
        if bad:
            raise ValueError(f"gnncompile settings: loader keys must be among {_LOADER_KEYS}, got {sorted(bad)}")
        object.__setattr__(self, "loader", tuple(sorted(loader.items())))
        object.__setattr__(self, "choices", tuple(sorted(dict(self.choices).items())))
        programs = dict(self.choices).get("programs", "auto")
        if programs not in _config.PROGRAM_MODES:
            raise ValueError(f"gnncompile settings: choices['programs'] must be one of {_config.PROGRAM_MODES}, "
                             f"got {programs!r}")
        guard = dict(self.choices).get("guard", "time")
        if guard not in _config.GUARD_MODES:
            raise ValueError(f"gnncompile settings: choices['guard'] must be one of {_config.GUARD_MODES}, "
                             f"got {guard!r}")
        attention = dict(self.choices).get("attention", "fused")
        if attention not in ATTENTION_MODES:
            raise ValueError(f"gnncompile settings: choices['attention'] must be one of {ATTENTION_MODES}, "
                             f"got {attention!r}")
        huge = dict(self.choices).get("huge_pages", "auto")
        if huge not in _config.HUGE_PAGE_MODES:
            raise ValueError(f"gnncompile settings: choices['huge_pages'] must be one of {_config.HUGE_PAGE_MODES}, "
                             f"got {huge!r}")
        if "buffer_cache" in dict(self.choices):
            try:
                cache = _config.buffer_cache_value("choices['buffer_cache']", dict(self.choices)["buffer_cache"])
            except _config.ConfigError as e:
                raise ValueError(f"gnncompile settings: {e}") from None
            choices = dict(self.choices)
            if cache == "auto":
                del choices["buffer_cache"]
            else:
                choices["buffer_cache"] = cache
            object.__setattr__(self, "choices", tuple(sorted(choices.items())))
        unverified = dict(self.choices).get("cuda_unverified", "")
        try:
            canonical = _config.cuda_unverified("choices['cuda_unverified']", unverified) \
                if isinstance(unverified, str) else None
        except _config.ConfigError as e:
            raise ValueError(f"gnncompile settings: {e}") from None
        if canonical is None:
            raise ValueError("gnncompile settings: choices['cuda_unverified'] must be a string of op names, "
                             f"got {unverified!r}")
        if "cuda_unverified" in dict(self.choices):
            choices = dict(self.choices)
            if canonical:
                choices["cuda_unverified"] = canonical
            else:
                del choices["cuda_unverified"]
            object.__setattr__(self, "choices", tuple(sorted(choices.items())))
        impl = dict(self.choices).get("spmm_impl", "auto")
        if impl not in SPMM_IMPLS:
            raise ValueError(f"gnncompile settings: choices['spmm_impl'] must be one of {SPMM_IMPLS}, got {impl!r}")
        precision = dict(self.choices).get("precision", "fp32")
        if precision not in PRECISIONS:
            raise ValueError(f"gnncompile settings: choices['precision'] must be one of {PRECISIONS} "
                             f"('bf16' is the opt-in lower precision), got {precision!r}")
        encoder = dict(self.choices).get("edge_encoder", "auto")
        if encoder not in _config.EDGE_ENCODER_MODES:
            raise ValueError(f"gnncompile settings: choices['edge_encoder'] must be one of "
                             f"{_config.EDGE_ENCODER_MODES}, got {encoder!r}")
        lean = dict(self.choices).get("lean_layers", "auto")
        if lean not in LEAN_MODES:
            raise ValueError(f"gnncompile settings: choices['lean_layers'] must be one of {LEAN_MODES}, got {lean!r}")
        unknown = set(dict(self.choices)) - {"programs", "guard", "attention", "huge_pages", "buffer_cache",
                                             "cuda_unverified", "spmm_impl", "precision", "edge_encoder",
                                             "lean_layers"}
        if unknown:
            raise ValueError(f"gnncompile settings: unknown choice(s) {sorted(unknown)}; the choices are "
                             "'programs', 'guard', 'attention', 'huge_pages', 'buffer_cache', 'cuda_unverified', "
                             "'spmm_impl', 'precision', 'edge_encoder' and 'lean_layers'")

    # ------------------------------------------------------------------ reading
    def knobs_for(self, device: Any, op: Optional[str] = None) -> List[int]:
        """The knobs ``op`` gets on ``device`` (a torch.device or a device type): the op's own,
        else the device type's, else [] (the kernels' defaults)."""
        dtype = getattr(device, "type", device)
        if op is not None:
            for o, d, k in self.op_knobs:
                if o == op and d == dtype:
                    return list(k)
        for d, k in self.knobs:
            if d == dtype:
                return list(k)
        return []

    @property
    def programs(self) -> str:
        """The message-program choice: 'auto' (default), 'always' or 'never'."""
        return dict(self.choices).get("programs", "auto")

    @property
    def edge_encoder(self) -> str:
        """The edge-encoder choice: 'auto' (default), 'inside' or 'outside'."""
        return dict(self.choices).get("edge_encoder", "auto")

    @property
    def lean_layers(self) -> str:
        """The lean-forward choice (:mod:`gnncompile.compiler.lean`): 'auto' (default: Dynamo
        traces the lean forward of the PyG layers that may take it) or 'off' (PyG's code as
        written)."""
        return dict(self.choices).get("lean_layers", "auto")

    @property
    def attention(self) -> str:
        """The attention choice: 'fused' (default) or 'chain'."""
        return dict(self.choices).get("attention", "fused")

    @property
    def huge_pages(self) -> str:
        """The huge page choice: 'auto' (default) or 'off'."""
        return dict(self.choices).get("huge_pages", "auto")

    @property
    def buffer_cache(self) -> Union[str, int]:
        """The block cache choice: 'auto' (default), 'off' or a cap in MiB (an int)."""
        return dict(self.choices).get("buffer_cache", "auto")

    @property
    def cuda_unverified(self) -> Tuple[str, ...]:
        """The attention ops fused on CUDA although their CUDA kernels are off by default there
        (none by default; :data:`gnncompile.config.CUDA_UNVERIFIED_OPS`)."""
        v = dict(self.choices).get("cuda_unverified", "")
        return tuple(v.split(",")) if v else ()

    @property
    def spmm_impl(self) -> str:
        """The fused spmm's implementation: 'auto' (default), 'native' or 'torch_sparse'."""
        return dict(self.choices).get("spmm_impl", "auto")

    @property
    def precision(self) -> str:
        """The precision the fused spmm gathers float32 features in: 'fp32' (default) or 'bf16'
        (opt-in)."""
        return dict(self.choices).get("precision", "fp32")

    @property
    def guard(self) -> str:
        """The speed guard: 'time' (default) or 'off'."""
        return dict(self.choices).get("guard", "time")

    def loader_kwargs(self) -> Dict[str, Any]:
        """Keyword arguments for :class:`gnncompile.data.PooledLoader` (those that are set)."""
        return {k: v for k, v in self.loader if v is not None}

    def as_dict(self) -> Dict[str, Any]:
        """A JSON-friendly dict (lists for tuples)."""
        return {"knobs": {d: list(k) for d, k in self.knobs},
                "op_knobs": {f"{o}/{d}": list(k) for o, d, k in self.op_knobs},
                "inner": self.inner, "reassociate": self.reassociate, "slot_order": self.slot_order,
                "capture_dynamic": self.capture_dynamic, "structure_check": self.structure_check,
                "threads": self.threads, "loader": dict(self.loader), "choices": dict(self.choices),
                "profile": self.profile}

    def lines(self) -> List[str]:
        """One line per setting, for explain()."""
        d = self.as_dict()
        knobs = ", ".join(f"{k} {v}" for k, v in d["knobs"].items()) or "the kernels' defaults"
        out = [f"knobs: {knobs}"]
        if d["op_knobs"]:
            out.append("op knobs: " + ", ".join(f"{k} {v}" for k, v in d["op_knobs"].items()))
        inner = self.inner
        if inner == "auto":  # what choose_inner does (the backend's log and reports: what it chose)
            inner = "auto (per graph piece: inductor from AUTO_INDUCTOR_MIN_SIZE nodes + edges, else eager)"
        out += [f"inner: {inner}", f"reassociate: {self.reassociate}", f"slot order: {self.slot_order}",
                f"capture dynamic: {self.capture_dynamic}", f"structure check: {self.structure_check}",
                f"threads: {self.threads if self.threads is not None else 'as torch has it'}"]
        if self.loader:
            out.append("loader: " + ", ".join(f"{k}={v}" for k, v in self.loader))
        if self.choices:
            out.append("choices: " + ", ".join(f"{k}={v}" for k, v in self.choices))
        out.append(f"profile: {self.profile}")
        return out

    def __str__(self) -> str:
        return "; ".join(self.lines())

    # ------------------------------------------------------------------ building
    def replace(self, **changes: Any) -> "Settings":
        """A copy with ``changes`` (checked); ``knobs`` may be given as a mapping
        ``{device type: [ints]}``, ``op_knobs`` as ``{(op, device type): [ints]}``."""
        return dataclasses.replace(self, **_normalise(changes))

    @classmethod
    def from_config(cls, cfg: Optional[_config.Config] = None) -> "Settings":
        """The defaults with the configuration (environment) over them; the structure check mode
        is the process's (:func:`gnncompile.ops.structure_check`, which starts from the
        environment) unless ``cfg`` is given."""
        if cfg is None:
            from .ops.structure import structure_check  # the process-wide mode ($GNNCOMPILE_STRUCTURE_CHECK
            cfg, check = _config.current(), structure_check()  # unless set_structure_check changed it)
        else:
            check = cfg.structure_check
        choices = ((("programs", cfg.programs),) if cfg.programs != "auto" else ()) + \
                  ((("guard", cfg.guard),) if cfg.guard != "time" else ()) + \
                  ((("huge_pages", cfg.huge_pages),) if cfg.huge_pages != "auto" else ()) + \
                  ((("buffer_cache", cfg.buffer_cache),) if cfg.buffer_cache != "auto" else ()) + \
                  ((("spmm_impl", cfg.spmm_impl),) if cfg.spmm_impl != "auto" else ()) + \
                  ((("precision", cfg.precision),) if cfg.precision != "fp32" else ()) + \
                  ((("edge_encoder", cfg.edge_encoder),) if cfg.edge_encoder != "auto" else ()) + \
                  ((("cuda_unverified", cfg.cuda_unverified),) if cfg.cuda_unverified else ())
        return cls(inner=cfg.inner or "auto", slot_order=cfg.slot_order, capture_dynamic=cfg.capture_dynamic,
                   structure_check=check, choices=choices)

    @classmethod
    def build(cls, profile: Any = None, cfg: Optional[_config.Config] = None, **explicit: Any) -> "Settings":
        """defaults <- configuration <- ``profile`` (a :class:`gnncompile.profiles.Profile`, or
        None) <- ``explicit`` (``inner='auto'`` and None values leave the setting as it is)."""
        s = cls.from_config(cfg)
        if profile is not None:
            dtype = str(profile.device.get("type", "cpu"))
            prof = {"knobs": {dtype: profile.knobs}, "threads": profile.settings.get("threads"),
                    "loader": profile.loader_kwargs(),
                    "profile": getattr(profile, "label", None) or profile.path or "(defaults)"}
            if profile.inner:
                prof["inner"] = profile.inner
            chosen = {k: profile.settings[k] for k in ("spmm_impl", "precision") if profile.settings.get(k)}
            if chosen.get("precision") == "bf16" and s.precision != "bf16":
                # lower precision changes what the model computes: only the user opts in (the
                # configuration here, or an explicit choice below), never a profile alone
                del chosen["precision"]
                prof["profile"] += (" (its precision 'bf16' not applied: lower precision is opt-in, "
                                    "choices['precision'] = 'bf16' or GNNCOMPILE_PRECISION=bf16)")
            if chosen:
                prof["choices"] = {**dict(s.choices), **chosen}
            s = s.replace(**prof)
        given = {k: v for k, v in explicit.items() if v is not None and not (k == "inner" and v == "auto")}
        return s.replace(**given) if given else s


def _normalise(changes: Mapping[str, Any]) -> Dict[str, Any]:
    out = dict(changes)
    if isinstance(out.get("knobs"), Mapping):
        out["knobs"] = tuple((d, tuple(k)) for d, k in out["knobs"].items())
    if isinstance(out.get("op_knobs"), Mapping):
        out["op_knobs"] = tuple((o, d, tuple(k)) for (o, d), k in out["op_knobs"].items())
    for key in ("loader", "choices"):
        if isinstance(out.get(key), Mapping):
            out[key] = tuple(out[key].items())
    return out


DEFAULT = Settings()

__all__ = ["Settings", "DEFAULT", "OPS", "SPMM_IMPLS"]
