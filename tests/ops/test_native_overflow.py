"""Size and knob arithmetic in the native CPU glue must not overflow int64 (issue 14, points
1 and 2): an absurd knob or a size / offset near 2^63 raises a clear exception or is clamped,
never a crash, an out-of-bounds read or write, or a silently wrong result."""
from __future__ import annotations

import subprocess
import textwrap

import pytest
import torch

ops = torch.ops.gnncompile
I64_MAX = 2**63 - 1


@pytest.fixture
def native_cpu(native):
    for op in ("build_csr", "spmm", "edge_dot", "edge_softmax", "collate_rows", "segment_ids"):
        if not torch._C._dispatch_has_kernel_for_dispatch_key(f"gnncompile::{op}", "CPU"):
            pytest.skip(f"no native CPU kernel registered for gnncompile::{op}")
    return native


@pytest.fixture
def two_threads():
    """The parallel row split runs only with more than one thread."""
    old = torch.get_num_threads()
    torch.set_num_threads(2)
    yield
    torch.set_num_threads(old)


def _long(*v):
    return torch.tensor(v, dtype=torch.long)


# ----------------------------------------------------------------------------- knobs
@pytest.mark.parametrize("knob", [2**62, 2**62 + 2**61, I64_MAX, 4097, 4096, 0, -1, -(2**63)],
                         ids=lambda k: f"knob={k}")
def test_absurd_cpu_knob_is_clamped_not_a_crash(native_cpu, two_threads, knob):
    """knobs[0] x threads overflowed in the chunk count: [2**62] at 2 threads segfaulted. Any
    knob now gives the result of the default knobs (it only changes the work split)."""
    g = torch.Generator().manual_seed(0)
    E, N = 600, 90
    ei = torch.randint(0, N, (2, E), generator=g)
    rowptr, col, perm = ops.build_csr(ei[1], ei[0], N, N)
    x = torch.randn(N, 5, generator=g)
    w = torch.randn(E, generator=g)
    s = torch.randn(E, 2, generator=g)
    for reduce in ("sum", "max"):
        want = ops.spmm(rowptr, col, perm, w, x, reduce, [])
        got = ops.spmm(rowptr, col, perm, w, x, reduce, [knob])
        torch.testing.assert_close(got, want, rtol=0, atol=0)
    torch.testing.assert_close(ops.edge_softmax(rowptr, perm, s, [knob]), ops.edge_softmax(rowptr, perm, s, []))
    torch.testing.assert_close(ops.edge_dot(rowptr, col, perm, x, x, 1, [knob]),
                               ops.edge_dot(rowptr, col, perm, x, x, 1, []))


_SPLIT_HARNESS = textwrap.dedent("""
    #include <cstdio>
    #include <cstdint>
    #include <vector>
    #include "cpu/rows_core.h"
    // stdin: num_rows num_chunks rowptr_0 .. rowptr_M; stdout: bounds_0 .. bounds_chunks
    int main() {
      long long m, n;
      while (std::scanf("%lld %lld", &m, &n) == 2) {
        std::vector<int64_t> rp(m + 1), bounds(n + 1);
        for (auto& v : rp) { long long t; std::scanf("%lld", &t); v = t; }
        gnncompile::cpu::balanced_row_split(rp.data(), m, n, bounds.data());
        for (auto b : bounds) std::printf("%lld ", static_cast<long long>(b));
        std::printf("\\n");
      }
      return 0;
    }
""")


def _expected_split(rowptr, chunks):
    """Chunk k starts at the smallest row whose cost (row + rowptr[row]) reaches
    floor(total * k / chunks), total = rows + edges (Python ints: no overflow)."""
    m = len(rowptr) - 1
    total = m + rowptr[-1]
    out = [0]
    for k in range(1, chunks):
        target = total * k // chunks
        out.append(next((r for r in range(out[-1], m) if r + rowptr[r] >= target), m))
    return out + [m]


def test_row_split_targets_do_not_overflow(build_host_harness):
    """balanced_row_split formed total * k, which overflows for a large graph cut into many
    chunks (here: a few rows holding 2^60-ish edges, the arithmetic of a 2^40-edge graph on
    2^23 chunks); the chunk bounds must still be the exact ones."""
    exe = build_host_harness(_SPLIT_HARNESS)
    cases = [
        [0, 2**60, 2**61, 3 * 2**60, 2**62],
        [0, 1, 2, 3, 4, 5, 2**62 - 3, 2**62 - 2, 2**62 - 1, 2**62],
        [0] * 6 + [I64_MAX - 10],
        [0, 5, 9, 20, 20, 21, 40],  # small: same as before
    ]
    lines, want = [], []
    for rowptr in cases:
        m = len(rowptr) - 1
        for chunks in range(1, m + 1):
            lines.append(" ".join(map(str, [m, chunks, *rowptr])))
            want.append(_expected_split(rowptr, chunks))
    res = subprocess.run([str(exe)], input="\n".join(lines) + "\n", check=True, capture_output=True,
                         text=True)
    got = [[int(v) for v in line.split()] for line in res.stdout.strip().splitlines()]
    assert got == want


# ----------------------------------------------------------------------------- collation
def test_collate_rows_span_near_int64_max_raises(native_cpu):
    """starts[g] + sizes[g] overflowed to a negative number and passed `<= T`: the copy then
    read from values + 8 * (2^63 - 1) (wrapping to before the buffer)."""
    values = torch.arange(10.0)
    out = torch.full((10,), -1.0)
    for start, size in [(I64_MAX, 1), (2**62, 2**62), (I64_MAX - 3, 5), (3, I64_MAX)]:
        with pytest.raises(IndexError, match="spans rows"):
            ops.collate_rows(values, _long(start), _long(size), _long(0), out, None)
    assert bool((out == -1).all()), "nothing may be written when the input is refused"


def test_collate_rows_and_segment_ids_totals_near_int64_max_raise(native_cpu):
    """The sizes of the batch summed past 2^63 wrapped to a small total that passed the capacity
    check: segment_ids then wrote `batch` ids through a wrapped pointer."""
    big = 2**62
    out = torch.full((3,), -7, dtype=torch.long)
    ptr = torch.full((6,), -7, dtype=torch.long)
    for sizes in ([big, big, 1], [big, big, big, big - 1, 5], [I64_MAX, 1], [2, I64_MAX]):
        idx = torch.arange(len(sizes))
        with pytest.raises(ValueError, match="the batch needs more ids than out holds"):
            ops.segment_ids(_long(*sizes), idx, out, ptr)
    assert bool((out == -7).all()) and bool((ptr == -7).all())
    values = torch.arange(8.0)
    with pytest.raises(ValueError, match="the batch needs more rows than out holds"):
        ops.collate_rows(values, _long(0, 0), _long(8, 8), _long(0, 1, 0), torch.zeros(20), None)


def test_collate_rows_running_inc_overflow_raises(native_cpu):
    """The running sum of incs (node offsets added to edge_index) must fit int64; the last
    graph's inc is never added, so it may be anything."""
    values = torch.arange(6)
    out = torch.zeros(6, dtype=torch.long)
    starts, sizes = _long(0, 2, 4), _long(2, 2, 2)
    with pytest.raises(ValueError, match="running sum of incs overflows int64"):
        ops.collate_rows(values, starts, sizes, _long(0, 1, 2), out, _long(I64_MAX, 1, 0))
    ops.collate_rows(values, starts, sizes, _long(0, 1), out, _long(3, I64_MAX, 0))
    assert out[:4].tolist() == [0, 1, 5, 6]


def test_build_csr_num_dst_int64_max_raises(native_cpu):
    """rowptr has num_dst + 1 entries: num_dst = 2^63 - 1 overflowed into an unreadable error."""
    ei = torch.tensor([[0], [0]])
    with pytest.raises(ValueError, match=r"num_dst \(9223372036854775807\) is too large"):
        ops.build_csr(ei[1], ei[0], I64_MAX, 1)
