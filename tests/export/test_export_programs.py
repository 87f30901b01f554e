"""Exports keep the fusion of message programs: layers whose messages are more than a gathered
feature (GINEConv with edge features, PNA, EdgeCNN) export with their programs fused, in ONNX as
functions of the ``gnncompile`` domain (``message_<reduce>_<hash>``, a body of standard ONNX) and
in pt2 as the ``gnncompile::message_reduce`` / ``message_edges`` ops, and give the eager model's
numbers on a graph of another size. Every opcode of a program's ONNX body is checked against
the reference (gnncompile.ops.message), NaN and infinities included."""
from __future__ import annotations

import math
import warnings

import pytest
import torch

import gnncompile
from gnncompile.ops import program as P
from gnncompile.ops.message import message_edges, message_reduce

onnx = pytest.importorskip("onnx")
ort = pytest.importorskip("onnxruntime")

from test_export import D, EXAMPLE, F_IN, OTHER, _edge_inputs, _ort, _run_ort  # noqa: E402

with warnings.catch_warnings():
    warnings.simplefilter("ignore")
    import torch_geometric.nn as gnn
    from torch_geometric.nn import models


class _EdgeAttrKw(torch.nn.Module):
    """model(x, edge_index, edge_attr=...): export passes inputs by position, and PyG's PNA
    takes edge_weight as its third positional argument."""

    def __init__(self, model):
        super().__init__()
        self.model = model

    def forward(self, x, edge_index, edge_attr):
        return self.model(x, edge_index, edge_attr=edge_attr)


def _deg_histogram():
    x, ei = EXAMPLE
    return torch.bincount(torch.bincount(ei[1], minlength=x.size(0)))


# name -> (factory, extra input, layers whose messages are programs)
CASES = {
    "GINE": (lambda: gnn.GINEConv(torch.nn.Sequential(torch.nn.Linear(F_IN, 8), torch.nn.ReLU(),
                                                      torch.nn.Linear(8, 4)), edge_dim=D), "attr", 1),
    "PNA": (lambda: _EdgeAttrKw(models.PNA(
        F_IN, 16, 2, 4, aggregators=["mean", "min", "max", "std"], scalers=["identity", "amplification"],
        deg=_deg_histogram(), edge_dim=D)), "attr", 2),
    "EdgeCNN": (lambda: models.EdgeCNN(F_IN, 16, 2, 4), "", 2),
}
PROGRAM_KINDS = ("message", "segment", "edges")
MESSAGE_OPS = {"gnncompile.message_reduce.default", "gnncompile.message_edges.default"}


def _case(name):
    factory, kind, layers = CASES[name]
    torch.manual_seed(0)
    return factory().eval(), _edge_inputs(EXAMPLE, kind, seed=10), _edge_inputs(OTHER, kind, seed=11), layers


@pytest.fixture(scope="module", params=list(CASES))
def exported(request, tmp_path_factory):
    """(name, model, export result, ONNX path, inputs on another graph) per model, exported once."""
    model, example, other, layers = _case(request.param)
    path = tmp_path_factory.mktemp("programs") / f"{request.param}.onnx"
    res = gnncompile.export(model, example, path)
    return request.param, model, res, path, other, example, layers


def test_onnx_matches_eager_on_another_graph(exported):
    name, model, res, path, other, example, _ = exported
    assert other[0].size(0) != example[0].size(0) and other[1].size(1) != example[1].size(1)
    sess = _ort(path)
    for inputs in (other, example):
        with torch.no_grad():
            ref = model(*inputs)
        out = _run_ort(sess, *inputs)
        assert out.shape == ref.shape
        torch.testing.assert_close(out, ref, rtol=1e-4, atol=1e-4)


def test_onnx_calls_a_message_function_per_fused_layer(exported):
    name, model, res, path, *_, layers = exported
    proto = onnx.load(str(path))
    onnx.checker.check_model(proto, full_check=True)
    fused = {f.layer for f in res.fused if f.kind in PROGRAM_KINDS}
    assert len(fused) == layers, res.fused  # the report lists the layers as fused
    assert res.programs
    # every such layer calls at least one message function from the main graph
    called = {}
    for layer, fn in res.onnx_calls:
        called.setdefault(layer, []).append(fn)
    for layer in fused:
        assert any(fn.startswith("gnncompile::message_") for fn in called.get(layer, ())), (layer, res.onnx_calls)
    calls = [n for n in proto.graph.node if n.domain == "gnncompile" and n.op_type.startswith("message_")]
    assert len(calls) >= layers
    functions = {f.name: f for f in proto.functions if f.domain == "gnncompile"}
    assert {n.op_type for n in calls} <= set(functions)
    for n in calls:  # message_<reduce>_<8 hex digits> / message_edges_<...>, a body of standard ONNX
        kind, digest = n.op_type.rsplit("_", 1)
        assert kind in ("message_sum", "message_mean", "message_max", "message_min", "message_edges")
        assert len(digest) == 8 and int(digest, 16) >= 0
        body = functions[n.op_type]
        assert body.node and all(m.domain == "" for m in body.node)
        assert {(o.domain, o.version) for o in body.opset_import} == {("", 18)}


def test_pt2_keeps_the_message_op(exported, tmp_path):
    name, model, _res, _path, other, example, layers = exported
    path = tmp_path / f"{name}.pt2"
    res = gnncompile.export(model, example, path, format="pt2")
    assert len({f.layer for f in res.fused if f.kind in PROGRAM_KINDS}) == layers
    ep = torch.export.load(str(path))
    targets = {str(n.target) for n in ep.graph.nodes if n.op == "call_function"}
    assert targets & MESSAGE_OPS
    assert not targets & {"gnncompile.cached_csr.default", "gnncompile.cached_csc.default",
                          "gnncompile.gather.default", "gnncompile.hoisted.default"}
    for inputs in (other, example):
        with torch.no_grad():
            torch.testing.assert_close(ep.module()(*inputs), model(*inputs), rtol=1e-4, atol=1e-4)


def test_a_program_without_onnx_form_falls_back_to_standard_ops(tmp_path, monkeypatch):
    """Never a file that computes something else: a program whose function cannot be written
    leaves the messages as standard ops, with a warning and a note."""
    from gnncompile.export import onnx_programs as OP

    def refuse(spec):
        raise OP.ProgramNotExpressible("refused by the test")

    monkeypatch.setattr(OP, "check", refuse)
    model, example, other, _ = _case("GINE")
    path = tmp_path / "gine.onnx"
    with pytest.warns(UserWarning, match=r"layer <model> .*refused by the test"):
        res = gnncompile.export(model, example, path)
    assert not res.programs and any("standard ops" in n for n in res.notes)
    assert not any(f.startswith("gnncompile::message_") for f in res.onnx_functions)
    torch.testing.assert_close(_run_ort(_ort(path), *other), model(*other), rtol=1e-4, atol=1e-4)


# ----------------------------------------------------------------------------- function bodies
def _run_function(spec, tensors):
    """A one-node ONNX model calling the message function of ``spec`` (with the helpers it
    calls), run in onnxruntime on (rowptr, col, perm, *inputs)."""
    from onnx import helper

    from gnncompile.export import onnx_functions as OF
    from gnncompile.export import onnx_programs as OP

    proto = OP.function_proto(spec)
    protos = {proto.name: proto}
    for n in proto.node:
        if n.domain == OF.DOMAIN:
            protos.update((f.name, f) for f in OF.function_protos(OF.BY_NAME[n.op_type]))
    names = ["rowptr", "col", "perm"] + [f"in_{k}" for k in range(len(tensors) - 3)]
    node = helper.make_node(spec.name, names, ["y"], domain=OF.DOMAIN)
    graph = helper.make_graph(
        [node], "g",
        [helper.make_tensor_value_info(n, helper.np_dtype_to_tensor_dtype(t.numpy().dtype),
                                       [f"{n}_{d}" for d in range(t.dim())]) for n, t in zip(names, tensors)],
        [helper.make_tensor_value_info("y", spec.dtype, ["rows", "width"])])
    model = helper.make_model(graph, functions=list(protos.values()),
                              opset_imports=[helper.make_opsetid("", 18), helper.make_opsetid(OF.DOMAIN, 1)])
    onnx.checker.check_model(model)
    so = ort.SessionOptions()
    so.log_severity_level = 3
    sess = ort.InferenceSession(model.SerializeToString(), so, providers=["CPUExecutionProvider"])
    return torch.from_numpy(sess.run(None, {n: t.numpy() for n, t in zip(names, tensors)})[0])


N, E, F = 9, 30, 8
SIDES = [P.COL, P.ROW, P.EDGE, P.CONST, P.SLOT]
WIDTHS = [F, 2, 1, F, 4]  # per feature, per head (2 and 4 of 8), per edge


def _structure(dtype=torch.float32, special=False):
    g = torch.Generator().manual_seed(0)
    src = torch.randint(0, N, (E,), generator=g)
    dst = torch.randint(0, N - 2, (E,), generator=g)  # the last 2 rows have no edge
    rowptr, col, perm = gnncompile.ops.reference.build_csr(dst, src, N, N)
    rows = {P.COL: N, P.ROW: N, P.EDGE: E, P.CONST: 1, P.SLOT: E}
    ins = [torch.randn(rows[s], w, generator=g, dtype=dtype) for s, w in zip(SIDES, WIDTHS)]
    if special:  # NaN and infinities where messages read them
        ins[0][col[1], 2] = math.nan
        ins[0][col[3], 1] = math.inf
        ins[0][col[4], 0] = -math.inf
        ins[4][5, 0] = math.nan
    return rowptr, col, perm, ins


_x = [P.inp(k) for k in range(len(SIDES))]
_abs0 = P.node("abs", _x[0])
# name -> expression: every opcode of ops/program.py, each input side and width
EXPRESSIONS = {
    "add": P.node("add", _x[0], _x[1]), "sub": P.node("sub", _x[0], _x[2]), "mul": P.node("mul", _x[0], _x[3]),
    "div": P.node("div", _x[0], P.node("add", P.node("abs", _x[4]), P.const(0.5))), "neg": P.node("neg", _x[4]),
    "relu": P.node("relu", P.node("add", _x[0], _x[1])), "leaky_relu": P.node("leaky_relu", _x[0], params=[0.2]),
    "elu": P.node("elu", _x[0], params=[0.7]), "gelu": P.node("gelu", _x[1]), "sigmoid": P.node("sigmoid", _x[2]),
    "tanh": P.node("tanh", _x[3]),
    "softplus": P.node("softplus", P.node("mul", _x[0], P.const(8.0)), params=[2.0, 5.0]),
    "exp": P.node("exp", _x[0]), "log": P.node("log", _abs0),
    "clamp": P.node("clamp", _x[0], params=[-0.3, 0.5]), "clamp_min": P.node("clamp", _x[0], params=[-0.3, math.inf]),
    "pow": P.node("pow", _abs0, _x[1]), "sqrt": P.node("sqrt", P.node("abs", _x[4])),
    "abs": P.node("abs", _x[1]), "sign": P.node("sign", _x[0]),
    "powc": P.node("add", P.node("powc", _x[0], params=[2.0]), P.node("powc", P.node("abs", _x[1]), params=[1.7])),
    "powc-special": P.node("add", P.node("add", P.node("powc", _x[0], params=[3.0]),
                                         P.node("powc", _x[1], params=[0.0])),
                           P.node("add", P.node("powc", _abs0, params=[-0.5]), P.node("powc", _x[2], params=[-1.0]))),
    # derivative helpers
    "step": P.node("step", _x[0]), "leaky_relu_grad": P.node("leaky_relu_grad", _x[0], params=[0.1]),
    "elu_grad": P.node("elu_grad", _x[0], params=[1.0]), "gelu_grad": P.node("gelu_grad", _x[0]),
    "softplus_grad": P.node("softplus_grad", _x[0], params=[1.0, 20.0]),
    "clamp_grad": P.node("clamp_grad", _x[0], params=[-0.2, 0.2]),
    "pow_exp_grad": P.node("pow_exp_grad", _abs0, _x[1]), "gate": P.node("gate", _x[0], P.node("relu", _x[1])),
    "eq": P.node("eq", _x[0], P.node("relu", _x[0])),
}


def test_every_opcode_has_a_case():
    used = set()
    for e in EXPRESSIONS.values():
        code, _ = P.encode(e)
        used |= {P.OPS[code[i]][0] for i in range(0, len(code), P.INSTR)}
    assert used == {name for name, _, _ in P.OPS.values()}
    from gnncompile.export import onnx_programs as OP

    assert set(OP.EMITTERS) | {"in", "const"} == used  # every opcode has an ONNX form


def _spec(kind, reduce, code, consts, ins, **kw):
    from gnncompile.export import onnx_programs as OP

    dtype = onnx.TensorProto.DOUBLE if ins[0].dtype == torch.float64 else onnx.TensorProto.FLOAT
    return OP.MessageSpec(kind, reduce, tuple(code), tuple(consts), tuple(SIDES), tuple(t.shape[1] for t in ins),
                          F, dtype=dtype, **kw)


@pytest.mark.parametrize("special", [False, True], ids=["finite", "nan-inf"])
@pytest.mark.parametrize("reduce", ["sum", "mean", "max", "min"])
def test_message_function_matches_the_reference(reduce, special):
    rowptr, col, perm, ins = _structure(special=special)
    for name, e in EXPRESSIONS.items():
        code, consts = P.encode(e)
        ref = message_reduce(rowptr, col, perm, ins, SIDES, code, consts, F, reduce)[0]
        got = _run_function(_spec("reduce", reduce, code, consts, ins), [rowptr, col, perm, *ins])
        torch.testing.assert_close(got, ref, rtol=1e-5, atol=1e-5, equal_nan=True, msg=lambda m: f"{name}: {m}")
        if not special:
            assert (got[-2:] == 0).all()  # rows without edges get 0


@pytest.mark.parametrize("by_slot", [False, True], ids=["edge-order", "csr-order"])
@pytest.mark.parametrize("out_width", [F, 2, 1])
def test_edges_function_matches_the_reference(out_width, by_slot):
    rowptr, col, perm, ins = _structure()
    code, consts = P.encode(EXPRESSIONS["relu"])
    ref = message_edges(rowptr, col, perm, ins, SIDES, code, consts, F, out_width, by_slot)
    spec = _spec("edges", "", code, consts, ins, out_width=out_width, by_slot=by_slot)
    assert spec.name.startswith("message_edges_")
    torch.testing.assert_close(_run_function(spec, [rowptr, col, perm, *ins]), ref, rtol=1e-6, atol=1e-6)


def test_float64_bodies():
    """Constants in the inputs' float type (0.1 exact in float64); gelu's erf, which
    onnxruntime only has in float32, within float32's precision."""
    rowptr, col, perm, ins = _structure(dtype=torch.float64)
    for e, tol in ((P.node("mul", P.node("softplus", _x[0], params=[1.0, 20.0]), P.const(0.1)), 1e-12),
                   (P.node("add", P.node("gelu", _x[0]), P.node("gelu_grad", _x[1])), 1e-6)):
        code, consts = P.encode(e)
        ref = message_reduce(rowptr, col, perm, ins, SIDES, code, consts, F, "sum")[0]
        got = _run_function(_spec("reduce", "sum", code, consts, ins), [rowptr, col, perm, *ins])
        assert got.dtype == torch.float64
        torch.testing.assert_close(got, ref, rtol=tol, atol=tol)


def test_function_names_are_stable_and_distinct():
    from gnncompile.export import onnx_programs as OP

    code, consts = P.encode(P.node("relu", P.node("add", _x[0], _x[2])))
    spec = OP.MessageSpec("reduce", "sum", tuple(code), tuple(consts), (P.COL, P.EDGE), (8, 8), 8)
    assert spec.name == "message_sum_" + spec.key() and len(spec.key()) == 8
    assert spec.name == OP.MessageSpec(*[getattr(spec, f) for f in spec.__dataclass_fields__]).name
    # the same name from one export (and process) to the next; changes only with what the key
    # hashes (MessageSpec.key)
    assert spec.name == "message_sum_e9ef38fc"
    other = {OP.MessageSpec("reduce", "max", spec.code, spec.consts, spec.sides, spec.widths, 8).name,
             OP.MessageSpec("reduce", "sum", spec.code, spec.consts, (P.ROW, P.EDGE), spec.widths, 8).name,
             OP.MessageSpec("reduce", "sum", spec.code, spec.consts, spec.sides, (8, 1), 8).name,
             OP.MessageSpec("edges", "", spec.code, spec.consts, spec.sides, spec.widths, 8, out_width=8).name}
    assert spec.name not in other and len(other) == 4


def test_a_program_the_body_cannot_express_is_refused():
    from gnncompile.export import onnx_programs as OP

    code, consts = P.encode(P.node("relu", _x[0]))
    bad = [OP.MessageSpec("reduce", "prod", tuple(code), tuple(consts), (P.COL,), (8,), 8),
           OP.MessageSpec("reduce", "sum", tuple(code), tuple(consts), (P.COL,), (3,), 8),
           OP.MessageSpec("reduce", "sum", (99, 0, 0, 0, 0), (), (P.COL,), (8,), 8),
           OP.MessageSpec("reduce", "sum", tuple(code), tuple(consts), (7,), (8,), 8)]
    for spec in bad:
        with pytest.raises(OP.ProgramNotExpressible):
            OP.function_proto(spec)


def test_a_graph_without_edges():
    rowptr, col, perm = gnncompile.ops.reference.build_csr(torch.zeros(0, dtype=torch.long),
                                                          torch.zeros(0, dtype=torch.long), N, N)
    rows = {P.COL: N, P.ROW: N, P.EDGE: 0, P.CONST: 1, P.SLOT: 0}
    ins = [torch.randn(rows[s], w) for s, w in zip(SIDES, WIDTHS)]
    code, consts = P.encode(EXPRESSIONS["relu"])
    for reduce in ("sum", "max"):
        got = _run_function(_spec("reduce", reduce, code, consts, ins), [rowptr, col, perm, *ins])
        assert got.shape == (N, F) and (got == 0).all()
    got = _run_function(_spec("edges", "", code, consts, ins, out_width=2), [rowptr, col, perm, *ins])
    assert got.shape == (0, 2)


@pytest.mark.slow  # three fresh interpreters
def test_encoding_does_not_depend_on_the_process_hash_seed():
    """A program's code (so its function name) is the same in every process: the slot allocation
    once iterated a set of sub-expressions, whose order follows string hashes (PYTHONHASHSEED)."""
    import os
    import subprocess
    import sys

    script = ("from gnncompile.ops import program as P\n"
              "x = [P.inp(k) for k in range(5)]\n"
              "e = P.node('mul', P.node('add', x[0], x[1]), P.node('sub', x[2], P.node('relu', x[0])))\n"
              "print(P.encode(e)[0])\n")
    outs = set()
    for seed in ("0", "1", "2"):
        env = dict(os.environ, PYTHONHASHSEED=seed)
        r = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True, text=True, timeout=120)
        assert r.returncode == 0, r.stderr
        outs.add(r.stdout)
    assert len(outs) == 1, outs
