"""Generated kernels of edge encoders whose features are stored per CSR slot (side enc_slot,
gnncompile/ops/slots.py): bit for bit the interpreter's, and the kernels of the encoder read
through perm (enc), in every op that reads an encoder; a compiled GINE training step whose edge
features go through the cached copy gives the bits of the step without it, step after step, also
after the features change in place."""
from __future__ import annotations

import warnings

import pytest
import torch

import gnncompile
from gnncompile import codegen
from gnncompile.codegen import build, cuda
from gnncompile.codegen.emit import emit, make_spec
from gnncompile.ops import _native
from gnncompile.ops import message as M
from gnncompile.ops import program as P
from gnncompile.ops import slots as S
from gnncompile.ops.schemas import ops
from gnncompile.testing.bits import assert_same_bits as same

with warnings.catch_warnings():
    warnings.simplefilter("ignore")
    import torch_geometric.nn as gnn

pytestmark = pytest.mark.skipif(not _native.native_loaded() or build.shutil.which("c++") is None,
                                reason="needs the native module and a C++ compiler")

N_SRC, N_DST, E_, F = 17, 13, 150, 140  # F: two tiles in both dtypes
PROGRAM = P.encode(P.node("mul", P.node("relu", P.node("add", P.inp(0), P.inp(2))),
                          P.node("sub", P.inp(1), P.inp(2))))
SIDES = {P.ENC: [P.COL, P.ROW, P.ENC, P.CONST, P.CONST], P.ENCS: [P.COL, P.ROW, P.ENCS, P.CONST, P.CONST]}


def _structure(index, seed=0):
    g = torch.Generator().manual_seed(seed)
    src = torch.randint(0, N_SRC, (E_,), generator=g)
    dst = torch.randint(0, N_DST, (E_,), generator=g)
    return tuple(t.to(index) for t in ops.build_csr(dst, src, N_DST, N_SRC))


def _inputs(dtype, D, W, seed=1):
    g = torch.Generator().manual_seed(seed)
    shapes = [(N_SRC, F), (N_DST, F), (E_, D), (D, W), (1, W)]
    return [torch.randn(*s, dtype=dtype, generator=g) for s in shapes]


def _run(side, call, prepare):
    """(interpreter, generated) results of ``call`` for the encoder read on ``side``."""
    assert prepare(), "the kernel was not built"
    codegen.suspend()
    ref = call()
    codegen.resume()
    before = codegen.calls()
    out = call()
    assert codegen.calls() - before == 1
    return ref, out


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("index", [torch.int32, torch.int64])
@pytest.mark.parametrize("D,W", [(16, F), (33, 14), (3, 1)])
def test_reduce_and_edges(gen, D, W, index, dtype):
    rowptr, col, perm = _structure(index)
    ins = _inputs(dtype, D, W)
    slot_ins = list(ins)
    slot_ins[2] = ops.slot_rows(ins[2], perm)
    for reduce in ("sum", "max"):
        got = {}
        for side, xs in ((P.ENC, ins), (P.ENCS, slot_ins)):
            got[side] = _run(side, lambda: ops.message_reduce(rowptr, col, perm, xs, SIDES[side], *PROGRAM, F, reduce,
                                                               [], [], None),
                             lambda: codegen.prepare(xs, SIDES[side], *PROGRAM, F, reduce, index))
        for r in got[P.ENC] + got[P.ENCS][1:]:
            same(r[0], got[P.ENCS][0][0])
            assert torch.equal(r[1], got[P.ENCS][0][1])
    for by_slot in (False, True):
        got = [_run(side, lambda: ops.message_edges(rowptr, col, perm, xs, SIDES[side], *PROGRAM, F, F, by_slot, [],
                                                    [], None),
                    lambda: codegen.prepare(xs, SIDES[side], *PROGRAM, F, "sum", index, op="edges", out_width=F,
                                            by_slot=by_slot))
               for side, xs in ((P.ENC, ins), (P.ENCS, slot_ins))]
        for r in got[0] + got[1]:
            same(r, got[1][1])


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("need", [True, False])
@pytest.mark.parametrize("D,W", [(16, F), (33, 14)])
def test_encoder_grad(gen, D, W, need, dtype):
    rowptr, col, perm = _structure(torch.int64, seed=2)
    ins = _inputs(dtype, D, W) + [torch.randn(N_DST, F, dtype=dtype)]
    slot_ins = list(ins)
    slot_ins[2] = ops.slot_rows(ins[2], perm)
    dcode, dconsts = M._derivative(*PROGRAM, 2, 5)
    got = {}
    for side, xs in ((P.ENC, ins), (P.ENCS, slot_ins)):
        sides = SIDES[side] + [P.ROW]
        got[side] = _run(side, lambda: ops.message_encoder_grad(rowptr, col, perm, xs, sides, dcode, dconsts, F, 2,
                                                                 need, [4]),
                         lambda: codegen.prepare(xs, sides, dcode, dconsts, F, "sum", torch.int64, op="encgrad",
                                                 out_width=W, enc=2, need_features=need))
    ref = got[P.ENC][0]
    for da, dwt, db in got[P.ENC] + got[P.ENCS]:
        same(dwt, ref[1])
        same(db, ref[2])
    if need:
        for r in got[P.ENCS]:
            same(r[0], ref[0].index_select(0, perm))


def test_sources():
    """The C++ kernel reads the block's rows in order (no perm); the key names the side; the CUDA
    kernel reads the features at the CSR slot."""
    spec = make_spec(*PROGRAM, SIDES[P.ENCS], [F, F, 16, F, F], F, "sum", torch.float32, torch.int64)
    src = emit(spec)
    assert "eb.e2.get(j, jlim, slot, " in src and "get(j, jlim, perm" not in src
    assert "|i0f,1f,6fd16,3f,3f" in spec.key()
    assert spec.key() == _native._C.codegen.key(spec.op_key(), False, True, list(spec.code), list(spec.consts),
                                                list(spec.sides), [F, F, 16, F, F], F)
    assert "in2 + sl * 16" in cuda.emit_cuda(spec)
    assert any(name.startswith("enc_slot") for name, _ in cuda.test_programs())


class _Gine(torch.nn.Module):
    def __init__(self, F_, D):
        super().__init__()
        self.c1 = gnn.GINEConv(torch.nn.Sequential(torch.nn.Linear(F_, F_), torch.nn.ReLU()), edge_dim=D)
        self.c2 = gnn.GINEConv(torch.nn.Linear(F_, F_), edge_dim=D)

    def forward(self, x, ei, ea):
        return self.c2(self.c1(x, ei, ea).relu(), ei, ea)


def test_compiled_gine_same_bits(gen, monkeypatch):
    """A GINE training step with its edge features read through the cached copy (the threshold
    lowered to this graph) gives the bits of the step without it (slot_order off), over steps and
    after an in-place change of the features; explain() says so."""
    monkeypatch.setattr(S, "SLOT_COPY_MIN_EDGES", 0)
    torch.manual_seed(0)
    N, E, F_, D = 60, 400, 32, 6
    x, ei, ea = torch.randn(N, F_), torch.randint(0, N, (2, E)), torch.randn(E, D)
    runs = []
    for slot_order in (True, False):
        torch._dynamo.reset()
        torch.manual_seed(1)
        model = _Gine(F_, D)
        feats = ea.clone()
        settings = {"slot_order": slot_order, "choices": {"programs": "always", "guard": "off"}}
        compiled = gnncompile.compile(model, settings=settings)
        before = S.info()["copies"]
        steps = []
        for step in range(4):
            if step == 2:
                feats.mul_(0.5)  # in place: the cached copy must not be served
            out = compiled(x, ei, feats)
            out.square().sum().backward()
            steps.append([out.detach()] + [p.grad.clone() for p in model.parameters()])
            model.zero_grad()
        copies = S.info()["copies"] - before
        runs.append(steps)
        if slot_order:
            assert copies == 2, copies  # one copy, then one after the in-place change
            rep = gnncompile.explain(compiled, x, ei, feats)
            assert "CSR slot order" in str(rep), str(rep)
        else:
            assert copies == 0
    for a, b in zip(*runs):
        for u, v in zip(a, b):
            same(u, v)
