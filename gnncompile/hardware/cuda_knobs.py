"""Launch knobs of the CUDA kernels: the layout and the default rule.

A line-for-line mirror of ``native/cuda/knobs.h`` (the C++ rule the kernels apply when a knob
is 0 or missing), so that the rule can be read, tested and tuned on a machine without a GPU.
Keep the two in step: ``tests/hardware/test_cuda_knobs.py`` compiles the C++ header with the host
compiler and checks that both give the same knobs.

The ops take ``knobs: int[]``; on CUDA the layout is::

    [lanes_per_row, rows_per_block, vec_width, items_per_group]

* ``lanes_per_row`` L: lanes of one warp that share a destination row (power of two <= 32).
* ``rows_per_block``: lane groups per thread block (block = L * rows_per_block threads,
  rounded to whole warps, at most 256 threads).
* ``vec_width`` V: elements per lane load (4 floats = float4, 8 halves = 16 bytes, 2 halves =
  half2, 2 doubles, ...); the kernels fall back to a narrower compiled width when the feature
  count or the alignment of the tensors does not allow it.
* ``items_per_group`` K: merge-path items (rows + edges) each lane group owns: the unit of load
  balance, and of splitting heavy rows of power-law graphs.

Default rule (F = features per node, C = features per weight column, b = bytes per element):

* V = the widest compiled width w <= 16 / b with C % w == 0 and aligned rows (compiled widths:
  4, 2, 1 for float32; 2, 1 for float64; 8, 2, 1 for float16 / bfloat16).
* L = next_pow2(ceil(F / V)), at most 32: one pass of the group covers the row's features.
* rows_per_block = block / L, block = min(256, max_threads_per_sm / 4) (max_threads_per_sm from
  the compute capability when not given: 1024 on 7.5, 1536 on 8.6 / 8.7 / 8.9, else 2048).
* K = min(4096, max(32, K_deg, K_l2, K_fill)) with
  K_deg = 8 * (avg_degree + 1) (a group writes >= 8 rows for each row it cuts),
  K_l2 = 4 * (M + E) * slot_bytes / l2_bytes (scratch for cut rows fits in half the L2),
  K_fill = (M + E) * tiles / (4 * sm_count * max_threads_per_sm / L) (four waves of groups).
  K depends on the graph size, so :func:`default_knobs` returns 0 for it (decided at launch)
  unless ``num_rows`` is given.

A device profile may override any entry: :func:`knobs_for` merges a profile's knobs (entries
> 0) over the defaults. Explicit knobs are bounded as in knobs.h: L clamped to [1, 32] before
rounding, rows_per_block to the block limit; L raised when F / (L * V) feature tiles would not
fit the grid's y dimension (65535); an explicit K clamped to [K_mem, max(2^20, K_mem)], K_mem
the smallest K whose scratch for cut rows (two slots per group) fits max(64 MiB, one slot per
output row), whatever graph the K was tuned on.
"""
from __future__ import annotations

from typing import Any, Dict, List, Mapping, Optional, Sequence

KNOB_NAMES = ("lanes_per_row", "rows_per_block", "vec_width", "items_per_group")

MAX_LANES = 32
MAX_BLOCK = 256
MIN_ITEMS = 32
MAX_ITEMS = 4096
WAVES = 4
MAX_GRID_Y = 65535
MAX_EXPLICIT_ITEMS = 1 << 20
SCRATCH_FLOOR_BYTES = 64 << 20
MAX_VEC = 16  # the cap knobs.h puts on an explicit vec_width (elements) before picking a width

# The largest explicit value of each knob that knobs.h does not clamp further (lanes and rows per
# block are clamped to these before rounding, vec_width to MAX_VEC, items_per_group to
# [K_mem, max(2^20, K_mem)]): a device profile's knobs are clamped to them when it is loaded
# (gnncompile.profiles).
EXPLICIT_KNOB_MAX = (MAX_LANES, MAX_BLOCK, MAX_VEC, MAX_EXPLICIT_ITEMS)

# Vector widths compiled for each element size, widest first (VecSet in native/cuda/common.cuh).
COMPILED_VEC = {4: (4, 2, 1), 8: (2, 1, 1), 2: (8, 2, 1)}

_ALIASES = {
    "sm_count": ("sm_count", "multi_processor_count"),
    "l2_bytes": ("l2_bytes", "L2_cache_size", "l2_cache_size"),
    "major": ("major", "cc_major"),
    "minor": ("minor", "cc_minor"),
    "max_threads_per_sm": ("max_threads_per_sm", "max_threads_per_multi_processor"),
}


def _prop(props: Any, key: str, default: int = 0) -> int:
    for name in _ALIASES[key]:
        if isinstance(props, Mapping):
            if name in props and props[name] is not None:
                return int(props[name])
        elif getattr(props, name, None) is not None:
            return int(getattr(props, name))
    return default


def normalize_props(props: Any) -> Dict[str, int]:
    """``{sm_count, l2_bytes, major, minor, max_threads_per_sm}`` from a dict (either these keys
    or torch's names: multi_processor_count, L2_cache_size, max_threads_per_multi_processor)
    or from ``torch.cuda.get_device_properties(...)``. ``max_threads_per_sm`` may be 0."""
    cc = props.get("cc") if isinstance(props, Mapping) else None
    major, minor = (int(cc[0]), int(cc[1])) if cc is not None else (_prop(props, "major"), _prop(props, "minor"))
    return {
        "sm_count": max(_prop(props, "sm_count", 1), 1),
        "l2_bytes": _prop(props, "l2_bytes"),
        "major": major,
        "minor": minor,
        "max_threads_per_sm": _prop(props, "max_threads_per_sm"),
    }


def device_props(device=None) -> Dict[str, int]:
    """The properties of a CUDA device that the rule uses (needs a GPU)."""
    import torch

    return normalize_props(torch.cuda.get_device_properties(device if device is not None else 0))


def next_pow2(v: int) -> int:
    p = 1
    while p < v:
        p <<= 1
    return p


def prev_pow2(v: int) -> int:
    p = 1
    while p * 2 <= v:
        p <<= 1
    return p


def threads_per_sm(props: Mapping[str, int]) -> int:
    if props["max_threads_per_sm"] > 0:
        return props["max_threads_per_sm"]
    if (props["major"], props["minor"]) == (7, 5):
        return 1024
    if props["major"] == 8 and props["minor"] in (6, 7, 9):
        return 1536
    return 2048


def block_threads(props: Mapping[str, int]) -> int:
    return min(MAX_BLOCK, threads_per_sm(props) // 4)


def pick_vec(wanted: int, elem_bytes: int, width: int, align_bytes: int = 16) -> int:
    """The widest compiled width <= wanted dividing ``width`` with rows aligned."""
    for w in COMPILED_VEC.get(elem_bytes, COMPILED_VEC[4]):
        if w > wanted or width % w != 0 or align_bytes % (w * elem_bytes) != 0:
            continue
        return w
    return 1


def default_lanes(num_features: int, vec: int) -> int:
    per_row = (num_features + vec - 1) // vec
    return min(MAX_LANES, next_pow2(max(per_row, 1)))


def default_items(props: Mapping[str, int], num_rows: int, num_edges: int, lanes: int, tiles: int,
                  slot_bytes: int) -> int:
    """K, the merge-path items per group (see the module docstring)."""
    avg_degree = num_edges / num_rows if num_rows > 0 else 0.0
    work = num_rows + num_edges
    k_deg = int(8.0 * (avg_degree + 1.0)) if slot_bytes > 0 else 0
    l2 = props["l2_bytes"]
    k_l2 = (4 * work * slot_bytes + l2 - 1) // l2 if slot_bytes > 0 and l2 > 0 else 0
    groups_per_sm = max(1, threads_per_sm(props) // max(lanes, 1))
    resident = max(props["sm_count"], 1) * groups_per_sm * WAVES
    k_fill = work * max(tiles, 1) // resident
    return min(MAX_ITEMS, max(MIN_ITEMS, k_deg, k_l2, k_fill))


def min_lanes_for_grid(num_features: int, vec: int) -> int:
    """Smallest L whose feature tiles of L * V fit the grid's y dimension (mirror of knobs.h)."""
    per_tile = (num_features + MAX_GRID_Y - 1) // MAX_GRID_Y
    return min(MAX_LANES, next_pow2(max((per_tile + vec - 1) // vec, 1)))


def bound_items(k: int, num_rows: int, num_edges: int, slot_bytes: int) -> int:
    """An explicit K, bounded so that the scratch of cut rows fits max(64 MiB, one slot per
    output row) (mirror of knobs.h; slot_bytes 0: no scratch)."""
    k_mem = 1
    if slot_bytes > 0:
        budget = max(SCRATCH_FLOOR_BYTES, max(num_rows, 1) * slot_bytes)
        k_mem = max(1, (2 * (num_rows + num_edges) * slot_bytes + budget - 1) // budget)
    return min(max(k, k_mem), max(MAX_EXPLICIT_ITEMS, k_mem))


def _layout(props, want_lanes: int, want_rpb: int, min_lanes: int = 1):
    lanes = max(prev_pow2(min(MAX_LANES, max(want_lanes, 1))), min_lanes)
    rpb = min(want_rpb, MAX_BLOCK) if want_rpb > 0 else block_threads(props) // lanes
    per_warp = MAX_LANES // lanes
    rpb = (max(rpb, 1) + per_warp - 1) // per_warp * per_warp
    return lanes, min(rpb, MAX_BLOCK // lanes)


def _knob(knobs: Sequence[int], i: int) -> int:
    return int(knobs[i]) if i < len(knobs) and int(knobs[i]) > 0 else 0


def spmm_knobs(props: Any, num_rows: int, num_edges: int, num_features: int, *, heads: int = 1,
               elem_bytes: int = 4, reduce: str = "sum", align_bytes: int = 16,
               knobs: Sequence[int] = ()) -> List[int]:
    """The knobs spmm launches with (mirror of ``spmm_knobs`` in knobs.h): ``[L, rows_per_block,
    V, K]``. ``knobs`` are the explicit ones (0 or missing = default)."""
    p = normalize_props(props)
    F = num_features
    C = F // max(heads, 1)
    acc_bytes = 8 if elem_bytes == 8 else 4
    want_vec = _knob(knobs, 2) or 16 // elem_bytes
    vec = pick_vec(min(want_vec, 16), elem_bytes, C, align_bytes)
    lanes, rpb = _layout(p, _knob(knobs, 0) or default_lanes(F, vec), _knob(knobs, 1),
                         min_lanes_for_grid(F, vec))
    tiles = (F + lanes * vec - 1) // (lanes * vec)
    slot_bytes = F * (acc_bytes + (8 if reduce in ("max", "min") else 0))
    items = (bound_items(_knob(knobs, 3), num_rows, num_edges, slot_bytes) if _knob(knobs, 3)
             else default_items(p, num_rows, num_edges, lanes, tiles, slot_bytes))
    return [lanes, rpb, vec, items]


def edge_dot_knobs(props: Any, num_rows: int, num_edges: int, num_features: int, *, heads: int = 1,
                   elem_bytes: int = 4, align_bytes: int = 16, knobs: Sequence[int] = ()) -> List[int]:
    """Mirror of ``edge_dot_knobs`` in knobs.h."""
    p = normalize_props(props)
    F = num_features
    C = F // max(heads, 1)
    want_vec = _knob(knobs, 2) or 16 // elem_bytes
    vec = pick_vec(min(want_vec, 16), elem_bytes, C, align_bytes)
    lanes, rpb = _layout(p, _knob(knobs, 0) or default_lanes(F, vec), _knob(knobs, 1))
    items = (bound_items(_knob(knobs, 3), num_rows, num_edges, 0) if _knob(knobs, 3)
             else default_items(p, num_rows, num_edges, lanes, 1, 0))
    return [lanes, rpb, vec, items]


def edge_softmax_knobs(props: Any, num_rows: int, num_edges: int, heads: int, *, elem_bytes: int = 4,
                       knobs: Sequence[int] = ()) -> List[int]:
    """Mirror of ``edge_softmax_knobs`` in knobs.h (one warp per group; only K is a knob)."""
    p = normalize_props(props)
    acc_bytes = 8 if elem_bytes == 8 else 4
    items = (bound_items(_knob(knobs, 3), num_rows, num_edges, 2 * heads * acc_bytes) if _knob(knobs, 3)
             else default_items(p, num_rows, num_edges, MAX_LANES, 1, 2 * heads * acc_bytes))
    return [MAX_LANES, 8, 1, items]


def default_knobs(props: Any, num_features: int, avg_degree: float, *, elem_bytes: int = 4,
                  heads: int = 1, reduce: str = "sum", num_rows: Optional[int] = None,
                  knobs: Sequence[int] = ()) -> List[int]:
    """Default spmm knobs ``[lanes_per_row, rows_per_block, vec_width, items_per_group]`` for a
    device (a dict of its properties, see :func:`normalize_props`), a feature width and an
    average in-degree. ``items_per_group`` depends on the graph size: it is 0 (derived at
    launch) unless ``num_rows`` is given, with ``num_edges = round(avg_degree * num_rows)``.
    ``knobs`` are explicit values (0 or missing = default), as the kernels read them."""
    if num_rows is None:
        out = spmm_knobs(props, 0, 0, num_features, heads=heads, elem_bytes=elem_bytes, reduce=reduce,
                         knobs=knobs)
        out[3] = _knob(knobs, 3)
        return out
    num_edges = int(round(avg_degree * num_rows))
    return spmm_knobs(props, num_rows, num_edges, num_features, heads=heads, elem_bytes=elem_bytes,
                      reduce=reduce, knobs=knobs)


def knobs_for(props: Any, num_features: int, avg_degree: float, profile: Optional[Mapping] = None,
              **kwargs) -> List[int]:
    """Knobs with a device profile's explicit entries (> 0) taking precedence over the rule.

    ``profile`` is a mapping with a ``"knobs"`` list (or the list itself), as a tuning run writes
    it; entries that are 0 or missing keep the default, and the defaults that depend on an
    overridden entry (rows_per_block on lanes_per_row, say) follow it, as in the kernels."""
    given: Sequence[int] = ()
    if profile is not None:
        given = profile.get("knobs", ()) if isinstance(profile, Mapping) else profile
    return default_knobs(props, num_features, avg_degree, knobs=list(given)[: len(KNOB_NAMES)], **kwargs)


__all__ = [
    "KNOB_NAMES", "EXPLICIT_KNOB_MAX", "normalize_props", "device_props", "default_knobs", "knobs_for",
    "spmm_knobs", "edge_dot_knobs", "edge_softmax_knobs", "default_items", "pick_vec",
]
