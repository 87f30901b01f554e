"""The launch rule of the CUDA kernels, read through its binding (gnncompile._C.launch_rule, wrapped by
gnncompile/hardware/cuda_knobs.py). The rule exists once, in native/cuda/knobs.h; every build of the
extension binds it, so this runs on the CPU: the rule takes a dict of device properties.

The expected values below are worked out by hand from knobs.h (its header comment states the rule;
the comments here show the arithmetic), for devices as torch describes T4, A100 and H100."""
from __future__ import annotations

import itertools

import pytest

from gnncompile.hardware import cuda_knobs as ck
from gnncompile import profiles
from gnncompile.ops import _native

# Without the extension (GNNCOMPILE_DISABLE_NATIVE, or no build: tests/package/test_package.py fails then) there
# is no rule to test; an extension that loads but lacks the rule fails these tests.
needs_native = pytest.mark.skipif(not _native.native_loaded(), reason="the native extension is not loaded")

# What torch.cuda.get_device_properties reports for these parts (names as torch spells them).
T4 = {"name": "Tesla T4", "major": 7, "minor": 5, "multi_processor_count": 40,
      "L2_cache_size": 4 * 2**20, "max_threads_per_multi_processor": 1024}
A100 = {"name": "NVIDIA A100-SXM4-80GB", "major": 8, "minor": 0, "multi_processor_count": 108,
        "L2_cache_size": 40 * 2**20, "max_threads_per_multi_processor": 2048}
H100 = {"name": "NVIDIA H100 80GB HBM3", "major": 9, "minor": 0, "multi_processor_count": 132,
        "L2_cache_size": 50 * 2**20, "max_threads_per_multi_processor": 2048}
DEVICES = {"T4": T4, "A100": A100, "H100": H100}
H100_L2 = 50 * 2**20


def ceil_div(a, b):
    return -(-a // b)


# ------------------------------------------------------------------ the layout and its bounds
@needs_native
def test_layout_constants():
    assert ck.KNOB_NAMES == ("lanes_per_row", "rows_per_block", "vec_width", "items_per_group")
    # kMaxLanes, kMaxBlock, kMaxExplicitVec, kMaxExplicitItems = 2^20.
    assert ck.EXPLICIT_KNOB_MAX == (32, 256, 16, 2**20)
    assert ck.COMPILED_VEC == {4: (4, 2, 1), 8: (2, 1), 2: (8, 2, 1)}


@needs_native
def test_explicit_knob_max_is_where_the_rule_clamps():
    """Each entry of EXPLICIT_KNOB_MAX is taken as it is, and anything above it gives the same
    knobs: the bound that profiles clamp to is the rule's own."""
    lanes_max, rpb_max, vec_max, items_max = ck.EXPLICIT_KNOB_MAX
    # lanes_per_row (1024 features: the default would be 32 anyway, so ask for 16 first).
    assert ck.spmm_knobs(H100, 100, 1000, 1024, knobs=[16])[0] == 16
    for k in (lanes_max, lanes_max + 1, 2**62):
        assert ck.spmm_knobs(H100, 100, 1000, 1024, knobs=[k])[0] == lanes_max
    # rows_per_block with one lane per row: the block is rows_per_block threads.
    assert ck.spmm_knobs(H100, 100, 1000, 4, knobs=[1, 64])[1] == 64
    for k in (rpb_max, rpb_max + 1, 2**62):
        assert ck.spmm_knobs(H100, 100, 1000, 4, knobs=[1, k])[1] == rpb_max
    # vec_width: any value from the widest compiled width up picks it (8 halves).
    for k in (8, vec_max, vec_max + 1, 2**62):
        assert ck.spmm_knobs(H100, 100, 1000, 128, elem_bytes=2, knobs=[0, 0, k])[2] == 8
    # items_per_group on a graph whose scratch is tiny (K_mem = 1).
    assert ck.spmm_knobs(H100, 100, 1000, 16, knobs=[0, 0, 0, items_max - 1])[3] == items_max - 1
    for k in (items_max, items_max + 1, 2**62):
        assert ck.spmm_knobs(H100, 100, 1000, 16, knobs=[0, 0, 0, k])[3] == items_max


# ------------------------------------------------------------------ the default rule, known values
@needs_native
@pytest.mark.parametrize("dev", list(DEVICES))
def test_layout_for_common_widths(dev):
    """V = widest compiled width w <= 16 / b dividing C; L = next_pow2(ceil(F / V)) <= 32;
    rows_per_block = 256 / L (all three devices have >= 1024 threads per SM: block 256)."""
    props = DEVICES[dev]
    # float32, 128 features: V = 4 (float4), ceil(128 / 4) = 32 lanes, 256 / 32 = 8 rows.
    assert ck.default_knobs(props, 128, 10.0) == [32, 8, 4, 0]
    # 16 features: V = 4, 4 lanes, 64 rows per block.
    assert ck.default_knobs(props, 16, 10.0) == [4, 64, 4, 0]
    # 7 features: neither 4 nor 2 divides 7, V = 1; next_pow2(7) = 8 lanes.
    assert ck.default_knobs(props, 7, 3.0) == [8, 32, 1, 0]
    # 6 features: V = 2, next_pow2(3) = 4 lanes.
    assert ck.default_knobs(props, 6, 3.0) == [4, 64, 2, 0]
    # 1024 features: 256 lanes wanted, capped at 32 (the kernel adds feature tiles).
    assert ck.default_knobs(props, 1024, 3.0) == [32, 8, 4, 0]
    # 16-bit, 128 features: V = 8 (16 bytes), 16 lanes; 12 halves: 8 does not divide 12, V = 2.
    assert ck.default_knobs(props, 128, 10.0, elem_bytes=2) == [16, 16, 8, 0]
    assert ck.default_knobs(props, 12, 10.0, elem_bytes=2) == [8, 32, 2, 0]
    # float64, 64 features: V = 2 (16 bytes), 32 lanes.
    assert ck.default_knobs(props, 64, 10.0, elem_bytes=8) == [32, 8, 2, 0]
    # Per-head weights: V must divide C = 48 / 8 = 6, V = 2; ceil(48 / 2) = 24 -> 32 lanes.
    assert ck.default_knobs(props, 48, 10.0, heads=8) == [32, 8, 2, 0]


@needs_native
def test_block_size_follows_threads_per_sm():
    # sm_86 without max_threads: 1536 threads per SM; block min(256, 1536 / 4) = 256.
    ga102 = {"major": 8, "minor": 6, "multi_processor_count": 84, "L2_cache_size": 6 * 2**20}
    assert ck.threads_per_sm(ga102) == 1536
    assert ck.default_knobs(ga102, 128, 5.0) == [32, 8, 4, 0]
    # 512 threads per SM reported: block 128, 4 rows of 32 lanes.
    assert ck.default_knobs(dict(ga102, max_threads_per_multi_processor=512), 128, 5.0) == [32, 4, 4, 0]
    # Without max_threads the compute capability decides: 7.5 -> 1024, 8.9 -> 1536, 9.0 -> 2048.
    t4 = {k: v for k, v in T4.items() if k != "max_threads_per_multi_processor"}
    assert ck.threads_per_sm(t4) == 1024
    assert ck.threads_per_sm({"sm_count": 1, "cc": (8, 9)}) == 1536
    assert ck.threads_per_sm({"sm_count": 1, "capability": [9, 0]}) == 2048
    assert ck.threads_per_sm(dict(t4, max_threads_per_multi_processor=768)) == 768


@needs_native
def test_items_per_group_rule():
    """K = min(4096, max(32, K_deg, K_l2, K_fill)), K_deg = 8 (avg + 1), K_l2 = ceil(4 (M + E)
    slot_bytes / l2_bytes), K_fill = (M + E) tiles / (4 sm_count threads_per_sm / L)."""
    M, avg, E = 1_000_000, 10.0, 10_000_000
    work = M + E
    # H100, float32, 128 features, sum: slot 128 * 4 bytes; K_deg 88, K_fill 11e6 / (132 * 64 * 4)
    # = 325, K_l2 = ceil(4 * 11e6 * 512 / 50 MiB) = 430 decides.
    assert ceil_div(4 * work * 512, H100_L2) == 430
    assert ck.default_knobs(H100, 128, avg, num_rows=M) == [32, 8, 4, 430]
    # A100 (40 MiB L2, 108 SMs): K_l2 = 538.
    assert ck.default_knobs(A100, 128, avg, num_rows=M)[3] == ceil_div(4 * work * 512, 40 * 2**20) == 538
    # T4 (4 MiB L2): K_l2 = 5372, capped at 4096.
    assert ck.default_knobs(T4, 128, avg, num_rows=M)[3] == 4096
    # max / min also keep an int64 per feature: slot 128 * 12 bytes, K_l2 = 1290.
    assert ck.default_knobs(H100, 128, avg, num_rows=M, reduce="max")[3] == ceil_div(4 * work * 1536, H100_L2) == 1290
    assert ck.default_knobs(H100, 128, avg, num_rows=M, reduce="amin")[3] == 1290
    assert ck.default_knobs(H100, 128, avg, num_rows=M, reduce="mean")[3] == 430
    # A small graph: the degree bound 8 * (4 + 1) = 40, or the floor of 32 (8 * (1 + 1) = 16).
    assert ck.default_knobs(H100, 16, 4.0, num_rows=2708)[3] == 40
    assert ck.default_knobs(H100, 16, 1.0, num_rows=100)[3] == 32
    # A huge graph with narrow rows (4 features: V = 4, one lane per row, 256 rows per block).
    k = ck.default_knobs(H100, 4, 2.0, num_rows=50_000_000)
    k_deg, k_l2, k_fill = 24, ceil_div(4 * 150_000_000 * 16, H100_L2), 150_000_000 // (132 * 2048 * 4)
    assert (k_l2, k_fill) == (184, 138)
    assert k == [1, 256, 4, 184]
    # The four-waves bound wins when there is no scratch: edge_dot keeps none.
    assert ck.edge_dot_knobs(H100, 50_000_000, 100_000_000, 4)[3] == k_fill
    # edge_softmax: slot 2 * 4 heads * 4 bytes; K_l2 = 27, K_deg = 88, K_fill = 11e6 / (132 * 64 * 4) = 325.
    assert ck.edge_softmax_knobs(H100, M, E, 4) == [32, 8, 1, 325]


@needs_native
def test_explicit_and_profile_knobs():
    # Explicit knobs win; rows_per_block follows an explicit lanes_per_row (256 / 8 = 32).
    assert ck.default_knobs(H100, 128, 10.0, knobs=[8]) == [8, 32, 4, 0]
    assert ck.knobs_for(H100, 128, 10.0, {"knobs": [16, 2, 0, 512]}) == [16, 2, 4, 512]
    assert ck.knobs_for(H100, 128, 10.0, [16, 2, 0, 512, 99]) == [16, 2, 4, 512]
    assert ck.knobs_for(H100, 128, 10.0, None) == ck.default_knobs(H100, 128, 10.0)
    # Negative entries are defaults, as the kernels read them.
    assert ck.default_knobs(H100, 128, 10.0, knobs=[-4, -1, -2, -3]) == [32, 8, 4, 0]
    # Lanes round down to a power of two (12 -> 8), rows per block up to whole warps (3 -> 4).
    assert ck.default_knobs(H100, 128, 10.0, knobs=[12, 3])[:2] == [8, 4]
    # A vector width the features do not allow falls back (6 features: 2).
    assert ck.default_knobs(H100, 6, 10.0, knobs=[0, 0, 4])[2] == 2
    # Misaligned rows fall back to narrower loads: float32 rows 8-byte aligned -> float2,
    # halves 4-byte aligned -> half2.
    assert ck.spmm_knobs(H100, 10, 10, 128, align_bytes=8)[2] == 2
    assert ck.spmm_knobs(H100, 10, 10, 128, elem_bytes=2, align_bytes=4)[2] == 2
    assert ck.edge_dot_knobs(H100, 10, 10, 128, align_bytes=4)[2] == 1


@needs_native
def test_explicit_knobs_are_bounded():
    """A profile may hold any knob: no overflow, a launchable grid, bounded scratch."""
    M, E = 1_000_000, 50_000_000
    # K = 32 tuned on a small graph: on this one the scratch would be 2 * (M + E) / 32 slots of
    # 128 accumulators + 128 int64 (max) = 9.8 GB; raised to K_mem = ceil(2 * 51e6 * 1536 /
    # (1e6 * 1536)) = 102, where it fits one slot per output row.
    k = ck.spmm_knobs(H100, M, E, 128, reduce="max", knobs=[0, 0, 0, 32])
    assert k[3] == 102
    assert 2 * ceil_div(M + E, k[3]) <= M
    # On a small graph the same K stays (its scratch is under 64 MiB): tests cut every row.
    assert ck.spmm_knobs(H100, 25, 500, 128, reduce="max", knobs=[1, 32, 1, 1])[3] == 1
    # Huge values are clamped, never overflow.
    huge = 2**62
    assert ck.spmm_knobs(H100, M, E, 128, knobs=[huge, huge, huge, huge]) == [32, 8, 4, 1 << 20]
    # Narrow lanes and vectors on wide rows: lanes grow until the feature tiles fit the grid's y
    # dimension: ceil(200000 / 65535) = 4 features per tile -> 4 lanes of V = 1.
    k = ck.spmm_knobs(H100, 100, 1000, 200_000, knobs=[1, 0, 1, 0])
    assert k[0] == 4 and k[2] == 1 and ceil_div(200_000, k[0] * k[2]) <= ck.MAX_GRID_Y
    # edge_softmax's K too (2 * 4 heads * 4 bytes per slot: the 64 MiB floor decides).
    assert ck.edge_softmax_knobs(H100, M, E, 4, knobs=[0, 0, 0, 1])[3] == ceil_div(2 * (M + E) * 32, 64 << 20) == 49
    # edge_dot keeps no scratch: any K from 1 up.
    assert ck.edge_dot_knobs(H100, M, E, 64, knobs=[0, 0, 0, 1])[3] == 1


@needs_native
def test_edge_op_knobs():
    # edge_softmax: one warp per group, 8 groups per block, scalar loads, whatever is asked.
    assert ck.edge_softmax_knobs(H100, 1000, 10000, 4)[:3] == [32, 8, 1]
    assert ck.edge_softmax_knobs(H100, 1000, 10000, 4, knobs=[4, 64, 4])[:3] == [32, 8, 1]
    # edge_dot, 8 heads of 8: V = 4 divides C = 8, 16 lanes cover 64 features, 256 / 16 = 16;
    # no scratch and a small graph: K = 32.
    assert ck.edge_dot_knobs(H100, 1000, 10000, 64, heads=8) == [16, 16, 4, 32]


# ------------------------------------------------------------------ properties over a grid
GRID_DEVICES = (T4, A100, H100, {"sm_count": 84, "cc": (8, 6), "l2_bytes": 6 * 2**20}, {"sm_count": 1})


@needs_native
def test_default_knobs_are_launchable_everywhere():
    """For every device, size, type and width: L a power of two <= 32, a block of whole warps of at
    most 256 threads, V a compiled width dividing C, K in [32, 4096]."""
    for props, (M, E), (F, H), eb, red in itertools.product(
            GRID_DEVICES, ((0, 0), (7, 3), (2708, 10556), (10**6, 10**7), (5 * 10**7, 10**8)),
            ((1, 1), (6, 1), (7, 1), (48, 8), (128, 1), (1024, 1), (200_000, 1)), (2, 4, 8), ("sum", "max")):
        L, rpb, V, K = ck.spmm_knobs(props, M, E, F, heads=H, elem_bytes=eb, reduce=red)
        case = (props, M, E, F, H, eb, red)
        assert L & (L - 1) == 0 and 1 <= L <= ck.MAX_LANES, case
        assert (L * rpb) % 32 == 0 and L * rpb <= ck.MAX_BLOCK, case
        assert V in ck.COMPILED_VEC[eb] and (F // H) % V == 0, case
        assert ceil_div(F, L * V) <= ck.MAX_GRID_Y, case
        assert ck.MIN_ITEMS <= K <= ck.MAX_ITEMS, case


@needs_native
def test_items_grow_with_the_graph_and_shrink_with_the_device():
    sizes = [(10**k, 10 * 10**k) for k in range(2, 9)]  # the same average degree
    for props in GRID_DEVICES:
        ks = [ck.spmm_knobs(props, M, E, 128)[3] for M, E in sizes]
        assert ks == sorted(ks) and ks[0] < ks[-1], (props, ks)
    # More L2 or more SMs: never a larger K; at 10^7 rows both bounds move it.
    M, E = 10**7, 10**8
    by_l2 = [ck.spmm_knobs(dict(H100, L2_cache_size=mb * 2**20), M, E, 128)[3] for mb in (4, 16, 64, 256, 1024)]
    assert by_l2 == sorted(by_l2, reverse=True) and by_l2[0] > by_l2[-1], by_l2
    by_sms = [ck.edge_dot_knobs(dict(H100, multi_processor_count=n), M, E, 128)[3] for n in (1, 8, 64, 512)]
    assert by_sms == sorted(by_sms, reverse=True) and by_sms[0] > by_sms[-1], by_sms


@needs_native
def test_explicit_items_keep_the_scratch_bounded():
    """An explicit K is raised to K_mem: 2 * (M + E) / K slots fit max(64 MiB, one per output row)."""
    for (M, E), F, red, K in itertools.product(((10**3, 10**4), (10**6, 5 * 10**7), (10**5, 10**9)),
                                               (4, 128, 1024), ("sum", "max"), (1, 32, 4096)):
        got = ck.spmm_knobs(H100, M, E, F, reduce=red, knobs=[0, 0, 0, K])[3]
        slot = F * (4 + (8 if red == "max" else 0))
        assert got >= K and 2 * ((M + E) // got) * slot <= max(64 << 20, M * slot), (M, E, F, red, K, got)


# ------------------------------------------------------------------ bad input
@needs_native
@pytest.mark.parametrize("call,match", [
    (lambda: ck.spmm_knobs(H100, -1, 10, 16), r"num_rows must be >= 0, got -1"),
    (lambda: ck.spmm_knobs(H100, 10, -5, 16), r"num_edges must be >= 0, got -5"),
    (lambda: ck.spmm_knobs(H100, 10, 10, -16), r"num_features must be >= 0, got -16"),
    (lambda: ck.edge_dot_knobs(H100, -1, 10, 16), r"num_rows must be >= 0"),
    (lambda: ck.edge_softmax_knobs(H100, 10, -1, 4), r"num_edges must be >= 0"),
    (lambda: ck.edge_softmax_knobs(H100, 10, 10, 0), r"heads must be >= 1, got 0"),
    (lambda: ck.spmm_knobs(H100, 10, 10, 16, heads=0), r"heads must be >= 1, got 0"),
    (lambda: ck.spmm_knobs(H100, 10, 10, 16, heads=3), r"num_features = 16 is not a multiple of heads = 3"),
    (lambda: ck.spmm_knobs(dict(H100, multi_processor_count=0), 10, 10, 16), r"sm_count'\] must be in \[1, "),
    (lambda: ck.spmm_knobs(dict(H100, multi_processor_count=-3), 10, 10, 16), r"sm_count'\] must be in \[1, "),
    (lambda: ck.spmm_knobs({"major": 9, "minor": 0}, 10, 10, 16), r"sm_count is required"),
    (lambda: ck.spmm_knobs(dict(H100, L2_cache_size=-1), 10, 10, 16), r"l2_bytes'\] must be in \[0, "),
    (lambda: ck.spmm_knobs(dict(H100, max_threads_per_multi_processor=-1), 10, 10, 16), r"max_threads_per_sm"),
    (lambda: ck.spmm_knobs(H100, 10, 10, 16, elem_bytes=0), r"elem_bytes must be 2, 4 or 8"),
    (lambda: ck.spmm_knobs(H100, 10, 10, 16, elem_bytes=3), r"elem_bytes must be 2, 4 or 8"),
    (lambda: ck.edge_softmax_knobs(H100, 10, 10, 2, elem_bytes=16), r"elem_bytes must be 2, 4 or 8"),
    (lambda: ck.spmm_knobs(H100, 10, 10, 16, align_bytes=0), r"align_bytes must be a power of two"),
    (lambda: ck.spmm_knobs(H100, 10, 10, 16, align_bytes=12), r"align_bytes must be a power of two"),
    (lambda: ck.spmm_knobs(H100, 10, 10, 16, reduce="prod"), r"unknown reduce 'prod'"),
    (lambda: ck.spmm_knobs(H100, 10, 10, ck.MAX_SPMM_FEATURES + 1), r"more than the CUDA spmm supports"),
    (lambda: ck.spmm_knobs(H100, 2**62, 2**62, 16), r"too large for the launch rule's int64 arithmetic"),
    (lambda: ck.edge_dot_knobs(H100, 2**40, 2**40, 2**30), r"too large for the launch rule's int64 arithmetic"),
    (lambda: ck.edge_softmax_knobs(H100, 2**50, 2**50, 2**20), r"too large for the launch rule's int64"),
])
def test_bad_arguments_raise_value_error(call, match):
    with pytest.raises(ValueError, match=match):
        call()


@needs_native
@pytest.mark.parametrize("call", [
    lambda: ck.spmm_knobs(dict(H100, multi_processor_count=1.5), 10, 10, 16),
    lambda: ck.spmm_knobs(dict(H100, multi_processor_count=True), 10, 10, 16),
    lambda: ck.spmm_knobs(dict(H100, L2_cache_size="50MB"), 10, 10, 16),
    lambda: ck.spmm_knobs(H100, 10.0, 10, 16),
    lambda: ck.spmm_knobs(H100, 2**64, 10, 16),
    lambda: ck.spmm_knobs(H100, 10, 10, 16, knobs=[2**70]),
    lambda: ck.spmm_knobs(H100, 10, 10, 16, knobs=[1.5]),
    lambda: ck.spmm_knobs(H100, 10, 10, 16, reduce=None),
    lambda: ck.spmm_knobs(H100, 10, 10, 16, lanes=4),  # not an option
])
def test_ill_typed_arguments_raise_type_error(call):
    with pytest.raises(TypeError):
        call()


@needs_native
def test_the_binding_checks_its_props_dict():
    rule = _native._C.launch_rule
    assert rule.spmm_knobs({"sm_count": 132}, 10, 10, 16) == [4, 64, 4, 32]
    with pytest.raises(ValueError, match=r"unknown key 'major'.*expected sm_count, l2_bytes, cc_major"):
        rule.spmm_knobs({"sm_count": 132, "major": 9}, 10, 10, 16)
    with pytest.raises(ValueError, match=r"props\['cc_major'\] = \d+ does not fit in int64"):
        rule.spmm_knobs({"sm_count": 132, "cc_major": 2**80}, 10, 10, 16)
    with pytest.raises(ValueError, match=r"props\['l2_bytes'\] must be in \[0, 2147483647\]"):
        rule.spmm_knobs({"sm_count": 132, "l2_bytes": 2**40}, 10, 10, 16)


# ------------------------------------------------------------------ without the extension
def test_without_the_extension_the_rule_says_why(monkeypatch):
    monkeypatch.setattr(_native, "_C", None)
    monkeypatch.setattr(_native, "LOAD_ERROR", "disabled by GNNCOMPILE_DISABLE_NATIVE")
    assert not ck.available()
    with pytest.raises(ck.LaunchRuleUnavailable, match=r"native/cuda/knobs.h.*not loaded.*GNNCOMPILE_DISABLE_NATIVE"):
        ck.spmm_knobs(H100, 10, 10, 16)
    with pytest.raises(ck.LaunchRuleUnavailable):
        ck.EXPLICIT_KNOB_MAX
    with pytest.raises(AttributeError):
        ck.NOT_A_CONSTANT
    # Profiles still load: no kernel reads the knobs, so they are only checked to be ints >= 0.
    assert profiles.knob_ranges("cuda") is None
    assert profiles.knob_ranges("cpu") == [(0, profiles.CPU_MAX_CHUNKS_PER_THREAD), (0, profiles.CPU_MAX_PREFETCH_DISTANCE),
                                           (0, profiles.CPU_MAX_BLOCK_BUDGET_KIB)]
    settings, notes = profiles.check_settings({"knobs": [64, 10**6, 2**40, 2**62, 7]}, {"logical_cpus": 2}, "cuda")
    assert settings["knobs"] == [64, 10**6, 2**40, 2**62, 7] and notes == []
    with pytest.raises(profiles.ProfileError, match=r"settings.knobs\[1\] must be an int >= 0"):
        profiles.check_settings({"knobs": [1, -1]}, {"logical_cpus": 2}, "cuda")


def test_an_extension_without_the_rule_asks_for_a_rebuild(monkeypatch):
    monkeypatch.setattr(_native, "_C", object())
    with pytest.raises(ck.LaunchRuleUnavailable, match=r"has no launch_rule.*rebuild"):
        ck.edge_softmax_knobs(H100, 10, 10, 2)
