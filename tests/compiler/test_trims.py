"""Dynamo's work skipped while gnncompile compiles (gnncompile.compiler.trims): the captured graph,
the compiled results (forward and gradients, bit for bit) and the recompile behaviour are the same
with the trims on and off; each trim is active only inside a gnncompile scope, and steps aside
where its one consumer (a debug log) is on."""
from __future__ import annotations

import logging
import sys

import pytest
import torch

pyg = pytest.importorskip("torch_geometric")
from torch_geometric.nn import GINEConv, global_add_pool  # noqa: E402

import gnncompile  # noqa: E402
from gnncompile.compiler import backend as B, lean, trims  # noqa: E402

# (this torch has the three hook points; another torch may lack some: then those trims are off)
pytestmark = pytest.mark.skipif(len(trims.INSTALLED) != 3, reason=f"trims installed: {trims.INSTALLED}")


class Net(torch.nn.Module):
    def __init__(self):
        super().__init__()
        mlp = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 16))
        self.conv = GINEConv(mlp, edge_dim=3)
        self.out = torch.nn.Linear(16, 2)

    def forward(self, x, edge_index, edge_attr, batch):
        h = self.conv(x, edge_index, edge_attr).relu()
        return self.out(global_add_pool(h, batch))


def _batch(seed, n=40, e=100):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(n, 8, generator=g)
    ei = torch.randint(0, n, (2, e), generator=g)
    ea = torch.randn(e, 3, generator=g)
    batch = torch.arange(n) * 4 // n
    return x, ei, ea, batch


def _run(enabled: bool):
    """Graph code handed to the backend, outputs and gradients of two batches (the second with
    other sizes), and the number of graphs compiled, with the trims on or off."""
    codes = []
    call = B.Backend.__call__

    def spy(be, gm, example_inputs):
        codes.append(gm.code)
        return call(be, gm, example_inputs)

    torch.manual_seed(0)
    model = Net()
    torch._dynamo.reset()
    prev = trims.ENABLED[0]
    trims.ENABLED[0] = enabled
    B.Backend.__call__ = spy
    try:
        run = gnncompile.compile(model, dynamic=True, settings={"choices": {"guard": "off"}})
        outs = []
        for seed, n, e in ((1, 40, 100), (2, 57, 130)):
            x, ei, ea, batch = _batch(seed, n, e)
            x.requires_grad_(True)
            model.zero_grad(set_to_none=True)
            out = run(x, ei, ea, batch)
            out.square().sum().backward()
            outs.append([out.detach()] + [p.grad for p in model.parameters()] + [x.grad])
    finally:
        B.Backend.__call__ = call
        trims.ENABLED[0] = prev
    return codes, outs


def test_same_graph_and_bits_with_and_without_trims(monkeypatch):
    # (as in a fresh process: DTensor's _func_map not imported; restored afterwards)
    monkeypatch.delitem(sys.modules, trims._FUNC_MAP, raising=False)
    codes_on, outs_on = _run(True)
    assert trims._FUNC_MAP not in sys.modules  # the compile did not import it
    codes_off, outs_off = _run(False)
    assert codes_on and codes_on == codes_off  # the same graphs, the same number of compiles
    for a, b in zip(outs_on, outs_off):
        assert len(a) == len(b)
        for t, u in zip(a, b):
            assert torch.equal(t, u)


@pytest.fixture
def latency_spy(monkeypatch):
    """The guard latency profiler replaced by a spy (the real one needs a guard manager)."""
    calls = []
    monkeypatch.setitem(trims._ORIG, "guard_latency", lambda *a, **k: calls.append(a) or 7.0)
    return calls


def test_trims_act_only_inside_a_gnncompile_scope(latency_spy):
    from torch._dynamo import guards as G, symbolic_convert as SC

    here = __file__
    line = Net.forward.__code__.co_firstlineno + 1
    assert not trims.active()
    assert SC.get_funcname(here, line) == "Net.forward"  # outside: Dynamo's own
    assert G.profile_guard_manager(None, None, 1) == 7.0 and len(latency_spy) == 1  # outside: the profiler
    with lean.scope(False):
        assert trims.active()
        assert SC.get_funcname(here, line) is None
        assert G.profile_guard_manager(None, None, 1) == 0.0 and len(latency_spy) == 1
        trims.ENABLED[0] = False
        try:
            assert not trims.active()
            assert SC.get_funcname(here, line) == "Net.forward"
        finally:
            trims.ENABLED[0] = True
    assert not trims.active()


def test_trims_step_aside_for_their_debug_logs(latency_spy):
    from torch._dynamo import guards as G, symbolic_convert as SC

    here, line = __file__, Net.forward.__code__.co_firstlineno + 1
    for log, check in ((SC.trace_call_log, lambda: SC.get_funcname(here, line) == "Net.forward"),
                       (SC.trace_source_log, lambda: SC.get_funcname(here, line) == "Net.forward")):
        old = log.level
        log.setLevel(logging.DEBUG)
        try:
            with lean.scope(False):
                assert check()
        finally:
            log.setLevel(old)
    old = G.guards_log.level
    G.guards_log.setLevel(logging.DEBUG)
    try:
        with lean.scope(False):
            assert G.profile_guard_manager(None, None, 1) == 7.0
    finally:
        G.guards_log.setLevel(old)


def test_local_map_check_without_the_import(monkeypatch):
    from torch._dynamo.variables.higher_order_ops import LocalMapWrappedHigherOrderVariable as L

    monkeypatch.delitem(sys.modules, trims._FUNC_MAP, raising=False)
    with lean.scope(False):
        assert L.should_wrap_in_hop(len) is False
    assert trims._FUNC_MAP not in sys.modules


def test_local_map_check_once_imported():
    """With the module imported, Dynamo's own check answers (and recognizes its function)."""
    if not torch.distributed.is_available():
        pytest.skip("no torch.distributed")
    from torch._dynamo.variables.higher_order_ops import LocalMapWrappedHigherOrderVariable as L
    from torch.distributed.tensor.experimental._func_map import _local_map_wrapped

    with lean.scope(False):
        assert L.should_wrap_in_hop(len) is False
        with L.enable():
            assert L.should_wrap_in_hop(_local_map_wrapped) is True
