"""Launch knobs of the CUDA kernels, read from the one copy of their rule.

The rule lives in ``native/cuda/knobs.h`` and nowhere else: the CUDA kernels apply it at launch,
and every build of the native extension (the CPU-only one too: the rule is plain host C++)
binds it as ``gnncompile._C.launch_rule`` (``native/common/launch_rule.cpp``). This module only
translates device properties and arguments for that binding; every number here (the knobs,
their names, their bounds) comes from the extension. Without the extension it raises
:class:`LaunchRuleUnavailable` (no kernel reads the knobs then: every op runs its pure-torch
reference).

The ops take ``knobs: int[]``; on CUDA the layout is :data:`KNOB_NAMES`::

    [lanes_per_row, rows_per_block, vec_width, items_per_group]

* ``lanes_per_row`` L: lanes of one warp that share a destination row (a power of two).
* ``rows_per_block``: lane groups per thread block (rounded to whole warps).
* ``vec_width`` V: elements per lane load (the kernels fall back to a narrower compiled width
  when the feature count or the alignment of the tensors does not allow it).
* ``items_per_group`` K: merge-path items (rows + edges) each lane group owns: the unit of load
  balance, and of splitting heavy rows of power-law graphs.

An entry that is 0 or missing takes the default, which knobs.h derives from the device (SM
count, threads per SM, L2 size), the feature width and the graph size; the header comment of
knobs.h states the rule. Explicit entries are bounded there too: :data:`EXPLICIT_KNOB_MAX` holds
the largest value of each that the rule does not clamp further, and device profiles clamp their
knobs to it (:mod:`gnncompile.profiles`).

Device properties are a dict (``sm_count``, ``l2_bytes``, ``major`` / ``minor`` or ``cc``,
``max_threads_per_sm``; torch's names multi_processor_count, L2_cache_size,
max_threads_per_multi_processor and :func:`gnncompile.hardware.detect`'s ``capability`` are
understood) or what ``torch.cuda.get_device_properties`` returns; see :func:`normalize_props`.
"""
from __future__ import annotations

from typing import Any, Dict, List, Mapping, Optional, Sequence

from ..ops import _native


class LaunchRuleUnavailable(RuntimeError):
    """The native extension, which holds the launch rule, is not loaded."""


def _rule():
    """``gnncompile._C.launch_rule``, or :class:`LaunchRuleUnavailable` saying why not."""
    if _native._C is None:
        raise LaunchRuleUnavailable(
            "the CUDA launch rule (native/cuda/knobs.h) is read from the native extension "
            f"gnncompile._C, which is not loaded ({_native.LOAD_ERROR})")
    rule = getattr(_native._C, "launch_rule", None)
    if rule is None:
        raise LaunchRuleUnavailable(
            f"the loaded extension {getattr(_native._C, '__file__', 'gnncompile._C')} has no launch_rule: "
            "it predates it; rebuild it (`make install`)")
    return rule


def available() -> bool:
    """Whether the launch rule can be read (the native extension is loaded and has it)."""
    try:
        _rule()
    except LaunchRuleUnavailable:
        return False
    return True


# The constants of knobs.h, as the binding exports them: read on first use, so that importing
# gnncompile without its extension still works.
_CONSTANTS = ("KNOB_NAMES", "EXPLICIT_KNOB_MAX", "MAX_LANES", "MAX_BLOCK", "MAX_VEC", "MIN_ITEMS", "MAX_ITEMS",
              "MAX_EXPLICIT_ITEMS", "WAVES", "MAX_GRID_Y", "MAX_SPMM_FEATURES", "SCRATCH_FLOOR_BYTES",
              "COMPILED_VEC")


def __getattr__(name: str):
    if name in _CONSTANTS:
        return getattr(_rule(), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


# The binding's keys, and the names each is also found under.
_ALIASES = {
    "sm_count": ("sm_count", "multi_processor_count"),
    "l2_bytes": ("l2_bytes", "L2_cache_size", "l2_cache_size"),
    "cc_major": ("cc_major", "major"),
    "cc_minor": ("cc_minor", "minor"),
    "max_threads_per_sm": ("max_threads_per_sm", "max_threads_per_multi_processor"),
}


def _get(props: Any, name: str) -> Any:
    if isinstance(props, Mapping):
        return props.get(name)
    return getattr(props, name, None)


def normalize_props(props: Any) -> Dict[str, int]:
    """The device properties the rule reads, as the binding takes them: ``{sm_count, l2_bytes,
    cc_major, cc_minor, max_threads_per_sm}`` from a dict (these keys, ``major`` / ``minor``,
    ``cc`` or ``capability`` = ``[major, minor]``, or torch's names multi_processor_count,
    L2_cache_size, max_threads_per_multi_processor) or from ``torch.cuda.get_device_properties``.
    A property that is not found is left out (the binding requires ``sm_count`` and reads the
    others as 0, unknown); values are not checked here: the binding checks them."""
    out: Dict[str, int] = {}
    for key, names in _ALIASES.items():
        for name in names:
            v = _get(props, name)
            if v is not None:
                out[key] = v
                break
    cc = (_get(props, "cc") or _get(props, "capability")) if isinstance(props, Mapping) else None
    if cc is not None and "cc_major" not in out and "cc_minor" not in out:
        out["cc_major"], out["cc_minor"] = cc[0], cc[1]
    return out


def device_props(device=None) -> Dict[str, int]:
    """The properties of a CUDA device that the rule reads (needs a GPU)."""
    import torch

    return normalize_props(torch.cuda.get_device_properties(device if device is not None else 0))


def threads_per_sm(props: Any) -> int:
    """Threads per SM the rule assumes for a device."""
    return _rule().threads_per_sm(normalize_props(props))


def spmm_knobs(props: Any, num_rows: int, num_edges: int, num_features: int, **options: Any) -> List[int]:
    """The knobs spmm launches with on a device, ``[L, rows_per_block, V, K]``, for ``num_rows``
    destination rows, ``num_edges`` edges and ``num_features`` features per node. Options (as the
    binding takes them, keyword only): ``heads`` (weight columns, dividing num_features),
    ``elem_bytes`` (2, 4 or 8), ``reduce``, ``align_bytes`` (of x and out), ``knobs`` (the
    explicit ones: 0 or missing = default). Bad values raise ValueError / TypeError."""
    return list(_rule().spmm_knobs(normalize_props(props), num_rows, num_edges, num_features, **options))


def edge_dot_knobs(props: Any, num_rows: int, num_edges: int, num_features: int, **options: Any) -> List[int]:
    """The knobs edge_dot launches with (options: ``heads``, ``elem_bytes``, ``align_bytes``,
    ``knobs``)."""
    return list(_rule().edge_dot_knobs(normalize_props(props), num_rows, num_edges, num_features, **options))


def edge_softmax_knobs(props: Any, num_rows: int, num_edges: int, heads: int, **options: Any) -> List[int]:
    """The knobs edge_softmax and its backward launch with (one warp per group; only
    items_per_group is a knob; options: ``elem_bytes``, ``knobs``)."""
    return list(_rule().edge_softmax_knobs(normalize_props(props), num_rows, num_edges, heads, **options))


def default_knobs(props: Any, num_features: int, avg_degree: float, *, num_rows: Optional[int] = None,
                  knobs: Sequence[int] = (), **options: Any) -> List[int]:
    """The spmm knobs for a device, a feature width and an average in-degree. ``items_per_group``
    depends on the graph size: unless ``num_rows`` is given (with ``num_edges = round(avg_degree
    * num_rows)``) it is left to the launch: 0, or the explicit entry of ``knobs`` as given.
    Other options as in :func:`spmm_knobs`."""
    knobs = list(knobs)
    if num_rows is None:
        out = spmm_knobs(props, 0, 0, num_features, knobs=knobs, **options)
        k = _rule().KNOB_NAMES.index("items_per_group")
        out[k] = knobs[k] if len(knobs) > k and knobs[k] > 0 else 0
        return out
    return spmm_knobs(props, num_rows, int(round(avg_degree * num_rows)), num_features, knobs=knobs, **options)


def knobs_for(props: Any, num_features: int, avg_degree: float, profile: Optional[Mapping] = None,
              **kwargs: Any) -> List[int]:
    """Knobs with a device profile's explicit entries (> 0) taking precedence over the rule.

    ``profile`` is a mapping with a ``"knobs"`` list (or the list itself), as a tuning run writes
    it; entries that are 0 or missing keep the default, and the defaults that depend on an
    overridden entry (rows_per_block on lanes_per_row, say) follow it, as in the kernels."""
    given: Sequence[int] = ()
    if profile is not None:
        given = profile.get("knobs", ()) if isinstance(profile, Mapping) else profile
    return default_knobs(props, num_features, avg_degree, knobs=list(given)[: len(_rule().KNOB_NAMES)], **kwargs)


__all__ = [
    "KNOB_NAMES", "EXPLICIT_KNOB_MAX", "LaunchRuleUnavailable", "available", "normalize_props", "device_props",
    "threads_per_sm", "default_knobs", "knobs_for", "spmm_knobs", "edge_dot_knobs", "edge_softmax_knobs",
]
