"""The CPU spmm's column blocking (knobs[2], the column-block budget in KiB: native/cpu/glue.h,
spmm_core.h column_block): the walk over the structure once per column block gives the unblocked
walk's bits for every width, weight mode, reduce, dtype, forward and backward; the block width
rule; and bad knob values are refused with a clear Python error (or clamped, as the other knobs)."""
from __future__ import annotations

import subprocess
import textwrap
import warnings

import pytest
import torch

import gnncompile
from gnncompile import profiles
from gnncompile.settings import Settings

ops = torch.ops.gnncompile
N, E = 300, 3000
# budgets (KiB) over N = 300 float32 source rows: 1 KiB -> 16 features (one cache line, the
# narrowest block), 16 KiB -> 48, 32 KiB -> 96, 64 KiB -> 208; 0: no blocking
BUDGETS = [1, 16, 32, 64]


@pytest.fixture
def native_cpu(native):
    if not torch._C._dispatch_has_kernel_for_dispatch_key("gnncompile::spmm", "CPU"):
        pytest.skip("no native CPU kernel registered for gnncompile::spmm")
    return native


def _graph(seed=0):
    g = torch.Generator().manual_seed(seed)
    ei = torch.randint(0, N, (2, E), generator=g)
    ei[:, :40] = 7  # a hub and self loops
    csr = ops.build_csr(ei[1], ei[0], N, N)
    csc = ops.transpose_structure(*csr, N)
    return csr, csc, g


@pytest.mark.parametrize("F", [1, 16, 32, 33, 64, 100, 128, 256])
@pytest.mark.parametrize("weight", ["none", "edge", "head"])
def test_blocked_forward_and_backward_are_bitwise_the_unblocked(native_cpu, F, weight):
    csr, csc, g = _graph(F)
    heads = 4 if weight == "head" and F % 4 == 0 else 1
    shape = (N, heads, F // heads) if heads > 1 else (N, F)
    x = torch.randn(*shape, generator=g)
    w = None if weight == "none" else (torch.randn(E, heads, generator=g) if heads > 1 else torch.randn(E, generator=g))
    go = torch.randn(N, *shape[1:], generator=g)
    for reduce in ("sum", "mean", "max", "min"):
        want, want_arg = ops.spmm(*csr, w, x, reduce, [])
        for b in BUDGETS:
            got, got_arg = ops.spmm(*csr, w, x, reduce, [0, 0, b])
            assert torch.equal(got, want) and torch.equal(got_arg, want_arg), (reduce, b)
    # the gradient of x: the same kernel over the CSC (ops/autograd.py)
    xr = x.clone().requires_grad_()
    want = torch.autograd.grad(ops.spmm(*csr, w, xr, "sum", [], *csc)[0], xr, go)[0]
    for b in BUDGETS:
        got = torch.autograd.grad(ops.spmm(*csr, w, xr, "sum", [0, 0, b], *csc)[0], xr, go)[0]
        assert torch.equal(got, want), b
    ref = gnncompile.ops.reference.spmm(*csr, w, x, "sum")[0]
    torch.testing.assert_close(ops.spmm(*csr, w, x, "sum", [0, 0, 1])[0], ref, rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("dtype", [torch.float64, torch.bfloat16, torch.float16])
def test_blocked_other_dtypes_are_bitwise_the_unblocked(native_cpu, dtype):
    csr, _, g = _graph(1)
    x = torch.randn(N, 80, generator=g).to(dtype)
    w = torch.randn(E, generator=g).to(dtype)
    for reduce in ("sum", "max"):
        want = ops.spmm(*csr, w, x, reduce, [])
        for b in BUDGETS:
            got = ops.spmm(*csr, w, x, reduce, [4, 8, b])
            assert torch.equal(got[0], want[0]) and torch.equal(got[1], want[1]), (reduce, b)


def test_blocked_bf16_gather_is_bitwise_the_unblocked(native_cpu):
    csr, csc, g = _graph(2)
    x = torch.randn(N, 64, generator=g)
    want = ops.spmm_bf16(*csr, None, x, x.to(torch.bfloat16), "sum", [], *csc)
    for b in BUDGETS:
        assert torch.equal(ops.spmm_bf16(*csr, None, x, x.to(torch.bfloat16), "sum", [0, 0, b], *csc), want)


@pytest.mark.parametrize("knob", [2**62, 2**63 - 1, 2**22 + 1, -1, -(2**63)], ids=lambda k: f"knob={k}")
def test_absurd_block_knob_is_clamped_not_a_crash(native_cpu, knob):
    """As the other CPU knobs: a negative budget is no blocking, a huge one is clamped (one block)."""
    csr, _, g = _graph(3)
    x = torch.randn(N, 40, generator=g)
    torch.testing.assert_close(ops.spmm(*csr, None, x, "sum", [0, 0, knob]), ops.spmm(*csr, None, x, "sum", []),
                               rtol=0, atol=0)


def test_bad_block_knob_values_give_clear_errors():
    ei = torch.tensor([[0, 1], [1, 0]])
    x = torch.randn(2, 3)
    with pytest.raises(TypeError, match=r"knobs must be a list of ints >= 0"):
        gnncompile.ops.spmm(ei, x, knobs=[0, 0, -1])
    with pytest.raises(TypeError, match=r"knobs must be a list of ints >= 0"):
        gnncompile.ops.spmm(ei, x, knobs=[0, 0, 2.5])
    with pytest.raises(ValueError, match=r"must be a list of ints >= 0"):
        Settings(knobs=(("cpu", (4, 4, -8)),))
    with pytest.raises(profiles.ProfileError, match=r"knobs\[2\] must be an int >= 0"):
        profiles.check_settings({"knobs": [4, 4, -8]}, {"type": "cpu", "logical_cpus": 2})
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        out, notes = profiles.check_settings({"knobs": [4, 4, 2**30]}, {"type": "cpu", "logical_cpus": 2})
    assert out["knobs"] == [4, 4, profiles.CPU_MAX_BLOCK_BUDGET_KIB]
    assert any("knobs[2]" in n and "clamped" in n for n in notes), notes
    assert Settings(knobs=(("cpu", (4, 4, 8192)),)).knobs_for("cpu", "spmm") == [4, 4, 8192]


_WIDTH_HARNESS = textwrap.dedent("""
    #include <cstdio>
    #include "cpu/spmm_core.h"
    // stdin: budget_bytes num_src F elem_bytes; stdout: the column block
    int main() {
      long long b, n, f, e;
      while (std::scanf("%lld %lld %lld %lld", &b, &n, &f, &e) == 4)
        std::printf("%lld\\n", static_cast<long long>(gnncompile::cpu::column_block(b, n, f, e)));
      return 0;
    }
""")


def test_column_block_width_rule(build_host_harness):
    """The widest whole number of 64-byte lines whose block of x fits the budget, at least one
    line; the whole row when it fits or without a budget."""
    cases = [  # (budget bytes, rows, F, bytes per feature) -> width
        ((16 << 20, 100_000, 128, 4), 32),   # 16 MiB over 100k rows: 167 bytes -> 2 lines
        ((8 << 20, 100_000, 128, 4), 16),    # 83 bytes -> 1 line
        ((1 << 20, 1_000_000, 128, 4), 16),  # under a line: one line
        ((16 << 20, 20_000, 128, 4), 128),   # the row fits: no blocking
        ((0, 100_000, 128, 4), 128),         # no budget: no blocking
        ((16 << 20, 100_000, 128, 8), 16),   # float64: 8 per line
        ((16 << 20, 100_000, 128, 2), 64),   # bf16: 32 per line
        ((4 << 20, 100_000, 20, 4), 16),     # one line, narrower than the row
        ((16 << 20, 100_000, 20, 4), 20),    # two lines hold the row: no blocking
        ((2**62, 1, 7, 4), 7),
    ]
    exe = build_host_harness(_WIDTH_HARNESS)
    inp = "\n".join(" ".join(map(str, c)) for c, _ in cases) + "\n"
    res = subprocess.run([str(exe)], input=inp, check=True, capture_output=True, text=True)
    assert [int(v) for v in res.stdout.split()] == [w for _, w in cases]
