"""gnncompile.export: ONNX (fused ops as ``gnncompile`` functions, run by onnxruntime) and pt2
(torch.export round trip) give the eager model's numbers on graphs of another size than the
export example, including nodes with no incoming edge."""
from __future__ import annotations

import shutil
import warnings
from pathlib import Path

import pytest
import torch

import gnncompile
from gnncompile.export import ExportError

onnx = pytest.importorskip("onnx")
ort = pytest.importorskip("onnxruntime")

with warnings.catch_warnings():
    warnings.simplefilter("ignore")
    import torch_geometric.nn as gnn
    from torch_geometric.nn import models

F_IN = 8


def _graph(n, e, seed, isolated=0):
    """n nodes, e distinct edges (no self loops); the last `isolated` nodes have no edge."""
    g = torch.Generator().manual_seed(seed)
    m = n - isolated
    pick = torch.randperm(m * m, generator=g)
    src, dst = pick // m, pick % m
    keep = src != dst
    ei = torch.stack([src[keep], dst[keep]])[:, :e]
    return torch.randn(n, F_IN, generator=g), ei


EXAMPLE = _graph(12, 40, seed=0)
OTHER = _graph(37, 150, seed=1, isolated=5)  # another size, 5 isolated nodes

MODELS = {
    "GCN": lambda: models.GCN(F_IN, 16, 2, 4),
    "GraphSAGE-mean": lambda: models.GraphSAGE(F_IN, 16, 2, 4),
    "GraphSAGE-max": lambda: models.GraphSAGE(F_IN, 16, 2, 4, aggr="max"),
    "GIN": lambda: models.GIN(F_IN, 16, 2, 4),
    "GAT": lambda: models.GAT(F_IN, 8, 2, 4, heads=2),
    "GATv2": lambda: models.GAT(F_IN, 8, 2, 4, heads=2, v2=True),
    # layers beyond the list
    "SAGEConv-min": lambda: gnn.SAGEConv(F_IN, 4, aggr="min"),
    "TransformerConv": lambda: gnn.TransformerConv(F_IN, 4, heads=2),
    "GraphConv": lambda: gnn.GraphConv(F_IN, 4),
    "ChebConv": lambda: gnn.ChebConv(F_IN, 4, K=2),
    # messages that are not a gathered feature: fused as message programs; with
    # programs=False, exported as plain ONNX (test_onnx_without_programs_is_plain)
    "EdgeConv": lambda: gnn.EdgeConv(torch.nn.Linear(2 * F_IN, 4)),
    "FeaStConv": lambda: gnn.FeaStConv(F_IN, 4),  # an in-place degree count whose result is unused
}
PROGRAMS_ONLY = {"EdgeConv", "FeaStConv"}


def _model(name):
    torch.manual_seed(0)
    return MODELS[name]().eval()


def _ort(path):
    so = ort.SessionOptions()
    so.log_severity_level = 3
    return ort.InferenceSession(str(path), so, providers=["CPUExecutionProvider"])


def _run_ort(sess, *inputs):
    feed = {i.name: t.numpy() for i, t in zip(sess.get_inputs(), inputs)}
    return torch.from_numpy(sess.run(None, feed)[0])


@pytest.mark.parametrize("name", list(MODELS))
def test_onnx_matches_eager(name, tmp_path):
    model = _model(name)
    path = tmp_path / f"{name}.onnx"
    res = gnncompile.export(model, EXAMPLE, path)
    proto = onnx.load(str(path))
    onnx.checker.check_model(proto, full_check=True)
    assert any(o.domain == "" and o.version >= 18 for o in proto.opset_import)
    assert res.num_fused >= (0 if name == "EdgeConv" else 1), res.unfused  # EdgeConv: a segment reduction
    # the fused ops are ONNX functions of the gnncompile domain, called from the main graph
    funcs = {(f.domain, f.name) for f in proto.functions}
    assert ("gnncompile", "build_csr") in funcs
    prefix = "message_" if name in PROGRAMS_ONLY else "spmm_"
    assert any(n.startswith(prefix) for d, n in funcs if d == "gnncompile")
    called = {(n.domain, n.op_type) for n in proto.graph.node if n.domain == "gnncompile"}
    assert called == funcs
    if name.startswith("GAT") or name == "TransformerConv":
        assert ("gnncompile", "edge_softmax") in funcs
    sess = _ort(path)
    for x, ei in (OTHER, EXAMPLE):
        with torch.no_grad():
            ref = model(x, ei)
        out = _run_ort(sess, x, ei)
        assert out.shape == ref.shape
        torch.testing.assert_close(out, ref, rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("name", sorted(PROGRAMS_ONLY))
def test_onnx_without_programs_is_plain(name, tmp_path):
    """programs=False: the messages stay the standard ops they are written with (nothing fused
    in these layers), same numbers."""
    model = _model(name)
    path = tmp_path / f"{name}.onnx"
    res = gnncompile.export(model, EXAMPLE, path, programs=False)
    assert not res.programs and res.num_fused == 0 and not [f for f in res.fused if f.kind != "degree"]
    assert not onnx.load(str(path)).functions
    torch.testing.assert_close(_run_ort(_ort(path), *OTHER), model(*OTHER), rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("reduce", ["sum", "mean", "max", "min"])
def test_onnx_isolated_nodes_get_zero(reduce, tmp_path):
    """A node with no incoming edge gets PyG's 0, never -inf or garbage (max / min)."""
    model = gnn.SimpleConv(aggr=reduce).eval()
    path = tmp_path / "simple.onnx"
    gnncompile.export(model, EXAMPLE, path)
    x, ei = OTHER
    out = _run_ort(_ort(path), x, ei)
    ref = model(x, ei)
    assert torch.isfinite(out).all()
    assert (out[-5:] == 0).all()
    torch.testing.assert_close(out, ref, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("name", ["GCN", "GraphSAGE-max", "GAT"])
def test_pt2_round_trip(name, tmp_path):
    model = _model(name)
    path = tmp_path / f"{name}.pt2"
    gnncompile.export(model, EXAMPLE, path, format="pt2")
    ep = torch.export.load(str(path))
    targets = {str(n.target) for n in ep.graph.nodes if n.op == "call_function"}
    assert "gnncompile.spmm.default" in targets
    assert "gnncompile.cached_csr.default" not in targets  # no process-wide cache in the file
    for x, ei in (OTHER, EXAMPLE):
        with torch.no_grad():
            ref = model(x, ei)
            out = ep.module()(x, ei)
        torch.testing.assert_close(out, ref, rtol=1e-5, atol=1e-5)


def test_torch_export_of_a_compiled_module_is_a_clear_error(tmp_path):
    # torch.export does not run torch.compile: it would silently export the model without the
    # rewrite; gnncompile.export of the same compiled module exports the rewritten graph
    compiled = gnncompile.compile(_model("GraphSAGE-mean"))
    with pytest.raises(RuntimeError, match="gnncompile.export"):
        torch.export.export(compiled, EXAMPLE)
    res = gnncompile.export(compiled, EXAMPLE, tmp_path / "c.pt2", format="pt2")
    assert any(f.kind == "spmm" for f in res.fused)
    torch.testing.assert_close(compiled(*EXAMPLE), _model("GraphSAGE-mean")(*EXAMPLE), rtol=1e-5, atol=1e-5)


# ----------------------------------------------------------------------------- edge features
# Layers whose messages are more than a gathered feature (edge attributes, edge weights, gates,
# per-edge MLPs). Export fuses them as message programs, as gnncompile.compile does: in ONNX
# one function of the gnncompile domain per distinct program (message_<reduce>_<hash>), in pt2
# the gnncompile::message_reduce / message_edges ops. GINEConv, PNA and EdgeCNN are tested in
# detail in test_export_programs.py.
D = 3  # edge feature width


def _edge_inputs(graph, kind, seed):
    """(x, edge_index[, extra]): extra sized to the graph's edges; kind "attr" [E, D] edge
    features, "weight" [E] positive edge weights, "" none."""
    x, ei = graph
    g = torch.Generator().manual_seed(seed)
    if kind == "attr":
        return x, ei, torch.randn(ei.size(1), D, generator=g)
    if kind == "weight":
        return x, ei, torch.rand(ei.size(1), generator=g) + 0.1
    return x, ei


# name -> (factory, extra input, fused chains the export has at least (num_fused; segment
# reductions of a message computed outside are not counted); the comment is the count observed)
EDGE_MODELS = {
    "ResGatedGraphConv-edge_dim": (lambda: gnn.ResGatedGraphConv(F_IN, 4, edge_dim=D), "attr", 0),  # 0 (segment)
    "CGConv": (lambda: gnn.CGConv(F_IN, dim=D), "attr", 0),  # 0 (segment: sigmoid * softplus)
    "GENConv-softmax": (lambda: gnn.GENConv(F_IN, 4, aggr="softmax", edge_dim=D), "attr", 2),  # 2
    "LEConv-edge_weight": (lambda: gnn.LEConv(F_IN, 4), "weight", 1),  # 1
    "FiLMConv": (lambda: gnn.FiLMConv(F_IN, 4), "", 1),  # 1
    "TransformerConv-edge_dim": (lambda: gnn.TransformerConv(F_IN, 4, heads=2, edge_dim=D), "attr", 2),  # 2
    "GATConv-edge_dim": (lambda: gnn.GATConv(F_IN, 4, heads=2, edge_dim=D), "attr", 2),  # 2
}
EXPORT_FUNCTIONS = {"build_csr", "edge_softmax"}  # and spmm_*, message_*
MESSAGE_OPS = {"gnncompile.message_reduce.default", "gnncompile.message_edges.default"}
PROGRAM_KINDS = ("message", "segment", "edges")  # report lines of message programs


def _edge_case(name):
    factory, kind, fused = EDGE_MODELS[name]
    torch.manual_seed(0)
    model = factory().eval()
    return model, _edge_inputs(EXAMPLE, kind, seed=10), _edge_inputs(OTHER, kind, seed=11), fused


@pytest.mark.parametrize("name", list(EDGE_MODELS))
def test_onnx_edge_features_match_eager(name, tmp_path):
    model, example, other, fused = _edge_case(name)
    path = tmp_path / "m.onnx"
    res = gnncompile.export(model, example, path)
    assert res.num_fused >= fused, res.unfused
    proto = onnx.load(str(path))
    onnx.checker.check_model(proto, full_check=True)
    assert len(proto.graph.input) == len(example)
    funcs = {f.name for f in proto.functions if f.domain == "gnncompile"}
    assert all(f in EXPORT_FUNCTIONS or f.startswith(("spmm_", "message_")) for f in funcs), funcs
    programs = [f for f in res.fused if f.kind in PROGRAM_KINDS]
    assert programs, res.fused  # every layer here has a message program
    assert any(f.startswith("message_") for f in funcs), funcs
    sess = _ort(path)
    for inputs in (other, example):  # another size (and isolated nodes), then the example
        with torch.no_grad():
            ref = model(*inputs)
        out = _run_ort(sess, *inputs)
        assert out.shape == ref.shape
        torch.testing.assert_close(out, ref, rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("name", list(EDGE_MODELS))
def test_pt2_edge_features_round_trip(name, tmp_path):
    model, example, other, fused = _edge_case(name)
    path = tmp_path / "m.pt2"
    res = gnncompile.export(model, example, path, format="pt2")
    assert res.num_fused >= fused, res.unfused
    ep = torch.export.load(str(path))
    targets = {str(n.target) for n in ep.graph.nodes if n.op == "call_function"}
    assert targets & MESSAGE_OPS  # the message programs stay gnncompile ops
    assert not targets & {"gnncompile.cached_csr.default", "gnncompile.cached_csc.default",
                          "gnncompile.hoisted.default", "gnncompile.gather.default"}
    assert "gnncompile.pair_csr.default" in targets
    for inputs in (other, example):
        with torch.no_grad():
            ref = model(*inputs)
            out = ep.module()(*inputs)
        torch.testing.assert_close(out, ref, rtol=1e-5, atol=1e-5)


def test_static_export(tmp_path):
    model = _model("GCN")
    path = tmp_path / "static.onnx"
    gnncompile.export(model, EXAMPLE, path, dynamic=False)
    torch.testing.assert_close(_run_ort(_ort(path), *EXAMPLE), model(*EXAMPLE), rtol=1e-4, atol=1e-4)


class _DataDependent(torch.nn.Module):
    def forward(self, x, edge_index):
        if int(edge_index.max()) > 3:  # Python control flow on tensor data
            return x * 2
        return x


class _Net(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.conv = gnn.GCNConv(F_IN, F_IN)
        self.odd = _DataDependent()

    def forward(self, x, edge_index):
        return self.odd(self.conv(x, edge_index), edge_index)


def test_clear_error_names_the_layer(tmp_path):
    with pytest.raises(ExportError, match=r"layer odd \(_DataDependent\)"):
        gnncompile.export(_Net().eval(), EXAMPLE, tmp_path / "bad.onnx")


class _NoOnnx(torch.nn.Module):
    def forward(self, x):
        return torch.special.zeta(x.abs() + 2, torch.tensor(2.0))  # no ONNX translation


class _Net2(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.conv = gnn.GCNConv(F_IN, F_IN)
        self.zeta = _NoOnnx()

    def forward(self, x, edge_index):
        return self.zeta(self.conv(x, edge_index))


def test_clear_error_for_an_op_without_onnx(tmp_path):
    with pytest.raises(ExportError, match=r"layer zeta \(_NoOnnx\) to ONNX: operator aten.special_zeta"):
        gnncompile.export(_Net2().eval(), EXAMPLE, tmp_path / "bad.onnx")
    # the same model is fine as a torch.export program
    gnncompile.export(_Net2().eval(), EXAMPLE, tmp_path / "ok.pt2", format="pt2")


def test_bad_arguments(tmp_path):
    with pytest.raises(ValueError, match="format"):
        gnncompile.export(_model("GCN"), EXAMPLE, tmp_path / "m.x", format="tflite")
    with pytest.raises(ExportError, match="at least 2"):
        gnncompile.export(_model("GCN"), (EXAMPLE[0][:1], EXAMPLE[1][:, :1] * 0), tmp_path / "m.onnx")


CORA = Path(__file__).resolve().parents[3] / "shared" / "data" / "planetoid" / "Cora" / "raw"


@pytest.mark.skipif(not CORA.is_dir(), reason=f"Cora raw files not found at {CORA}")
def test_trained_gcn_on_cora(tmp_path):
    from torch_geometric.datasets import Planetoid

    shutil.copytree(CORA, tmp_path / "Cora" / "raw")
    data = Planetoid(str(tmp_path), "Cora")[0]
    torch.manual_seed(0)
    model = models.GCN(data.num_features, 16, 2, 7)
    opt = torch.optim.Adam(model.parameters(), lr=0.01, weight_decay=5e-4)
    for _ in range(30):
        model.train()
        opt.zero_grad()
        out = model(data.x, data.edge_index)
        torch.nn.functional.cross_entropy(out[data.train_mask], data.y[data.train_mask]).backward()
        opt.step()
    model.eval()
    with torch.no_grad():
        ref = model(data.x, data.edge_index)
    acc = (ref[data.test_mask].argmax(1) == data.y[data.test_mask]).float().mean()
    assert acc > 0.6
    # export on a small subgraph, run on the full graph (another size)
    sub = data.edge_index[:, (data.edge_index < 50).all(0)]
    path = tmp_path / "cora_gcn.onnx"
    gnncompile.export(model, (data.x[:50], sub), path)
    onnx.checker.check_model(onnx.load(str(path)), full_check=True)
    out = _run_ort(_ort(path), data.x, data.edge_index)
    torch.testing.assert_close(out, ref, rtol=1e-4, atol=1e-4)
    pt2 = tmp_path / "cora_gcn.pt2"
    gnncompile.export(model, (data.x[:50], sub), pt2, format="pt2")
    with torch.no_grad():
        torch.testing.assert_close(torch.export.load(str(pt2)).module()(data.x, data.edge_index), ref,
                                   rtol=1e-5, atol=1e-5)


def test_cli_export(tmp_path, capsys):
    from gnncompile.cli import main

    path = tmp_path / "cli.onnx"
    # a model that needs constructor arguments: a module-level factory in this test module
    rc = main(["export", f"{__name__}:_cli_model", "-i", "float32:20,8", "-i", "int64:2,60",
               "-o", str(path)])
    assert rc == 0
    out = capsys.readouterr().out
    assert "gnncompile::spmm_" in out
    x, ei = OTHER
    torch.testing.assert_close(_run_ort(_ort(path), x, ei), _cli_model()(x, ei), rtol=1e-4, atol=1e-4)
    rc = main(["export", f"{__name__}:_Net", "-i", "float32:20,8", "-i", "int64:2,60", "-o",
               str(tmp_path / "bad.onnx")])
    assert rc == 2
    assert "odd (_DataDependent)" in capsys.readouterr().err


def _cli_model():
    torch.manual_seed(0)
    return models.GraphSAGE(F_IN, 16, 2, 4).eval()


# ----------------------------------------------------------------------------- the ONNX functions
def _call_function(fn, inputs, n_out=1, out_type=onnx.TensorProto.FLOAT, out_rank=None):
    """A one-node ONNX model calling gnncompile::<fn> (with the functions it calls), run in
    onnxruntime."""
    from onnx import helper

    from gnncompile.export import onnx_functions as OF

    names = [f"in{i}" for i in range(len(inputs))]
    out_rank = inputs[-1].dim() if out_rank is None else out_rank
    outs = [f"out{i}" for i in range(n_out)]
    node = helper.make_node(fn.name, names, outs, domain=OF.DOMAIN)
    graph = helper.make_graph(
        [node], "g",
        [helper.make_tensor_value_info(n, helper.np_dtype_to_tensor_dtype(t.numpy().dtype),
                                       [f"{n}_{d}" for d in range(t.dim())])
         for n, t in zip(names, inputs)],
        [helper.make_tensor_value_info(o, out_type, [f"{o}_{d}" for d in range(out_rank)]) for o in outs])
    model = helper.make_model(graph, functions=OF.function_protos(fn),
                              opset_imports=[helper.make_opsetid("", 18), helper.make_opsetid(OF.DOMAIN, 1)])
    onnx.checker.check_model(model)
    so = ort.SessionOptions()
    so.log_severity_level = 3
    sess = ort.InferenceSession(model.SerializeToString(), so, providers=["CPUExecutionProvider"])
    res = sess.run(None, {n: t.numpy() for n, t in zip(names, inputs)})
    return [torch.from_numpy(r) for r in res]


def _structure(n, e, seed, isolated=3):
    x, ei = _graph(n, e, seed, isolated)
    ei = torch.cat([ei, ei[:, :5]], 1)  # duplicate edges
    rowptr, col, perm = gnncompile.ops.reference.build_csr(ei[1], ei[0], n, n)
    return x, ei, rowptr, col, perm


@pytest.mark.parametrize("n,e", [(15, 40), (6, 0)])
def test_onnx_function_build_csr(n, e):
    from gnncompile.export import onnx_functions as OF

    x, ei, rowptr, col, perm = _structure(n, e, seed=3)
    got = _call_function(OF.build_csr, [ei[1], ei[0], torch.tensor(n)], n_out=3,
                         out_type=onnx.TensorProto.INT64, out_rank=1)
    for a, b in zip(got, (rowptr, col, perm)):  # identical, including the stable order
        assert torch.equal(a, b)


@pytest.mark.parametrize("weighted", ["none", "edge", "head"])
@pytest.mark.parametrize("reduce", ["sum", "mean", "max", "min"])
@pytest.mark.parametrize("n,e", [(15, 40), (6, 0)])
def test_onnx_function_spmm(reduce, weighted, n, e):
    from gnncompile.export import onnx_functions as OF

    x, ei, rowptr, col, perm = _structure(n, e, seed=4)
    E = ei.size(1)
    w = None
    if weighted == "edge":
        w = torch.rand(E) + 0.1
        wb = w.view(-1, 1)
    elif weighted == "head":
        x = x.view(n, 2, 4)
        w = torch.rand(E, 2) + 0.1
        wb = w.unsqueeze(-1)
    ref, _ = gnncompile.ops.reference.spmm(rowptr, col, perm, w, x, reduce)
    fn = OF.SPMM[(reduce, w is not None)]
    args = [rowptr, col, perm] + ([wb] if w is not None else []) + [x]
    (got,) = _call_function(fn, args)
    assert torch.isfinite(got).all()
    torch.testing.assert_close(got, ref, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("heads", [0, 3])
def test_onnx_function_edge_softmax(heads):
    from gnncompile.export import onnx_functions as OF

    x, ei, rowptr, col, perm = _structure(15, 40, seed=5)
    E = ei.size(1)
    scores = torch.randn(E, heads) if heads else torch.randn(E)
    ref = gnncompile.ops.reference.edge_softmax(rowptr, perm, scores)
    (got,) = _call_function(OF.edge_softmax, [rowptr, perm, scores])
    torch.testing.assert_close(got, ref, rtol=1e-5, atol=1e-6)


# ----------------------------------------------------------------------------- bad indices, NaN
@pytest.fixture(scope="module")
def sage_max_onnx(tmp_path_factory):
    """GraphSAGE (aggr="max") and its ONNX file, exported once for the tests below."""
    model = _model("GraphSAGE-max")
    path = tmp_path_factory.mktemp("sage") / "sage_max.onnx"
    gnncompile.export(model, EXAMPLE, path)
    return model, _ort(path)


@pytest.mark.parametrize("row", [0, 1], ids=["src", "dst"])
@pytest.mark.parametrize("bad", ["negative", "num_nodes"])
def test_onnx_rejects_out_of_range_index(sage_max_onnx, row, bad):
    """onnxruntime's Gather / ScatterElements wrap -1 to N-1; the export raises at run time,
    as eager and the pt2 program do."""
    model, sess = sage_max_onnx
    x, ei = OTHER
    ei = ei.clone()
    ei[row, 7] = -1 if bad == "negative" else x.size(0)
    with pytest.raises((IndexError, RuntimeError, ValueError)):
        model(x, ei)
    with pytest.raises(Exception, match="out of data bounds"):
        _run_ort(sess, x, ei)


@pytest.mark.parametrize("case", ["GraphSAGE-max", "SimpleConv-min"])
def test_onnx_max_min_propagate_nan(case, sage_max_onnx, tmp_path):
    """A NaN among a row's inputs gives NaN in that output row, as eager's scatter_reduce."""
    if case == "GraphSAGE-max":
        model, sess = sage_max_onnx
    else:
        model = gnn.SimpleConv(aggr="min").eval()
        gnncompile.export(model, EXAMPLE, tmp_path / "min.onnx")
        sess = _ort(tmp_path / "min.onnx")
    x, ei = OTHER
    x = x.clone()
    x[ei[0, :3], 2] = float("nan")
    x[ei[0, 10], 5] = float("nan")
    with torch.no_grad():
        ref = model(x, ei)
    out = _run_ort(sess, x, ei)
    assert torch.isnan(ref).any() and not torch.isnan(ref).all()
    assert torch.equal(torch.isnan(out), torch.isnan(ref))
    torch.testing.assert_close(out, ref, rtol=1e-4, atol=1e-4, equal_nan=True)
