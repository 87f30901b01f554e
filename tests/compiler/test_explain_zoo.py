"""explain over PyG's zoo (issue 32, point 3): every entry of benchmarks/zoo.py (each PyG
convolution and ``nn.models`` model that constructs here, homogeneous and heterogeneous) is
explained without an error, and explain's counts agree with what runs: its graph pieces with the
graphs Dynamo compiled, its fused op calls with the gnncompile ops torch.profiler records in the
same call, the kinds of its fused chains with the kinds of ops that run, and every graph break
Dynamo counted is in its list."""
from __future__ import annotations

import warnings

import pytest
import torch
from torch._dynamo.utils import counters
from torch.profiler import ProfilerActivity, profile

import gnncompile
from benchmarks import zoo
from gnncompile.compiler import backend as _backend
from gnncompile.ops.structure import clear_cache
from gnncompile.passes import FUSED_OPS
from gnncompile.passes.report import one_line

ENTRIES = zoo._entries()
FAST = {"GCNConv", "GATConv", "GINEConv", "HGTConv", "SchNet"}  # the rest are marked slow
KIND_OP = {"spmm": "spmm", "edge_softmax": "edge_softmax", "attention": "attention", "attention_v2": "attention_v2", "attention_dot": "attention_dot", "dense_attention": "dense_attention", "degree": "csr_degree", "message": "message_reduce",
           "segment": "message_reduce", "edges": "message_edges",
           "message_softmax": "message_softmax"}


@pytest.mark.parametrize("name", [n if n in FAST else pytest.param(n, marks=pytest.mark.slow) for n in ENTRIES])
def test_explain_counts_agree_with_dynamo_and_the_profiler(name):
    build, inputs = ENTRIES[name]
    g = zoo.Graph(40, 3)
    torch.manual_seed(0)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        model = build(g)
    args = inputs(g)
    settings = zoo.ENTRY_SETTINGS.get(name)  # an entry's own (GPSConv-static: capture_dynamic=False)
    for attempt in range(2):
        torch._dynamo.reset()
        counters.clear()
        clear_cache()  # graph-only results of an attempt before: computed again, as explain counts
        with profile(activities=[ProfilerActivity.CPU]) as prof:
            target = gnncompile.compile(model, settings=settings) if settings else model
            rep = gnncompile.explain(target, *args)
        if attempt or not any(n.startswith("scalar reads left to eager") for n in rep.notes):
            break
        # explain compiled twice (the capture switch, tests/compiler/test_capture_switch.py): count
        # the form it reports alone, compiled that way from the start
        settings = {**(settings or {}), "capture_dynamic": "outputs"}
    ran = {e.key.split("::", 1)[1]: e.count for e in prof.key_averages()
           if e.key.startswith("gnncompile::") and e.key.split("::", 1)[1] in FUSED_OPS}
    assert rep.num_graphs == counters["stats"]["unique_graphs"] >= 1, str(rep)
    assert rep.op_calls == ran, f"explain says {rep.op_calls}, the profiler saw {ran}\n{rep}"
    # a fused sum spmm runs as spmm, or as spmm_self where GINConv's self term was folded into it
    # (passes/self_term.py; explain's notes say so)
    runs_as = [{"spmm", "spmm_self"} if KIND_OP[f.kind] == "spmm" else {KIND_OP[f.kind]} for f in rep.fused]
    assert all(ops & set(ran) for ops in runs_as), str(rep)
    assert set(ran) <= set().union(*runs_as), str(rep)
    assert ("spmm_self" in ran) == any("spmm_self" in n for n in rep.notes), str(rep)
    listed = {one_line(b.reason, 60) for b in rep.graph_breaks}
    for reason in counters["graph_break"]:
        assert one_line(_backend.plain_reason(reason), 60) in listed, (reason, str(rep))
    assert rep.num_graph_breaks >= len(counters["graph_break"])
    text = str(rep)
    assert "getattr(" not in text and "L['" not in text  # layers named by their paths
    assert all(f.layer and f.layer != "<model>" for f in rep.fused + rep.unfused), text
