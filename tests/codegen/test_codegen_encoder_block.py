"""A generated reduction computes its edge encoder for kEncodeBlock edges at once
(native/cpu/encoder_core.h, encode_block / EncoderBlock): blocks that cross rows where one tile
covers F (empty rows, rows of one edge, a hub), blocks cut at the row's end where F takes several
tiles, column passes with a remainder (encode_run's tail), every D (1, a few, 16, past ENC_UNROLL),
both dtypes and index dtypes, every reduction and the grouped width class: the interpreter's
numbers bit for bit, and the program's reference (program.encode_edges) for the encoder alone. A
perm entry out of range inside a block raises the interpreter's error."""
from __future__ import annotations

import pytest
import torch

from gnncompile import codegen
from gnncompile.codegen import build
from gnncompile.codegen.emit import emit
from gnncompile.ops import _native
from gnncompile.ops import program as P
from gnncompile.ops.schemas import ops
from gnncompile.testing.bits import bits as _bits, interpreted_then_generated as _ran

pytestmark = pytest.mark.skipif(not _native.native_loaded() or build.shutil.which("c++") is None,
                                reason="needs the native module and a C++ compiler")

N = 40
I0, I1 = P.inp(0), P.inp(1)


def _graph(seed=0):
    """A skewed graph: node 0 a hub (60 in-edges), a run of rows with one edge each, empty rows,
    the rest random."""
    g = torch.Generator().manual_seed(seed)
    dst = [0] * 60 + list(range(5, 20)) + torch.randint(20, N, (70,), generator=g).tolist()
    src = torch.randint(0, N, (len(dst),), generator=g).tolist()
    dst, src = torch.tensor(dst), torch.tensor(src)
    shuffle = torch.randperm(len(dst), generator=g)  # perm is not the identity
    return ops.build_csr(dst[shuffle], src[shuffle], N, N)


# (F, D, W): one tile with whole passes, one tile with a pass remainder, several tiles, a grouped
# encoder (W divides F), D of 1 and past the unrolled sums (33+)
CASES = [(128, 16, 128), (37, 5, 37), (200, 3, 200), (64, 1, 64), (96, 40, 24), (20, 16, 20)]


@pytest.mark.parametrize("index", [torch.int64, torch.int32])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("case", range(len(CASES)))
def test_blocked_encoder_equals_interpreter(gen, case, dtype, index):
    F, D, W = CASES[case]
    reduce = ("sum", "mean", "max", "min")[(case + (dtype == torch.float64) + (index == torch.int32)) % 4]
    rowptr, col, perm = (t.to(index) for t in _graph(case))
    E = col.numel()
    g = torch.Generator().manual_seed(case)
    x = torch.randn(N, F, dtype=dtype, generator=g)
    a = torch.randn(E, D, dtype=dtype, generator=g)
    wt = torch.randn(D, W, dtype=dtype, generator=g)
    b = torch.randn(1, W, dtype=dtype, generator=g)
    ins, sides = [x, a, wt, b], [P.COL, P.ENC, P.CONST, P.CONST]
    code, consts = P.encode(P.node("relu", P.node("add", I0, I1)))
    assert codegen.prepare(ins, sides, code, consts, F, reduce, index)
    ref, out, n = _ran(lambda: ops.message_reduce(rowptr, col, perm, ins, sides, code, consts, F, reduce, [], [],
                                                  None))
    assert n == 1
    for r, o in zip(ref, out):
        assert torch.equal(_bits(r), _bits(o)) if r.is_floating_point() else torch.equal(r, o)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_blocked_encoder_alone_is_the_reference(gen, dtype):
    """The encoder alone summed over the rows (a row of one edge gives that edge's values): the
    blocked kernel's value of every single-edge row is program.encode_edges' bit for bit."""
    F, D = 128, 16
    rowptr, col, perm = _graph(3)
    E = col.numel()
    g = torch.Generator().manual_seed(7)
    a, wt, b = (torch.randn(E, D, dtype=dtype, generator=g), torch.randn(D, F, dtype=dtype, generator=g),
                torch.randn(1, F, dtype=dtype, generator=g))
    ins, sides = [a, wt, b], [P.ENC, P.CONST, P.CONST]
    code, consts = P.encode(I0)
    assert codegen.prepare(ins, sides, code, consts, F, "sum", rowptr.dtype)
    ref, out, n = _ran(lambda: ops.message_reduce(rowptr, col, perm, ins, sides, code, consts, F, "sum", [], [],
                                                  None)[0])
    assert n == 1 and torch.equal(_bits(ref), _bits(out))
    direct = P.encode_edges(a, wt, b)
    single = [r for r in range(N) if rowptr[r + 1] - rowptr[r] == 1]
    assert len(single) >= 10
    for r in single:
        assert torch.equal(_bits(out[r]), _bits(direct[perm[rowptr[r]]]))


@pytest.mark.parametrize("where", [1, 3, 61])
def test_bad_perm_inside_a_block(gen, where):
    """A perm entry out of range at a slot a block reads ahead (the second, fourth, or one past a
    row's end): the same IndexError as the interpreter, and no read out of bounds."""
    F, D = 128, 16
    rowptr, col, perm = _graph(1)
    E = col.numel()
    bad = perm.clone()
    bad[where] = E + 5
    g = torch.Generator().manual_seed(2)
    ins = [torch.randn(N, F, generator=g), torch.randn(E, D, generator=g), torch.randn(D, F, generator=g),
           torch.randn(1, F, generator=g)]
    sides = [P.COL, P.ENC, P.CONST, P.CONST]
    code, consts = P.encode(P.node("relu", P.node("add", I0, I1)))
    assert codegen.prepare(ins, sides, code, consts, F, "sum", rowptr.dtype)
    for generated in (False, True):
        (codegen.resume if generated else codegen.suspend)()
        with pytest.raises(IndexError, match="perm holds an edge id outside"):
            ops.message_reduce(rowptr, col, bad, ins, sides, code, consts, F, "sum", [], [], None)
    codegen.resume()


def test_blocked_encoder_source():
    """The reductions' kernels read their encoder through EncoderBlock (and prefetch three times
    the knob's distance ahead); per-edge kernels (message_edges) keep encode_run; a program without
    an encoder keeps the knob's distance."""
    code, consts = P.encode(P.node("relu", P.node("add", I0, I1)))
    sides, widths = [P.COL, P.ENC, P.CONST, P.CONST], [64, 8, 64, 64]
    red = emit(codegen.make_spec(code, consts, sides, widths, 64, "max", torch.float32, torch.int64))
    assert "EncoderBlock<acc_t, index_t, TILE> e1;" in red and "e1 = eb.e1.get(" in red
    assert "constexpr int64_t kPrefetchScale = 3;" in red
    edges = emit(codegen.make_spec(code, consts, sides, widths, 64, "sum", torch.float32, torch.int64, op="edges",
                                   out_width=64))
    assert "encode_run<acc_t>(p1, 8, wt1 + f0, ew1, bs1 + f0, n, e1);" in edges and "EncoderBlock<" not in edges
    plain = emit(codegen.make_spec(code, consts, [P.COL, P.ROW], [64, 64], 64, "sum", torch.float32, torch.int64))
    assert "constexpr int64_t kPrefetchScale = 1;" in plain and "EncoderBlock<" not in plain
