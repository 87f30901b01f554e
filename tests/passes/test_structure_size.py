"""The size a structure op is given (passes/rewrite.py, ``_size0``): read from the first tensor
of the graph with that dim 0, never from the zeros buffer of the scatter the rewrite replaced.

With symbolic sizes (``dynamic=True``) the buffer's ``size(0)`` kept the buffer alive, and with
it what PyG computed before the scatter (``x_j.new_zeros``): GINConv's per-edge gather, GINEConv's
gather, edge linear map, add and relu, all run for nothing but a size. Compiled == eager, and no
op of the compiled forward allocates an ``E x F`` tensor (eager's do: the check can fail).
"""
from __future__ import annotations

import warnings

import pytest
import torch

import gnncompile
from gnncompile.hardware import memory
from shared import _fresh_dynamo, check_same  # noqa: F401  (_fresh_dynamo: autouse)

with warnings.catch_warnings():
    warnings.simplefilter("ignore")
    import torch_geometric.nn as gnn

N, E, F = 300, 4000, 64


def _model(kind):
    torch.manual_seed(0)
    mlp = torch.nn.Sequential(torch.nn.Linear(F, F), torch.nn.ReLU(), torch.nn.Linear(F, F))
    return gnn.GINConv(mlp) if kind == "gin" else gnn.GINEConv(mlp, edge_dim=8)


def _inputs(kind, n=N, e=E, seed=0):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(n, F, generator=g)
    ei = torch.randint(0, n, (2, e), generator=g)
    return (x, ei) if kind == "gin" else (x, ei, torch.randn(e, 8, generator=g))


def _largest_allocation(fn, inputs) -> int:
    # (the block cache compile() turns on hides reused blocks from the profiler's memory report)
    with memory.cache_suspended(), \
            torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU], profile_memory=True) as prof:
        fn(*inputs)
    return max(e.cpu_memory_usage for e in prof.events() if e.cpu_memory_usage > 0)


@pytest.mark.parametrize("kind", ["gin", "gine"])
def test_no_dead_edge_tensors_with_dynamic_sizes(kind):
    model = _model(kind)
    compiled = gnncompile.compile(model, dynamic=True, inner="eager", settings={"choices": {"guard": "off"}})
    for seed, (n, e) in enumerate([(N, E), (N + 17, E + 301)]):  # two sizes: one symbolic graph
        # (float32 sums over ~13 edges a node and 4000 edges a weight, in another order: 1e-4)
        check_same(model, compiled, list(_inputs(kind, n, e, seed)), rtol=1e-4, atol=1e-4)
    inputs = _inputs(kind)
    wide = E * F * 4
    assert _largest_allocation(model, inputs) >= wide  # eager gathers E x F
    assert _largest_allocation(compiled, inputs) < wide
