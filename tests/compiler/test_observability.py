"""Observability: `gnncompile explain` on the command line, the package logger, readable ONNX
names, layer labels whatever ``forward``'s first parameter is called."""
from __future__ import annotations

import warnings

import torch

import gnncompile

with warnings.catch_warnings():
    warnings.simplefilter("ignore")
    from torch_geometric.nn import MessagePassing


def _graph(n=12, e=40, f=8, seed=0):
    g = torch.Generator().manual_seed(seed)
    return torch.randn(n, f, generator=g), torch.randint(0, n, (2, e), generator=g)


class ThisConv(MessagePassing):
    """A layer whose methods name their instance ``this``."""
    propagate_type = {"x": torch.Tensor}  # PyG finds `self.propagate(` calls by their text

    def __init__(this, aggr="add"):
        super().__init__(aggr=aggr)
        this.lin = torch.nn.Linear(8, 8)

    def forward(this, x, edge_index):
        return this.propagate(edge_index, x=this.lin(x))


class ThisNet(torch.nn.Module):
    def __init__(this):
        super().__init__()
        this.conv1 = ThisConv()
        this.convs = torch.nn.ModuleList([ThisConv("max")])

    def forward(this, x, edge_index):
        return this.convs[0](this.conv1(x, edge_index).relu(), edge_index)


def test_explain_layer_labels_with_this():
    x, ei = _graph()
    rep = gnncompile.explain(ThisNet(), x, ei)
    assert sorted(f.layer for f in rep.fused if f.kind == "spmm") == \
        ["conv1 (ThisConv)", "convs.0 (ThisConv)"], str(rep)
    rep = gnncompile.explain(ThisConv(), x, ei)
    assert [f.layer for f in rep.fused if f.kind == "spmm"] == ["<model> (ThisConv)"], str(rep)
    assert "L['" not in str(rep)


def test_explain_labels_layers_compiled_as_frames_of_their_own():
    """A graph break inside BasicGNN's layer loop (GCN's self loops) makes Dynamo run that
    forward eagerly from then on and compile each layer as a frame of its own, also for other
    BasicGNN models: labels must still be the layers' paths in the user's model."""
    from torch_geometric.nn import models

    x, ei = _graph(20, 60)
    torch.manual_seed(0)
    gcn = gnncompile.compile(models.GCN(8, 16, 2, 4), profile=None)
    gcn(x, ei)
    rep = gnncompile.explain(_sage(), x, ei)
    assert sorted(f.layer for f in rep.fused if f.kind == "spmm") == \
        ["convs.0 (SAGEConv)", "convs.1 (SAGEConv)"], str(rep)


def test_explain_labels_to_hetero_layers_by_their_paths():
    """to_hetero's GraphModule holds one layer per edge type under a name that is not an
    identifier ('0'); Dynamo's source for it is a getattr(...) expression."""
    from torch_geometric.data import HeteroData
    from torch_geometric.nn import to_hetero

    x, ei = _graph(20, 60)
    d = HeteroData()
    d["a"].x, d["b"].x = x, x[:10]
    d["a", "to", "a"].edge_index = ei
    d["a", "in", "b"].edge_index = ei[:, ei[1] < 10]
    torch.manual_seed(0)
    model = to_hetero(_sage(), d.metadata(), aggr="sum")
    rep = gnncompile.explain(model, d.x_dict, d.edge_index_dict)
    layers = sorted({f.layer for f in rep.fused})
    assert layers == [f"convs.{i}.{et} (SAGEConv)" for i in (0, 1) for et in ("a__in__b", "a__to__a")], str(rep)
    assert "getattr" not in str(rep) and "L['" not in str(rep)


# ----------------------------------------------------------------------------- gnncompile explain
def _sage():
    from torch_geometric.nn import models

    torch.manual_seed(0)
    return models.GraphSAGE(8, 16, 2, 4, aggr="max")


def test_cli_explain(capsys, tmp_path):
    import json

    from gnncompile.cli import main

    spec = ["-i", "float32:20,8", "-i", "int64:2,60"]
    assert main(["explain", f"{__name__}:ThisNet", *spec]) == 0
    out = capsys.readouterr().out
    assert out.startswith("gnncompile.explain: 2 fused chain(s)")
    assert "spmm[max]" in out and "in convs.0 (ThisConv)" in out
    path = tmp_path / "sage.pt"  # the other way to name a model: a torch.save file
    torch.save(_sage(), path)
    assert main(["explain", str(path), *spec, "--json"]) == 0
    rep = json.loads(capsys.readouterr().out)
    assert rep["num_fused"] == 2 and rep["num_graph_breaks"] == 0
    assert [f["layer"] for f in rep["fused"] if f["kind"] == "spmm"] == \
        ["convs.0 (SAGEConv)", "convs.1 (SAGEConv)"]
    assert {f["reduce"] for f in rep["fused"] if f["kind"] == "spmm"} == {"max"}


def test_cli_imports_a_module_from_the_current_folder(capsys, tmp_path, monkeypatch):
    import sys

    from gnncompile.cli import main

    (tmp_path / "my_gnn_here.py").write_text(
        "import torch\nfrom torch_geometric.nn import SAGEConv\n"
        "class Net(torch.nn.Module):\n"
        "    def __init__(self):\n        super().__init__()\n        self.conv = SAGEConv(8, 8)\n"
        "    def forward(self, x, edge_index):\n        return self.conv(x, edge_index)\n")
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(sys, "path", [p for p in sys.path if p not in ("", str(tmp_path))])
    monkeypatch.delitem(sys.modules, "my_gnn_here", raising=False)
    assert main(["explain", "my_gnn_here:Net", "-i", "float32:20,8", "-i", "int64:2,60"]) == 0
    assert capsys.readouterr().out.startswith("gnncompile.explain: 1 fused chain(s)")


def test_cli_wrong_input_shape_is_one_line(capsys):
    from gnncompile.cli import main

    for cmd in (["explain"], ["export", "-o", "unused.onnx"]):
        assert main(cmd[:1] + [f"{__name__}:ThisNet", "-i", "float32:20,5", "-i", "int64:2,60"] + cmd[1:]) == 2
        err = capsys.readouterr().err.strip().splitlines()
        assert len(err) == 1 and "fails on the example inputs (-i float32:20,5 -i int64:2,60)" in err[0], err
        assert "RuntimeError" in err[0] and "Traceback" not in err[0]


# ----------------------------------------------------------------------------- ONNX names
class _TwoOut(torch.nn.Module):
    """Parameters named otherwise than x / edge_index, two outputs, and an intermediate value
    that torch.export names ``out`` (the fused spmm); ``extra``'s size is a symbol of its own."""

    def __init__(self):
        super().__init__()
        from torch_geometric.nn import GraphConv

        self.conv = GraphConv(8, 4)

    def forward(self, feats, adj, edge_w, extra):
        h = self.conv(feats, adj, edge_w)
        return h, h.sum(1).sum() + extra


def _dims(v):
    return [d.dim_param or d.dim_value for d in v.type.tensor_type.shape.dim]


def test_onnx_readable_names(tmp_path):
    import onnx
    import onnxruntime as ort

    x, ei = _graph()
    w = torch.rand(ei.size(1))
    model = _TwoOut().eval()
    path = tmp_path / "two.onnx"
    gnncompile.export(model, (x, ei, w, torch.rand(5)), path)
    proto = onnx.load(str(path))
    onnx.checker.check_model(proto, full_check=True)  # names stay unique
    assert [(i.name, _dims(i)) for i in proto.graph.input] == [
        ("feats", ["num_nodes", 8]), ("adj", [2, "num_edges"]), ("edge_w", ["num_edges"]),
        ("extra", ["extra_dim0"])]
    assert [(o.name, _dims(o)) for o in proto.graph.output] == [
        ("out_0", ["num_nodes", 4]), ("out_1", ["extra_dim0"])]
    assert not any(d.dim_param.startswith("s") and d.dim_param[1:].isdigit()
                   for v in proto.graph.value_info for d in v.type.tensor_type.shape.dim)
    sess = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    x2, ei2 = _graph(30, 90, seed=1)
    feed = {"feats": x2, "adj": ei2, "edge_w": torch.rand(90), "extra": torch.rand(3)}
    got = sess.run(["out_0", "out_1"], {k: v.numpy() for k, v in feed.items()})
    with torch.no_grad():
        ref = model(*feed.values())
    for g, r in zip(got, ref):
        torch.testing.assert_close(torch.from_numpy(g), r, rtol=1e-4, atol=1e-4)


# ----------------------------------------------------------------------------- logging
def test_package_logger_has_a_null_handler():
    import logging

    assert any(isinstance(h, logging.NullHandler) for h in logging.getLogger("gnncompile").handlers)


def test_compile_and_export_log(caplog, tmp_path):
    import logging

    x, ei = _graph()
    model = _sage()
    # Dynamo's per-code decisions from earlier tests (BasicGNN.forward run eagerly after a graph
    # break in its loop, each layer a frame) would split the records per layer: start afresh.
    torch._dynamo.reset()
    with caplog.at_level(logging.DEBUG, logger="gnncompile"):
        gnncompile.compile(model, profile=None)(x, ei)
    ours = [r for r in caplog.records if r.name.startswith("gnncompile.")]
    info = [r.getMessage() for r in ours if r.levelno == logging.INFO]
    debug = [r.getMessage() for r in ours if r.levelno == logging.DEBUG]
    assert any(m.startswith("compile GraphSAGE: profile") for m in info), info
    assert any("2 fused chain(s), 0 scatter(s) left unfused" in m for m in info), info
    assert any("fused spmm[max, relu input]" in m and "convs.1 (SAGEConv)" in m for m in debug), debug
    caplog.clear()
    with caplog.at_level(logging.INFO, logger="gnncompile"):
        gnncompile.export(model, (x, ei), tmp_path / "m.onnx")
    info = [r.getMessage() for r in caplog.records if r.name.startswith("gnncompile.")]
    assert any(m.startswith("export of GraphSAGE: 2 fused chain(s)") for m in info), info
    assert any(m.startswith(f"wrote {tmp_path / 'm.onnx'}: opset 18") for m in info), info
    assert not any(r.levelno == logging.DEBUG for r in caplog.records if r.name.startswith("gnncompile."))


class _Breaks(torch.nn.Module):
    """Graph breaks: one of a kind twice, one of another kind once."""

    def __init__(self):
        super().__init__()
        from torch_geometric.nn import SAGEConv

        self.convs = torch.nn.ModuleList([SAGEConv(8, 8) for _ in range(3)])

    def forward(self, x, edge_index):
        x = self._step(0, x, edge_index)
        x = self._step(1, x, edge_index)
        x = self.convs[2](x, edge_index)
        print("")  # BREAK-B
        return x.relu()

    def _step(self, i, x, edge_index):
        x = self.convs[i](x, edge_index)
        torch._dynamo.graph_break()  # BREAK-A
        return x


def test_explain_names_each_break_once_with_its_file_and_line(capsys):
    import inspect

    from torch._dynamo.utils import counters

    def line_of(fn, mark):
        lines = inspect.getsource(fn).splitlines()
        return fn.__code__.co_firstlineno + next(i for i, ln in enumerate(lines) if mark in ln)
    a, b = f"{__file__}:{line_of(_Breaks._step, 'BREAK-A')}", f"{__file__}:{line_of(_Breaks.forward, 'BREAK-B')}"
    before = sum(counters.get("graph_break", {}).values())
    rep = gnncompile.explain(_Breaks(), *_graph())
    dynamo_count = sum(counters.get("graph_break", {}).values()) - before
    by_line = {g.at.split(" ")[0]: g for g in rep.graph_breaks}
    assert set(by_line) == {a, b}, str(rep)
    assert by_line[a].count == 2 and by_line[b].count == 1
    assert "print" in by_line[b].reason and "Hint:" not in str(rep)
    assert rep.num_graph_breaks == 3 and dynamo_count >= 3, (rep.num_graph_breaks, dynamo_count)
    assert a in str(rep) and "(x2)" in str(rep)


class _LoopBreak(torch.nn.Module):
    def __init__(self):
        super().__init__()
        from torch_geometric.nn import SAGEConv

        self.convs = torch.nn.ModuleList([SAGEConv(8, 8) for _ in range(2)])

    def forward(self, x, edge_index):
        for conv in self.convs:
            x = conv(x, edge_index)
            torch._dynamo.graph_break()  # in a loop: Dynamo skips this frame
        return x


def test_explain_lists_frames_dynamo_skipped():
    rep = gnncompile.explain(_LoopBreak(), *_graph())
    line = _LoopBreak.forward.__code__.co_firstlineno
    assert len(rep.skipped_frames) == 1, str(rep)
    assert rep.skipped_frames[0].startswith(f"forward ({__file__} line {line})")
    assert "loop" in rep.skipped_frames[0]
    assert "frames Dynamo skipped" in str(rep) and rep.as_dict()["skipped_frames"] == rep.skipped_frames
    # the layers, compiled as frames of their own, still fuse
    assert rep.num_fused >= 1


def test_explain_rgcn_whose_weight_a_frame_gets_as_a_local():
    # RGCNConv hands self.weight to a frame of its own as an argument: Dynamo's name for it
    # there is no module path (explain raised "'weight' is not an nn.Module")
    from torch_geometric.nn import RGCNConv

    x, ei = _graph(n=20, e=60)
    et = torch.randint(0, 3, (60,), generator=torch.Generator().manual_seed(1))
    rep = gnncompile.explain(RGCNConv(8, 8, num_relations=3), x, ei, et)
    assert rep.num_fused >= 3 and all(f.layer == "<model> (RGCNConv)" for f in rep.fused), str(rep)


def test_recompile_limit_is_reported_loudly_and_explain_still_sees_the_model():
    import pytest
    from torch_geometric.nn import SAGEConv

    from gnncompile.compiler.backend import RECOMPILE_LIMITS, RecompileLimitWarning

    class Scaled(torch.nn.Module):  # a class of its own: a code object no other test compiled
        def __init__(self):
            super().__init__()
            self.conv = SAGEConv(8, 8)

        def forward(self, x, edge_index, k: int):
            return self.conv(x, edge_index) * k

    x, ei = _graph()
    compiled = gnncompile.compile(Scaled(), dynamic=False)  # an int argument: one compile per value
    limit = torch._dynamo.config.recompile_limit
    with pytest.warns(RecompileLimitWarning, match="recompile limit .* runs it eagerly"):
        for k in range(limit + 3):
            compiled(x, ei, k)
    assert any("'forward'" in r and __file__ in r for r in RECOMPILE_LIMITS), RECOMPILE_LIMITS
    rep = gnncompile.explain(compiled, x, ei, 3)
    assert rep.num_graphs >= 1 and rep.num_fused == 1, str(rep)  # not "0 pieces"
    assert rep.recompile_limits and "recompile limit hit" in str(rep)
    assert not gnncompile.explain(_sage(), x, ei).recompile_limits  # another model's are not listed


def test_each_chain_is_in_one_list_of_explain():
    # pooling readouts reduced as segments were listed as fused (the reduction) and as unfused
    # (the message computed beforehand) at once; now the segment line says both
    from torch_geometric.nn import GINConv, global_add_pool, global_max_pool, global_mean_pool

    class Pools(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.conv = GINConv(torch.nn.Linear(8, 8))

        def forward(self, x, edge_index, batch):
            h = self.conv(x, edge_index)
            return global_add_pool(h, batch) + global_mean_pool(h, batch) + global_max_pool(h, batch)

    x, ei = _graph(n=40, e=120)
    batch = torch.arange(40) // 10
    compiled = gnncompile.compile(Pools(), settings={"choices": {"programs": "always"}})
    rep = gnncompile.explain(compiled, x, ei, batch)
    segments = [f for f in rep.fused if f.kind == "segment"]
    assert sorted(f.reduce for f in segments) == ["max", "sum", "sum"], str(rep)
    assert all("computed beforehand" in f.note and f.note in str(f) for f in segments)
    assert not {f.node for f in rep.fused} & {u.node for u in rep.unfused}, str(rep)
