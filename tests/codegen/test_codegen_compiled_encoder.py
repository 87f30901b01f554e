"""A compiled model whose message reads an edge encoder runs the generated kernel the rewrite
prepared at compile time (the kernel's key names the encoder's D, not its width)."""
from __future__ import annotations

import warnings

import torch

import gnncompile
from gnncompile import codegen

with warnings.catch_warnings():
    warnings.simplefilter("ignore")
    import torch_geometric.nn as gnn


def test_compiled_encoder_forward_runs_the_prepared_kernel(gen):
    torch._dynamo.reset()
    torch.manual_seed(0)
    N, E, F, D = 50, 300, 16, 4
    model = gnn.GINEConv(torch.nn.Linear(F, F), edge_dim=D)
    x, ei, ea = torch.randn(N, F), torch.randint(0, N, (2, E)), torch.randn(E, D)
    compiled = gnncompile.compile(model, settings={"choices": {"programs": "always", "guard": "off"}})
    with torch.no_grad():
        compiled(x, ei, ea)  # compiles: the rewrite prepares the forward's kernel
        before = codegen.calls()
        out = compiled(x, ei, ea)
        assert codegen.calls() - before >= 1, codegen.registered()
        torch.testing.assert_close(out, model(x, ei, ea), rtol=1e-5, atol=1e-5)
    assert any(f"d{D}" in k for k in codegen.registered()), codegen.registered()
