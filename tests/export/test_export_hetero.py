"""Heterogeneous models (``torch_geometric.nn.to_hetero``, ``forward(x_dict, edge_index_dict)``
returning a dict per node type): the ONNX file takes one input per dict entry, named
``x.<node type>`` / ``edge_index.<src>__<rel>__<dst>``, gives ``out.<node type>``, runs in
onnxruntime on a graph of another size, and refuses a missing key or a wrong dtype clearly; the
pt2 program takes and returns the dicts."""
from __future__ import annotations

import warnings

import pytest
import torch

import gnncompile
from gnncompile.export import ExportError, load

onnx = pytest.importorskip("onnx")
ort = pytest.importorskip("onnxruntime")

from test_export import _ort  # noqa: E402

with warnings.catch_warnings():
    warnings.simplefilter("ignore")
    from torch_geometric.nn import SAGEConv, to_hetero

WRITES, CITES, WRITTEN = ("author", "writes", "paper"), ("paper", "cites", "paper"), ("paper", "rev_writes", "author")
METADATA = (["paper", "author"], [WRITES, CITES, WRITTEN])
INPUTS = ["x.paper", "x.author", "edge_index.author__writes__paper", "edge_index.paper__cites__paper",
          "edge_index.paper__rev_writes__author"]
OUTPUTS = ["out.paper", "out.author"]


class _SAGE(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.conv1 = SAGEConv((-1, -1), 16)
        self.conv2 = SAGEConv((-1, -1), 4, aggr="max")

    def forward(self, x, edge_index):
        return self.conv2(self.conv1(x, edge_index).relu(), edge_index)


def _graph(papers, authors, writes, cites, seed):
    g = torch.Generator().manual_seed(seed)
    x = {"paper": torch.randn(papers, 8, generator=g), "author": torch.randn(authors, 6, generator=g)}
    w = torch.stack([torch.randint(0, authors, (writes,), generator=g),
                     torch.randint(0, papers, (writes,), generator=g)])
    ei = {WRITES: w, CITES: torch.randint(0, papers, (2, cites), generator=g), WRITTEN: w.flip(0)}
    return x, ei


EXAMPLE = _graph(10, 7, 20, 25, seed=0)
OTHER = _graph(31, 12, 70, 55, seed=1)  # another size: every node and edge type


@pytest.fixture(scope="module")
def hetero(tmp_path_factory):
    torch.manual_seed(0)
    model = to_hetero(_SAGE(), METADATA, aggr="sum")
    with torch.no_grad():
        model(*EXAMPLE)  # materialise the lazy (-1) input sizes
    model.eval()
    path = tmp_path_factory.mktemp("hetero") / "sage.onnx"
    res = gnncompile.export(model, EXAMPLE, path)
    return model, res, path


def test_onnx_names_and_numbers_on_another_graph(hetero):
    model, res, path = hetero
    assert res.input_names == INPUTS and res.output_names == OUTPUTS
    proto = onnx.load(str(path))
    onnx.checker.check_model(proto, full_check=True)
    assert [i.name for i in proto.graph.input] == INPUTS
    assert [o.name for o in proto.graph.output] == OUTPUTS
    dims = {i.name: [d.dim_param or d.dim_value for d in i.type.tensor_type.shape.dim] for i in proto.graph.input}
    assert dims["x.paper"] == ["num_nodes.paper", 8]
    assert dims["edge_index.paper__cites__paper"] == [2, "num_edges.paper__cites__paper"]
    # every relation's aggregation fused, and named after its layer
    layers = {f.layer for f in res.fused if f.kind == "spmm"}
    assert {f"conv{i}.{r} (SAGEConv)" for i in (1, 2) for r in ("author__writes__paper", "paper__cites__paper",
                                                               "paper__rev_writes__author")} == layers
    sess = _ort(path)
    for x, ei in (OTHER, EXAMPLE):
        with torch.no_grad():
            ref = model(x, ei)
        outs = sess.run(None, res.onnx_feed(x, ei))
        for name, out in zip(OUTPUTS, outs):
            torch.testing.assert_close(torch.from_numpy(out), ref[name.split(".", 1)[1]], rtol=1e-4, atol=1e-4)


def test_onnx_bad_inputs_are_clear_errors(hetero):
    model, res, path = hetero
    sess = _ort(path)
    x, ei = OTHER
    missing = {k: v for k, v in x.items() if k != "author"}
    with pytest.raises(ValueError, match=r"input x\.author is missing: x has no key 'author'"):
        res.onnx_feed(missing, ei)
    with pytest.raises(ValueError, match=r"keys the export does not take: \['venue'\]"):
        res.onnx_feed({**x, "venue": x["paper"]}, ei)
    with pytest.raises(TypeError, match=r"input x\.paper has dtype torch\.float64; the export takes torch\.float32"):
        res.onnx_feed({**x, "paper": x["paper"].double()}, ei)
    with pytest.raises(TypeError, match=r"input edge_index\.paper__cites__paper has dtype torch\.int32"):
        res.onnx_feed(x, {**ei, CITES: ei[CITES].int()})
    with pytest.raises(TypeError, match=r"must be a dict of tensors"):
        res.onnx_feed(x["paper"], ei)
    # onnxruntime itself, fed by name, refuses the same (it names a missing input)
    feed = res.onnx_feed(x, ei)
    with pytest.raises(Exception, match=r"x\.author"):
        sess.run(None, {k: v for k, v in feed.items() if k != "x.author"})
    with pytest.raises(Exception, match=r"(?i)data type"):
        sess.run(None, {**feed, "x.paper": feed["x.paper"].astype("float64")})


def test_pt2_takes_the_dicts(hetero, tmp_path):
    model, _, _ = hetero
    path = tmp_path / "sage.pt2"
    res = gnncompile.export(model, EXAMPLE, path, format="pt2")
    assert res.input_names == INPUTS and res.output_names == OUTPUTS
    ep = load(path)  # torch.export.load, with the edge types tuples again
    x, ei = OTHER
    with torch.no_grad():
        out, ref = ep.module()(x, ei), model(x, ei)
    assert set(out) == set(ref)
    for k in ref:
        torch.testing.assert_close(out[k], ref[k], rtol=1e-5, atol=1e-5)
    with pytest.raises(ValueError, match="tree spec"):
        ep.module()({"paper": x["paper"]}, ei)


def test_dict_keys_must_be_types(tmp_path):
    model = _SAGE().eval()
    x, ei = EXAMPLE
    with pytest.raises(ExportError, match="dict keys must be strings or tuples of strings"):
        gnncompile.export(model, ({1: x["paper"]}, ei), tmp_path / "bad.onnx")
