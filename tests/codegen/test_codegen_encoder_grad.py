"""Generated ``message_encoder_grad`` kernels (kind 'encgrad', gnncompile/codegen/emit.py): bit
for bit the interpreter's numbers (native/cpu/message_core.h, encoder_grad_rows) for both dtypes
and index dtypes, the encoder's width F, a divisor of F (per head) and 1, D unrolled and looped,
the features' gradient wanted or not, the upstream gradient per destination / edge / slot, and a
split into several chunks; the key the Python side and the native registry write; a training
step's backward runs it."""
from __future__ import annotations

import pytest
import torch

from gnncompile import codegen
from gnncompile.codegen import build
from gnncompile.codegen.emit import make_spec
from gnncompile.ops import _native
from gnncompile.ops import message as M
from gnncompile.ops import program as P
from gnncompile.ops.schemas import ops
from gnncompile.testing.bits import assert_same_bits as _same

pytestmark = pytest.mark.skipif(not _native.native_loaded() or build.shutil.which("c++") is None,
                                reason="needs the native module and a C++ compiler")

N_SRC, N_DST, E_ = 11, 9, 60
F = 140  # two tiles in both dtypes, not a multiple of either
I0, I1, I2, I5 = P.inp(0), P.inp(1), P.inp(2), P.inp(5)
SIDES = [P.COL, P.ROW, P.ENC, P.CONST, P.CONST, P.SLOT]
PROGRAMS = {
    "gated": P.node("mul", P.node("relu", P.node("add", I0, I2)), P.node("add", I1, I5)),
    "tanh_cut": P.node("mul", P.node("tanh", P.node("sub", I2, I1)), P.node("add", I2, I0)),
}


def _structure(seed=0):
    g = torch.Generator().manual_seed(seed)
    pick = torch.randperm(N_SRC * N_DST, generator=g)[:E_]
    src, dst = pick % N_SRC, pick // N_SRC
    return ops.build_csr(dst, src, N_DST, N_SRC)


def _inputs(dtype, D, W, g_rows, seed=1):
    g = torch.Generator().manual_seed(seed)
    shapes = [(N_SRC, F), (N_DST, F), (E_, D), (D, W), (1, W), (E_, 1), (g_rows, F)]
    return [torch.randn(*s, dtype=dtype, generator=g) for s in shapes]


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("index", [torch.int32, torch.int64])
@pytest.mark.parametrize("D,W", [(1, F), (16, F), (33, 14), (3, 1)])
def test_generated_equals_interpreter(gen, D, W, index, dtype):
    rowptr, col, perm = (t.to(index) for t in _structure())
    for name, expr in PROGRAMS.items():
        code, consts = P.encode(expr)
        dcode, dconsts = M._derivative(code, consts, 2, 6)
        for g_side, need in ((P.ROW, True), (P.EDGE, False), (P.SLOT, True)):
            ins = _inputs(dtype, D, W, N_DST if g_side == P.ROW else E_)
            sides = SIDES + [g_side]
            assert codegen.prepare(ins, sides, dcode, dconsts, F, "sum", index, op="encgrad", out_width=W, enc=2,
                                   need_features=need), "the kernel was not built"
            for knobs in ([], [4]):  # one chunk per thread, and four
                def call():
                    return ops.message_encoder_grad(rowptr, col, perm, ins, sides, dcode, dconsts, F, 2, need, knobs)
                codegen.suspend()
                ref = call()
                codegen.resume()
                before = codegen.calls()
                out = call()
                assert codegen.calls() - before == 1, (name, g_side)
                for r, o in zip(ref, out):
                    _same(r, o)


def test_key_matches_native():
    spec = make_spec([0, 0, 2, 0, 0], [], SIDES + [P.ROW], [F, F, 16, 14, 14, 1, F], F, "sum", torch.float32,
                     torch.int64, op="encgrad", out_width=14, enc=2, need_features=True)
    native = _native._C.codegen
    assert spec.op_key() == native.encoder_grad_op(2, True, 14, F) == "n2.1g"
    assert spec.key() == native.key(spec.op_key(), False, True, list(spec.code), [], list(spec.sides),
                                    [F, F, 16, 14, 14, 1, F], F)
    with pytest.raises(ValueError, match="encgrad"):
        make_spec([0, 0, 2, 0, 0], [], SIDES, [F, F, 16, 14, 14, 1], F, "sum", torch.float32, torch.int64,
                  op="encgrad", out_width=14, enc=0)
    with pytest.raises(ValueError, match="out_width"):
        make_spec([0, 0, 2, 0, 0], [], SIDES, [F, F, 16, 14, 14, 1], F, "sum", torch.float32, torch.int64,
                  op="encgrad", out_width=F, enc=2)


def test_backward_runs_the_generated_kernel(gen):
    """message_reduce's backward prepares and runs the 'encgrad' kernel; its gradients are the
    interpreter's bit for bit."""
    rowptr, col, perm = _structure(2)
    code, consts = P.encode(PROGRAMS["gated"])

    def grads():
        ins = [t.requires_grad_() for t in _inputs(torch.float32, 16, F, N_DST, seed=3)[:6]]
        out = ops.message_reduce(rowptr, col, perm, ins, SIDES, code, consts, F, "sum", [], [], None)[0]
        return torch.autograd.grad(out, ins, torch.ones_like(out))

    first = grads()  # prepares every derivative kernel
    assert any("|n2." in k for k in codegen.registered())
    codegen.suspend()
    ref = grads()
    codegen.resume()
    before = codegen.calls()
    out = grads()
    assert codegen.calls() > before
    for r, o, f in zip(ref, out, first):
        _same(r, o)
        _same(f, o)
