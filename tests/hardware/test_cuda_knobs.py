"""The default launch-knob rule of the CUDA kernels (gnncompile/hardware/cuda_knobs.py, mirrored from
native/cuda/knobs.h). Runs on the CPU: the rule takes a dict of device properties."""
from __future__ import annotations

import subprocess
import textwrap

import pytest

from gnncompile.hardware import cuda_knobs as ck

# What torch.cuda.get_device_properties reports for these parts (names as torch spells them).
T4 = {"name": "Tesla T4", "major": 7, "minor": 5, "multi_processor_count": 40,
      "L2_cache_size": 4 * 2**20, "max_threads_per_multi_processor": 1024}
A100 = {"name": "NVIDIA A100-SXM4-80GB", "major": 8, "minor": 0, "multi_processor_count": 108,
        "L2_cache_size": 40 * 2**20, "max_threads_per_multi_processor": 2048}
H100 = {"name": "NVIDIA H100 80GB HBM3", "major": 9, "minor": 0, "multi_processor_count": 132,
        "L2_cache_size": 50 * 2**20, "max_threads_per_multi_processor": 2048}
DEVICES = {"T4": T4, "A100": A100, "H100": H100}


@pytest.mark.parametrize("dev", list(DEVICES))
def test_layout_for_common_widths(dev):
    props = DEVICES[dev]
    # float32, 128 features: float4 loads, a full warp covers the row, 256-thread blocks.
    assert ck.default_knobs(props, 128, 10.0) == [32, 8, 4, 0]
    # 16 features: 4 lanes of float4 per row, 64 rows per block.
    assert ck.default_knobs(props, 16, 10.0) == [4, 64, 4, 0]
    # An odd width cannot use vectors: scalar loads, 8 lanes cover 7 features.
    assert ck.default_knobs(props, 7, 3.0) == [8, 32, 1, 0]
    # 2 * odd: float2.
    assert ck.default_knobs(props, 6, 3.0) == [4, 64, 2, 0]
    # Wider than one warp pass: 32 lanes, the kernel adds feature tiles.
    assert ck.default_knobs(props, 1024, 3.0) == [32, 8, 4, 0]
    # 16-bit: 8 elements (16 bytes) per lane; 12 halves only allow half2.
    assert ck.default_knobs(props, 128, 10.0, elem_bytes=2) == [16, 16, 8, 0]
    assert ck.default_knobs(props, 12, 10.0, elem_bytes=2) == [8, 32, 2, 0]
    # float64: double2.
    assert ck.default_knobs(props, 64, 10.0, elem_bytes=8) == [32, 8, 2, 0]
    # Per-head weights: vectors must not straddle heads (8 heads of 6 features -> float2).
    assert ck.default_knobs(props, 48, 10.0, heads=8) == [32, 8, 2, 0]


def test_block_size_follows_threads_per_sm():
    # An sm_86-like part (1536 threads per SM) still gets 256-thread blocks; a part reporting
    # 512 threads per SM gets 128.
    ga102 = {"major": 8, "minor": 6, "multi_processor_count": 84, "L2_cache_size": 6 * 2**20}
    assert ck.threads_per_sm(ck.normalize_props(ga102)) == 1536
    assert ck.default_knobs(ga102, 128, 5.0) == [32, 8, 4, 0]
    small = dict(ga102, max_threads_per_multi_processor=512)
    assert ck.default_knobs(small, 128, 5.0) == [32, 4, 4, 0]
    # Without max_threads the compute capability decides (7.5 -> 1024).
    t4 = {k: v for k, v in T4.items() if k != "max_threads_per_multi_processor"}
    assert ck.threads_per_sm(ck.normalize_props(t4)) == 1024


def test_items_per_group_rule():
    M, avg = 1_000_000, 10.0
    E = 10_000_000
    work = M + E
    # H100, float32, 128 features, sum: K_l2 (scratch in half the 50 MB L2) dominates.
    k_l2 = -(-4 * work * 128 * 4 // (50 * 2**20))
    assert ck.default_knobs(H100, 128, avg, num_rows=M)[3] == k_l2 == 430
    # A100 (40 MB L2): more items per group.
    assert ck.default_knobs(A100, 128, avg, num_rows=M)[3] == -(-4 * work * 512 // (40 * 2**20)) == 538
    # T4 (4 MB L2): capped at 4096.
    assert ck.default_knobs(T4, 128, avg, num_rows=M)[3] == 4096
    # max/min also keep an int64 slot per feature: twice-and-a-half the scratch.
    assert ck.default_knobs(H100, 128, avg, num_rows=M, reduce="max")[3] == -(-4 * work * 128 * 12 // (50 * 2**20))
    # A small graph: the degree bound (8 * (avg + 1)) or the floor of 32.
    assert ck.default_knobs(H100, 16, 4.0, num_rows=2708)[3] == 40
    assert ck.default_knobs(H100, 16, 1.0, num_rows=100)[3] == 32
    # A huge graph with narrow rows (1 lane per row): each bound, then the largest.
    k = ck.default_knobs(H100, 4, 2.0, num_rows=50_000_000)
    assert k[:3] == [1, 256, 4]
    k_deg, k_l2 = 24, -(-4 * 150_000_000 * 16 // (50 * 2**20))
    k_fill = 150_000_000 // (132 * 2048 * 4)
    assert (k_l2, k_fill) == (184, 138)
    assert k[3] == max(k_deg, k_l2, k_fill)
    # The four-waves bound wins once the scratch is small: edge_dot keeps none.
    assert ck.edge_dot_knobs(H100, 50_000_000, 100_000_000, 4)[3] == k_fill


def test_explicit_and_profile_knobs():
    # Explicit knobs win; rows_per_block follows an explicit lanes_per_row.
    assert ck.default_knobs(H100, 128, 10.0, knobs=[8]) == [8, 32, 4, 0]
    assert ck.knobs_for(H100, 128, 10.0, {"knobs": [16, 2, 0, 512]}) == [16, 2, 4, 512]
    assert ck.knobs_for(H100, 128, 10.0, None) == ck.default_knobs(H100, 128, 10.0)
    # Lanes are rounded down to a power of two, blocks to whole warps.
    assert ck.default_knobs(H100, 128, 10.0, knobs=[12, 3])[:2] == [8, 4]
    # A vector width that the features do not allow falls back.
    assert ck.default_knobs(H100, 6, 10.0, knobs=[0, 0, 4])[2] == 2
    # Misaligned rows fall back to narrower loads.
    assert ck.pick_vec(4, 4, 128, align_bytes=8) == 2
    assert ck.pick_vec(8, 2, 128, align_bytes=4) == 2


def test_explicit_knobs_are_bounded():
    """A profile may hold any knob: no overflow, a launchable grid, bounded scratch."""
    M, E = 1_000_000, 50_000_000
    # K = 32 tuned on a small graph: on this one the scratch would be 2 * (M + E) / 32 slots of
    # 128 accumulators + 128 int64 (max) = 9.8 GB; raised until it fits one slot per output row.
    k = ck.spmm_knobs(H100, M, E, 128, reduce="max", knobs=[0, 0, 0, 32])
    assert k[3] == 102
    groups = -(-(M + E) // k[3])
    assert 2 * groups <= M
    # On a small graph the same K stays (its scratch is under 64 MiB): tests cut every row.
    assert ck.spmm_knobs(H100, 25, 500, 128, reduce="max", knobs=[1, 32, 1, 1])[3] == 1
    # Huge values are clamped, never overflow.
    huge = 2 ** 62
    assert ck.spmm_knobs(H100, M, E, 128, knobs=[huge, huge, huge, huge]) == [32, 8, 4, 1 << 20]
    # Narrow lanes and vectors on wide rows: lanes grow until the feature tiles fit the grid.
    k = ck.spmm_knobs(H100, 100, 1000, 200_000, knobs=[1, 0, 1, 0])
    assert k[0] == 4 and k[2] == 1 and -(-200_000 // (k[0] * k[2])) <= ck.MAX_GRID_Y
    # edge_softmax's K too (2 * 4 heads * 4 bytes per slot: the 64 MiB floor decides).
    assert ck.edge_softmax_knobs(H100, M, E, 4, knobs=[0, 0, 0, 1])[3] == -(-2 * (M + E) * 32 // (64 << 20)) == 49
    # edge_dot keeps no scratch: any K from 1 up.
    assert ck.edge_dot_knobs(H100, M, E, 64, knobs=[0, 0, 0, 1])[3] == 1


def test_edge_op_knobs():
    assert ck.edge_softmax_knobs(H100, 1000, 10000, 4)[:3] == [32, 8, 1]
    assert ck.edge_dot_knobs(H100, 1000, 10000, 64, heads=8)[:3] == [16, 16, 4]


# ------------------------------------------------------------------ C++ and Python agree
_HARNESS = textwrap.dedent("""
    #include <cstdio>
    #include "cuda/knobs.h"
    using namespace gnncompile::gpu;
    int main() {
      int sm, mt, ma, mi, eb, arg, op; long long l2, M, E, F, H, al, k0, k1, k2, k3;
      while (std::scanf("%d %lld %d %d %d %lld %lld %lld %lld %d %d %lld %d %lld %lld %lld %lld",
                        &sm, &l2, &ma, &mi, &mt, &M, &E, &F, &H, &eb, &arg, &al, &op,
                        &k0, &k1, &k2, &k3) == 17) {
        DeviceProps d; d.sm_count = sm; d.l2_bytes = l2; d.cc_major = ma; d.cc_minor = mi;
        d.max_threads_per_sm = mt;
        const int64_t knobs[4] = {k0, k1, k2, k3};
        LaunchKnobs k;
        if (op == 0) k = spmm_knobs(d, knobs, 4, M, E, F, F / H, eb, eb == 8 ? 8 : 4, arg != 0, al);
        else if (op == 1) k = edge_dot_knobs(d, knobs, 4, M, E, F, F / H, eb, al);
        else k = edge_softmax_knobs(d, knobs, 4, M, E, H, eb == 8 ? 8 : 4);
        std::printf("%d %d %d %lld\\n", k.lanes, k.rows_per_block, k.vec, (long long)k.items);
      }
      return 0;
    }
""")


def test_cpp_rule_matches_python(build_host_harness):
    exe = build_host_harness(_HARNESS)
    cases = []
    for props in (T4, A100, H100, {"major": 8, "minor": 6, "multi_processor_count": 84,
                                   "L2_cache_size": 6 * 2**20}):
        p = ck.normalize_props(props)
        for M, E in ((0, 0), (2708, 10556), (1_000_000, 10_000_000), (50_000_000, 100_000_000), (7, 3)):
            for F, H in ((128, 1), (7, 1), (16, 1), (1024, 1), (48, 8), (12, 3), (6, 1), (200_000, 1)):
                for eb in (4, 2, 8):
                    for red in ("sum", "max"):
                        for align in (16, 8, 4):
                            for knobs in ((0, 0, 0, 0), (8, 0, 0, 0), (12, 3, 2, 100), (0, 0, 8, 0),
                                          (1, 1, 1, 32), (2 ** 62, 2 ** 62, 2 ** 62, 2 ** 62)):
                                for op in (0, 1, 2):
                                    cases.append((p, M, E, F, H, eb, red, align, knobs, op))
    lines = []
    for p, M, E, F, H, eb, red, align, knobs, op in cases:
        lines.append(" ".join(str(v) for v in (
            p["sm_count"], p["l2_bytes"], p["major"], p["minor"], p["max_threads_per_sm"], M, E, F, H, eb,
            int(red == "max"), align, op, *knobs)))
    res = subprocess.run([str(exe)], input="\n".join(lines) + "\n", check=True, capture_output=True, text=True)
    got = [list(map(int, line.split())) for line in res.stdout.strip().splitlines()]
    assert len(got) == len(cases)
    for case, cpp in zip(cases, got):
        p, M, E, F, H, eb, red, align, knobs, op = case
        if op == 0:
            py = ck.spmm_knobs(p, M, E, F, heads=H, elem_bytes=eb, reduce=red, align_bytes=align, knobs=knobs)
        elif op == 1:
            py = ck.edge_dot_knobs(p, M, E, F, heads=H, elem_bytes=eb, align_bytes=align, knobs=knobs)
        else:
            py = ck.edge_softmax_knobs(p, M, E, H, elem_bytes=eb, knobs=knobs)
        assert py == cpp, (case, py, cpp)
