"""Sizes stay symbolic, and sizes read from the data stay in the graph (issue 24, points 1 and 4;
issue 32, point 2).

* Graph-level readout with a batch vector and no explicit size (``global_*_pool(x, batch)``,
  ``aggr.*`` readouts, ``to_dense_batch``) compiles in one piece with the layers: PyG's
  ``int(batch.max()) + 1`` is captured as an unbacked size (no graph break), over batches of
  different graph counts without a recompile, with outputs and gradients equal to eager's; the
  add / mean / max pools fuse as segment reductions. ``capture_dynamic=False`` breaks there
  again, as plain torch.compile does.
* The hoisting pass keeps the graph-only work of such a piece (the scalar read late in the
  graph is left with what reads it, not the whole region).
* The backend's inner-compiler rule reads sizes without specialising them: a model split into
  pieces by DDP's optimizer compiles once for all batch sizes.
"""
from __future__ import annotations

import warnings

import pytest
import torch
from torch._dynamo.utils import counters

import gnncompile
from gnncompile.compiler import backend as _backend
from shared import _fresh_dynamo, check_same  # noqa: F401  (autouse fixture)

with warnings.catch_warnings():
    warnings.simplefilter("ignore")
    from torch_geometric.nn import GCNConv, aggr, global_add_pool, global_max_pool, global_mean_pool
    from torch_geometric.utils import to_dense_batch

F_IN, HID = 8, 16
READOUTS = ("global_add_pool", "global_mean_pool", "global_max_pool", "to_dense_batch", "SumAggregation",
            "MeanAggregation", "MaxAggregation", "SoftmaxAggregation", "AttentionalAggregation",
            "MultiAggregation")


class Readout(torch.nn.Module):
    """A GCN layer, then a graph-level readout that is given no number of graphs."""

    def __init__(self, kind: str) -> None:
        super().__init__()
        self.kind = kind
        self.conv = GCNConv(F_IN, HID)
        self.ro = {"SumAggregation": lambda: aggr.SumAggregation(),
                   "MeanAggregation": lambda: aggr.MeanAggregation(),
                   "MaxAggregation": lambda: aggr.MaxAggregation(),
                   "SoftmaxAggregation": lambda: aggr.SoftmaxAggregation(learn=True),
                   "AttentionalAggregation": lambda: aggr.AttentionalAggregation(torch.nn.Linear(HID, 1)),
                   "MultiAggregation": lambda: aggr.MultiAggregation(["sum", "max"])}.get(kind, lambda: None)()

    def forward(self, x, edge_index, batch):
        h = self.conv(x, edge_index).relu()
        if self.kind == "global_add_pool":
            return global_add_pool(h, batch)
        if self.kind == "global_mean_pool":
            return global_mean_pool(h, batch)
        if self.kind == "global_max_pool":
            return global_max_pool(h, batch)
        if self.kind == "to_dense_batch":
            dense, mask = to_dense_batch(h, batch)
            return dense.sum(1) / mask.sum(1, keepdim=True)
        return self.ro(h, batch)


def graphs(sizes, seed: int):
    """Node features, edge_index and batch vector of len(sizes) random graphs."""
    g = torch.Generator().manual_seed(seed)
    edges, offset = [], 0
    for n in sizes:
        edges.append(torch.randint(0, n, (2, 3 * n), generator=g) + offset)
        offset += n
    batch = torch.repeat_interleave(torch.arange(len(sizes)), torch.tensor(sizes))
    return torch.randn(offset, F_IN, generator=g), torch.cat(edges, 1), batch


BATCHES = ([5, 7, 9], [4, 6, 8, 10], [3, 12], [11, 4, 6, 7, 9])


@pytest.mark.parametrize("kind", READOUTS)
def test_readout_compiles_in_one_piece(kind):
    torch.manual_seed(0)
    model = Readout(kind)
    compiled = gnncompile.compile(model, dynamic=True)
    counters.clear()
    for i, sizes in enumerate(BATCHES):
        x, ei, batch = graphs(sizes, i)
        out = compiled(x, ei, batch)
        assert out.shape[0] == len(sizes)
        check_same(model, compiled, (x, ei, batch))
    assert sum(counters["graph_break"].values()) == 0, dict(counters["graph_break"])
    assert counters["stats"]["unique_graphs"] == 1  # one graph for 2, 3, 4 and 5 graphs a batch


@pytest.mark.parametrize("kind,reduce", [("global_add_pool", "sum"), ("global_mean_pool", "sum"),
                                         ("global_max_pool", "max")])
def test_pools_fuse_as_segment_reductions_and_keep_hoisting(kind, reduce):
    rep = gnncompile.explain(Readout(kind), *graphs(BATCHES[0], 0))
    assert rep.num_graphs == 1 and rep.num_graph_breaks == 0
    assert [f.reduce for f in rep.fused if f.kind == "segment"] == [reduce]
    # the layer's self loops and normalisation are still computed once per graph
    assert rep.hoisted == 1 and rep.hoisted_nodes > 0


def test_capture_dynamic_off_breaks_as_torch_compile_does():
    rep = gnncompile.explain(gnncompile.compile(Readout("global_add_pool"), settings={"capture_dynamic": False}),
                             *graphs(BATCHES[0], 0))
    assert rep.num_graph_breaks > 0 and rep.num_graphs > 1
    cfg = torch._dynamo.config
    assert not cfg.capture_scalar_outputs and not cfg.capture_dynamic_output_shape_ops  # restored


def test_graph_size_does_not_specialise_symbolic_sizes():
    from torch._subclasses.fake_tensor import FakeTensorMode
    from torch.fx.experimental.symbolic_shapes import DimDynamic, ShapeEnv, StatelessSymbolicContext

    env = ShapeEnv()
    mode = FakeTensorMode(shape_env=env)
    dyn = DimDynamic.DYNAMIC
    x = mode.from_tensor(torch.randn(100, 8),
                         symbolic_context=StatelessSymbolicContext(dynamic_sizes=[dyn, DimDynamic.STATIC]))
    ei = mode.from_tensor(torch.zeros(2, 400, dtype=torch.long),
                          symbolic_context=StatelessSymbolicContext(dynamic_sizes=[DimDynamic.STATIC, dyn]))
    assert isinstance(x.shape[0], torch.SymInt) and isinstance(ei.shape[1], torch.SymInt)
    assert _backend.graph_size([x, ei]) == 500
    assert _backend.choose_inner([x, ei]) == "eager"
    assert not env.guards, env.guards  # read from the hints: no guard, so no recompile per size


def test_ddp_split_pieces_compile_once_for_all_sizes(tmp_path, monkeypatch):
    import torch.distributed as dist
    from torch_geometric.nn.models import GraphSAGE

    monkeypatch.delenv("GNNCOMPILE_INNER", raising=False)  # the suite's aot_eager: the 'auto' rule is tested

    dist.init_process_group("gloo", init_method=f"file://{tmp_path / 'store'}", rank=0, world_size=1)
    try:
        torch.manual_seed(0)
        model = GraphSAGE(16, 512, 3)  # 2.1 MB of parameters: DDP's optimizer splits the graph (1 MiB buckets)
        eager = GraphSAGE(16, 512, 3)
        eager.load_state_dict(model.state_dict())
        ddp = torch.nn.parallel.DistributedDataParallel(model, bucket_cap_mb=1)
        compiled = gnncompile.compile(ddp, inner="auto", dynamic=True)
        counters.clear()
        for n in (100, 130, 170, 220, 300):
            g = torch.Generator().manual_seed(n)
            x, ei = torch.randn(n, 16, generator=g), torch.randint(0, n, (2, 4 * n), generator=g)
            out = compiled(x, ei)
            torch.testing.assert_close(out, eager(x, ei), rtol=1e-4, atol=1e-5)
            out.sum().backward()
        assert counters["stats"]["unique_graphs"] == 1, "recompiled for a new size"
        # explain counts the split's boundaries (k pieces: k - 1 breaks), though torch labels
        # every piece, the last too, with its DDP reason
        rep = gnncompile.explain(compiled, x, ei)
        assert rep.num_graphs >= 2, str(rep)
        split = [b for b in rep.graph_breaks if "gradient-bucket boundaries" in b.reason]
        assert [b.count for b in split] == [rep.num_graphs - 1], str(rep)
    finally:
        dist.destroy_process_group()
