"""Generated message kernels with an edge encoder (side ``enc``, gnncompile/ops/program.py):
bit for bit the interpreter's numbers (native/cpu/message_core.h) for every op, reduce, dtype
and index dtype, every width class of the encoder's output (F: one unrolled sum per feature;
a divisor of F and 1: the columns once per edge), D unrolled (<= 32) and looped (33), a
transposed traversal with ``slot``; the key that the Python side and the native registry write."""
from __future__ import annotations

import pytest
import torch

from gnncompile import codegen
from gnncompile.codegen import build
from gnncompile.codegen.emit import ENC_UNROLL, emit, width_kind
from gnncompile.ops import _native
from gnncompile.ops import program as P
from gnncompile.ops import structure
from gnncompile.ops.schemas import ops
from gnncompile.testing.bits import assert_same_bits as _same
from gnncompile.testing.bits import interpreted_then_generated as _ran

pytestmark = pytest.mark.skipif(not _native.native_loaded() or build.shutil.which("c++") is None,
                                reason="needs the native module and a C++ compiler")

N_SRC, N_DST, E_ = 11, 9, 60
F = 140  # two tiles in both dtypes (128 / 64 features), not a multiple of either
I0, I1, I2, I3, I4, I5 = (P.inp(k) for k in range(6))
# inputs: 0 col x [N, F], 1 row y [M, F], 2 enc a [E, D], 3 const Wt [D, W], 4 const b [1, W],
# 5 slot s [E, 1]
SIDES = [P.COL, P.ROW, P.ENC, P.CONST, P.CONST, P.SLOT]
PROGRAMS = {
    "relu_xj_enc": P.node("relu", P.node("add", I0, I2)),
    "gated": P.node("mul", P.node("relu", P.node("add", I0, I2)), P.node("add", I1, I5)),
    # a libm call between reads of the encoder (tanh in float64): the loops are cut there and the
    # encoder read again; float32's tanh is vmath.h's, inline (one loop)
    "tanh_cut": P.node("mul", P.node("tanh", P.node("sub", I2, I1)), P.node("add", I2, I0)),
}
SHAPES = [(1, F), (3, F), (16, F), (33, F), (16, 14), (3, 1), (33, 7)]  # (D, W)


def _structure(seed=0):
    g = torch.Generator().manual_seed(seed)
    pick = torch.randperm(N_SRC * N_DST, generator=g)[:E_]
    src, dst = pick % N_SRC, pick // N_SRC
    return ops.build_csr(dst, src, N_DST, N_SRC)


def _inputs(dtype, D, W, seed=1):
    g = torch.Generator().manual_seed(seed)
    shapes = [(N_SRC, F), (N_DST, F), (E_, D), (D, W), (1, W), (E_, 1)]
    return [torch.randn(*s, dtype=dtype, generator=g) for s in shapes]


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("shape", range(len(SHAPES)))
def test_reduce_generated_equals_interpreter(gen, shape, dtype):
    """Every encoder shape in both dtypes; the reduce cycles through sum, mean, max, min (the
    reduction is the interpreter's own code, independent of the expression: test_codegen_kernels)."""
    D, W = SHAPES[shape]
    reduce = ("sum", "mean", "max", "min")[(shape + (dtype == torch.float64)) % 4]
    rowptr, col, perm = _structure()
    csr = (rowptr, col, perm) if shape % 2 else (rowptr.int(), col.int(), perm.int())
    ins = _inputs(dtype, D, W)
    for name, expr in PROGRAMS.items():
        code, consts = P.encode(expr)
        assert codegen.prepare(ins, SIDES, code, consts, F, reduce, csr[0].dtype), "the kernel was not built"
        ref, out, n = _ran(lambda: ops.message_reduce(*csr, ins, SIDES, code, consts, F, reduce, [], [], None))
        assert n == 1
        _same(ref[0], out[0])
        assert torch.equal(ref[1], out[1])


@pytest.mark.parametrize("reduce", ["sum", "mean", "max", "min"])
def test_every_reduce_with_a_per_feature_encoder(gen, reduce):
    rowptr, col, perm = _structure(1)
    ins = _inputs(torch.float32, 16, F, seed=2)
    code, consts = P.encode(PROGRAMS["gated"])
    assert codegen.prepare(ins, SIDES, code, consts, F, reduce, torch.int64)
    ref, out, n = _ran(lambda: ops.message_reduce(rowptr, col, perm, ins, SIDES, code, consts, F, reduce, [], [],
                                                  None))
    assert n == 1
    _same(ref[0], out[0])
    assert torch.equal(ref[1], out[1])


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_sum_multi_generated_equals_interpreter(gen, dtype):
    code, consts, results = P.encode_many([PROGRAMS["gated"], I2, P.node("mul", I2, I1)])
    rowptr, col, perm = _structure(2)
    for D, W in ((16, F), (33, 14), (3, 1)):
        ins = _inputs(dtype, D, W, seed=3)
        assert codegen.prepare(ins, SIDES, code, consts, F, "sum", torch.int64, op="multi", results=results)
        ref, out, n = _ran(lambda: ops.message_sum_multi(rowptr, col, perm, ins, SIDES, code, consts, results, F, [],
                                                         None))
        assert n == 1
        _same(ref, out)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_message_edges_generated_equals_interpreter(gen, dtype):
    """Both orders and both output classes, the encoder at every width class."""
    rowptr, col, perm = _structure(3)
    code, consts = P.encode(PROGRAMS["tanh_cut"])
    for (D, W), (by_slot, W_out) in zip([(16, F), (33, 14), (3, 1), (5, 7)],
                                       [(False, F), (True, F), (False, 14), (True, 1)]):
        ins = _inputs(dtype, D, W, seed=4)
        assert codegen.prepare(ins, SIDES, code, consts, F, "sum", torch.int64, op="edges", out_width=W_out,
                               by_slot=by_slot)
        ref, out, n = _ran(lambda: ops.message_edges(rowptr, col, perm, ins, SIDES, code, consts, F, W_out, by_slot,
                                                     [], [], None))
        assert n == 1
        _same(ref, out)


def test_transposed_traversal_with_slot(gen):
    """A CSC walk (the backward's form): the encoder reads edge perm_t[j], the slot input slot[j]."""
    rowptr, col, perm = _structure(4)
    t_rowptr, t_col, t_perm = structure.transpose_structure(rowptr, col, perm, N_SRC)[:3]
    inv = torch.empty_like(perm)
    inv[perm] = torch.arange(E_)
    slot = inv[t_perm]
    ins = _inputs(torch.float64, 16, F, seed=5)
    ins[0], ins[1] = torch.randn(N_DST, F, dtype=torch.float64), torch.randn(N_SRC, F, dtype=torch.float64)
    code, consts = P.encode(PROGRAMS["gated"])
    assert codegen.prepare(ins, SIDES, code, consts, F, "sum", torch.int64)
    ref, out, n = _ran(lambda: ops.message_reduce(t_rowptr, t_col, t_perm, ins, SIDES, code, consts, F, "sum", [],
                                                  [], slot))
    assert n == 1
    _same(ref[0], out[0])


def test_keys_match_the_native_registry_key():
    """The encoder's input in the key: the class of its output's width and its D (one kernel per
    D: it is a compile-time constant), as native/cpu/message_codegen.cpp writes it."""
    n = _native._C.codegen
    code, consts = P.encode(PROGRAMS["gated"])
    keys = set()
    for D, W in SHAPES:
        widths = [F, F, D, W, W, 1]
        spec = codegen.make_spec(code, consts, SIDES, widths, F, "max", torch.float64, torch.int32)
        assert spec.key() == n.key(n.reduce_op(2), True, False, code, consts, SIDES, widths, F)
        assert f"5{width_kind(W, F)}d{D}" in spec.key()
        keys.add(spec.key())
    assert len(keys) == len(SHAPES)


def test_bad_encoder_specs_are_refused():
    code, consts = P.encode(P.node("add", I0, I1))
    for sides, widths in (([P.COL, P.ENC], [8, 3]),  # no weight and bias
                          ([P.COL, P.ENC, P.EDGE, P.CONST], [8, 3, 8, 8]),  # the weight not a constant
                          ([P.COL, P.ENC, P.CONST, P.CONST], [8, 3, 3, 3]),  # W does not divide F
                          ([P.COL, P.ENC, P.CONST, P.CONST], [8, 3, 4, 2])):  # bias width differs
        with pytest.raises(ValueError, match="edge encoder at input 1"):
            codegen.make_spec(code, consts, sides, widths, 8, "sum", torch.float32, torch.int64)


def test_encoder_source():
    """On the CPU the tile's columns once per edge (encoder_core.h, the interpreter's code); the
    kernels are built with -ffp-contract=off (no product fused with a sum). On CUDA one sum per
    feature, written product by product up to ENC_UNROLL features (a loop beyond), each product
    __fmul_rn / __dmul_rn (never fused)."""
    from gnncompile.codegen import cuda
    code, consts = P.encode(PROGRAMS["relu_xj_enc"])
    spec = codegen.make_spec(code, consts, SIDES, [F, F, 16, F, F, 1], F, "sum", torch.float32, torch.int64)
    src = emit(spec)
    assert '#include "cpu/encoder_core.h"' in src
    assert "e2 = eb.e2.get(j, jlim, perm, a.num_edges, in2, 16, wt2, ew2, bs2, f0, n);" in src
    assert "encode_run<acc_t>(p2, 16, wt2 + f0, ew2, bs2 + f0, n, e2);" in emit(codegen.make_spec(
        code, consts, SIDES, [F, F, 16, F, F, 1], F, "sum", torch.float32, torch.int64, op="edges", out_width=F))
    assert "-ffp-contract=off" in build.BASE_FLAGS and "cpu/encoder_core.h" in build.HEADERS
    dev = cuda.emit_cuda(spec)
    assert ("acc_t(bs2[f]) + __fmul_rn(acc_t(p2[0]), acc_t(wt2[f])) + "
            "__fmul_rn(acc_t(p2[1]), acc_t(wt2[ew2 + f]))") in dev
    assert "15 * ew2 + f" in dev and "16 * ew2" not in dev
    D = ENC_UNROLL + 1
    looped = cuda.emit_cuda(codegen.make_spec(code, consts, SIDES, [F, F, D, F, F, 1], F, "sum", torch.float64,
                                              torch.int64))
    assert f"for (int d = 0; d < {D}; ++d) ev = ev + __dmul_rn(" in looped
    plain = emit(codegen.make_spec(*P.encode(I0), [P.COL], [F], F, "sum", torch.float32, torch.int64))
    assert "encoder_core.h" not in plain  # programs without an encoder: their sources as before


def test_prefetches_survive_compilation(tmp_path):
    """The generated prefetch_slot is always inlined: out of line, a function of loads and
    prefetches only is pure to the compiler, and its calls (whose result is unused) were deleted
    with every prefetch in them (kernels reading two or more gathered inputs had none)."""
    import shlex
    import subprocess
    code, consts = P.encode(PROGRAMS["gated"])
    spec = codegen.make_spec(code, consts, SIDES, [F, F, 16, F, F, 1], F, "sum", torch.float32, torch.int64)
    two = codegen.make_spec(*P.encode(P.node("relu", P.node("add", I0, I1))), [P.COL, P.EDGE], [F, F], F, "sum",
                            torch.float32, torch.int64)
    for s in (spec, two):
        src = tmp_path / "k.cpp"
        src.write_text(emit(s))
        argv = (shlex.split(build.compiler()) + build.module_flags() +
                ["-std=gnu++17", "-fPIC", "-ffp-contract=off", "-I", str(build.NATIVE), "-S", str(src), "-o", "-"])
        asm = subprocess.run(argv, capture_output=True, text=True, timeout=300)
        assert asm.returncode == 0, asm.stderr[-2000:]
        assert asm.stdout.count("prefetch") >= 2


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_every_column_block_of_the_encoder(gen, dtype):
    """encode_run's column blocks (native/cpu/encoder_core.h: 8, 4, 2 and 1 vectors of its
    width, a 256-bit vector, scalars) at widths that reach every one of them in both dtypes (127:
    64 + 32 + 16 + 8 + 7 float32 columns; a 64-column float64 tile, then 63 = 32 + 16 + 8 + 4 + 3;
    200: whole and partial tiles): the generated kernel's values and the interpreter's are the
    reference program.encode_edges bit for bit."""
    rowptr, col, perm = _structure(3)
    code, consts = P.encode(I0)
    sides = [P.ENC, P.CONST, P.CONST]
    for width in (127, 128, 200):
        g = torch.Generator().manual_seed(width)
        ins = [torch.randn(E_, 5, dtype=dtype, generator=g), torch.randn(5, width, dtype=dtype, generator=g),
               torch.randn(1, width, dtype=dtype, generator=g)]
        assert codegen.prepare(ins, sides, code, consts, width, "sum", rowptr.dtype, op="edges", out_width=width)
        ref, out, n = _ran(lambda: ops.message_edges(rowptr, col, perm, ins, sides, code, consts, width, width, False,
                                                     [], [], None))
        assert n == 1
        direct = P.encode_edges(*ins)
        _same(ref, direct)
        _same(out, direct)


def test_prefetch_level_of_encoder_kernels():
    """A reduction that computes an edge encoder and gathers x_j prefetches into L2 (locality 2);
    the encoder alone, a per-edge kernel and a program without an encoder into L1 (locality 0),
    as the interpreter (emit.py, measured in benchmarks/results/README.md)."""
    relu = P.encode(PROGRAMS["relu_xj_enc"])
    widths = [F, F, 16, F, F, 1]
    fused = codegen.make_spec(*relu, SIDES, widths, F, "sum", torch.float32, torch.int64)
    alone = codegen.make_spec(*P.encode(I0), [P.ENC, P.CONST, P.CONST], [16, F, F], F, "sum", torch.float32,
                              torch.int64)
    edges = codegen.make_spec(*relu, SIDES, widths, F, "sum", torch.float32, torch.int64, op="edges", out_width=F)
    plain = codegen.make_spec(*P.encode(P.node("relu", P.node("add", I0, I1))), [P.COL, P.ROW], [F, F], F, "sum",
                              torch.float32, torch.int64)
    assert "__builtin_prefetch(p + b, 0, 2)" in emit(fused)
    for s in (alone, edges, plain):
        src = emit(s)
        assert "__builtin_prefetch(p + b, 0, 0)" in src and "__builtin_prefetch(p + b, 0, 2)" not in src
