"""ONNX export and out-of-range node indices: onnxruntime's Gather / ScatterElements wrap an
index in ``[-N, 0)`` to ``i + N`` where eager PyG raises (``index_select``, ``scatter_add_``,
``scatter_reduce_``). The export guards every standard index op (export/indices.py), so the file
raises where eager raises, for the unfused parts of a layer as for its fused ops, and gives
eager's numbers for valid inputs."""
from __future__ import annotations

import warnings

import pytest
import torch

import gnncompile

pytest.importorskip("onnx")
pytest.importorskip("onnxruntime")

from test_export import D, EXAMPLE, F_IN, OTHER, _edge_inputs, _ort, _run_ort  # noqa: E402

with warnings.catch_warnings():
    warnings.simplefilter("ignore")
    import torch_geometric.nn as gnn


def _mlp():
    return torch.nn.Sequential(torch.nn.Linear(2 * F_IN, 8), torch.nn.ReLU(), torch.nn.Linear(8, 4))


# name -> (factory, extra input: "attr" [E, D] edge features, "" none)
LAYERS = {
    # unfused gathers / scatters (index_select, scatter_add_, scatter_reduce_) in the file
    "GINEConv": (lambda: gnn.GINEConv(torch.nn.Linear(F_IN, 4), edge_dim=D), "attr"),
    "EdgeConv": (lambda: gnn.EdgeConv(_mlp()), ""),
    "TransformerConv": (lambda: gnn.TransformerConv(F_IN, 4, heads=2, edge_dim=D), "attr"),
    # fused ops (gnncompile-domain functions) next to standard ones
    "GCNConv": (lambda: gnn.GCNConv(F_IN, 4), ""),
    "SAGEConv": (lambda: gnn.SAGEConv(F_IN, 4), ""),
    "GATConv": (lambda: gnn.GATConv(F_IN, 4, heads=2), ""),
}
# what onnxruntime says for an index outside [-N, N): Gather / ScatterElements "indices element
# out of data bounds", GatherElements "Out of range value", GatherND / ScatterND "invalid index"
OUT_OF_BOUNDS = r"(?i)out of data bounds|out of range|invalid ind(ex|ice)"


@pytest.fixture(scope="module", params=list(LAYERS))
def exported(request, tmp_path_factory):
    """(model, onnxruntime session, inputs on another graph than the export example)."""
    factory, kind = LAYERS[request.param]
    torch.manual_seed(0)
    model = factory().eval()
    path = tmp_path_factory.mktemp("indices") / f"{request.param}.onnx"
    gnncompile.export(model, _edge_inputs(EXAMPLE, kind, seed=10), path)
    return model, _ort(path), _edge_inputs(OTHER, kind, seed=11)


def test_valid_indices_match_eager(exported):
    model, sess, inputs = exported
    with torch.no_grad():
        ref = model(*inputs)
    torch.testing.assert_close(_run_ort(sess, *inputs), ref, rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("row", [0, 1], ids=["src", "dst"])
@pytest.mark.parametrize("bad", ["-1", "N"])
def test_out_of_range_index_raises(exported, bad, row):
    model, sess, (x, ei, *rest) = exported
    ei = ei.clone()
    ei[row, 7] = -1 if bad == "-1" else x.size(0)
    # (PyG's aggregations check the largest index themselves: ValueError)
    with pytest.raises((IndexError, RuntimeError, ValueError)), torch.no_grad():
        model(x, ei, *rest)
    with pytest.raises(Exception, match=OUT_OF_BOUNDS):
        _run_ort(sess, x, ei, *rest)


class _Indexed(torch.nn.Module):
    """``fn(x, edge_index[0])``."""

    def __init__(self, fn):
        super().__init__()
        self.fn = fn

    def forward(self, x, edge_index):
        return self.fn(x, edge_index[0])


def _ones(i, width=3):
    return torch.ones(i.size(0), width)


# every spelling Dynamo records (method, function, in place) and dims other than 0
OPS = {
    "torch.index_select-dim1": lambda x, i: torch.index_select(x.t(), 1, i),
    "gather-dim1": lambda x, i: x.t().gather(1, i.view(1, -1).expand(x.size(1), -1)),
    "torch.scatter_add": lambda x, i: torch.scatter_add(
        torch.zeros(x.size(0), 3), 0, i.view(-1, 1).expand(-1, 3), _ones(i)),
    "scatter-value": lambda x, i: torch.zeros(x.size(0), 3).scatter(0, i.view(-1, 1).expand(-1, 3), 2.0),
    "torch.scatter_reduce": lambda x, i: torch.scatter_reduce(
        torch.zeros(x.size(0), 3), 0, i.view(-1, 1).expand(-1, 3), _ones(i), "amax", include_self=False),
    "index_add_": lambda x, i: torch.zeros(x.size(0), 3).index_add_(0, i, _ones(i)),
    "index_copy": lambda x, i: torch.zeros(x.size(0), 3).index_copy(0, i, _ones(i)),
    "F.embedding": lambda x, i: torch.nn.functional.embedding(i, x),
}


@pytest.mark.parametrize("op", list(OPS))
def test_index_ops_raise_on_negative_index(op, tmp_path):
    model = _Indexed(OPS[op])
    path = tmp_path / "op.onnx"
    gnncompile.export(model, EXAMPLE, path)
    sess = _ort(path)
    x, ei = OTHER
    torch.testing.assert_close(_run_ort(sess, x, ei), model(x, ei), rtol=1e-5, atol=1e-5)
    ei = ei.clone()
    ei[0, 7] = -1
    with pytest.raises((IndexError, RuntimeError)):
        model(x, ei)
    with pytest.raises(Exception, match=OUT_OF_BOUNDS):
        _run_ort(sess, x, ei)


def test_one_guard_per_index(tmp_path):
    """TransformerConv gathers and scatters with both rows of edge_index, all over N rows: two
    guards, the scatters' broadcast reshapes after them."""
    from gnncompile.export.capture import optimize

    factory, kind = LAYERS["TransformerConv"]
    ep, _ = optimize(factory().eval(), _edge_inputs(EXAMPLE, kind, seed=10), for_onnx=True)
    fills = [n for n in ep.graph.nodes if n.op == "call_function" and "masked_fill" in str(n.target)]
    assert len(fills) == 2
    scatters = [n for n in ep.graph.nodes if n.op == "call_function" and "scatter" in str(n.target)]
    assert scatters
    for n in scatters:  # index: expand(view(guarded))
        index = n.args[2]
        while index.op == "call_function" and "masked_fill" not in str(index.target):
            index = index.args[0]
        assert index in fills


class _Gather(torch.nn.Module):
    """Advanced indexing (``x[idx]``): torch wraps ``-N <= i < 0`` and raises outside ``[-N, N)``."""

    def forward(self, x, edge_index):
        return x[edge_index[0]] * 2 + x[:, :3][edge_index[1]].sum(-1, keepdim=True)


@pytest.fixture(scope="module")
def gather_onnx(tmp_path_factory):
    path = tmp_path_factory.mktemp("getitem") / "getitem.onnx"
    gnncompile.export(_Gather(), EXAMPLE, path)
    return _ort(path)


@pytest.mark.parametrize("value", [0, -1, "-N"])
def test_advanced_indexing_wraps_as_eager(gather_onnx, value):
    x, ei = OTHER
    ei = ei.clone()
    ei[0, 3] = -x.size(0) if value == "-N" else value
    ei[1, 5] = -1 if value else 0
    torch.testing.assert_close(_run_ort(gather_onnx, x, ei), _Gather()(x, ei), rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("row", [0, 1], ids=["src", "dst"])
@pytest.mark.parametrize("bad", ["N", "-N-1"])
def test_advanced_indexing_out_of_range_raises(gather_onnx, bad, row):
    x, ei = OTHER
    ei = ei.clone()
    ei[row, 3] = x.size(0) if bad == "N" else -x.size(0) - 1
    with pytest.raises(IndexError):
        _Gather()(x, ei)
    with pytest.raises(Exception, match=OUT_OF_BOUNDS):
        _run_ort(gather_onnx, x, ei)


def test_pt2_keeps_torch_semantics(tmp_path):
    """The guards are for ONNX only: the torch.export program raises as eager by itself."""
    factory, kind = LAYERS["GINEConv"]
    torch.manual_seed(0)
    model = factory().eval()
    path = tmp_path / "gine.pt2"
    # (a contiguous example: the program would require the example's strides of edge_index)
    example = tuple(t.contiguous() for t in _edge_inputs(EXAMPLE, kind, seed=10))
    gnncompile.export(model, example, path, format="pt2")
    ep = torch.export.load(str(path))
    assert not any("masked_fill" in str(n.target) for n in ep.graph.nodes)
    x, ei, ea = _edge_inputs(OTHER, kind, seed=11)
    ei = ei.clone()
    ei[0, 7] = -1
    with pytest.raises((IndexError, RuntimeError)), torch.no_grad():
        ep.module()(x, ei, ea)


_WRAPPED_SCRIPT = r"""
import sys, tempfile, warnings
warnings.simplefilter("ignore")
import torch, torch.distributed as dist
import gnncompile
from test_export_indices import OPS, OTHER, _Indexed, _ort, _run_ort, EXAMPLE
folder = tempfile.mkdtemp()
dist.init_process_group("gloo", init_method=f"file://{folder}/store", rank=0, world_size=1)
dist.destroy_process_group()
from torch_geometric.hash_tensor import _new_index_select
assert torch.index_select is _new_index_select  # PyG's wrapper, which Dynamo now records
model = _Indexed(OPS["torch.index_select-dim1"])
gnncompile.export(model, EXAMPLE, folder + "/m.onnx")
x, ei = OTHER
ei = ei.clone()
ei[0, 7] = -1
try:
    _run_ort(_ort(folder + "/m.onnx"), x, ei)
except Exception as e:
    print("raised:", " ".join(str(e).split()))
else:
    print("no error")
"""


@pytest.mark.slow
def test_guard_when_dynamo_records_pygs_index_select_wrapper():
    """PyG replaces ``torch.index_select`` by a wrapper of its own (``_new_index_select``); once
    torch.distributed has been initialised in the process, Dynamo records the wrapper instead of
    the builtin, and the export's index guard (and the passes) must still know it: a fresh
    process, as a DDP user's."""
    import os
    import subprocess
    import sys
    from pathlib import Path

    here = Path(__file__).resolve().parent
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(here), str(here.parent)]))
    p = subprocess.run([sys.executable, "-c", _WRAPPED_SCRIPT], capture_output=True, text=True, env=env,
                       timeout=600, cwd=here.parents[1])
    assert p.returncode == 0, p.stderr[-3000:]
    import re

    assert "raised:" in p.stdout and re.search(OUT_OF_BOUNDS, p.stdout), p.stdout
