"""Helpers shared by test folders (tests/ is on sys.path: pytest puts the folder of the root
conftest.py there)."""
from __future__ import annotations

import pytest
import torch


@pytest.fixture(autouse=True)
def _fresh_dynamo():
    # Each test compiles new modules of the same classes: start from empty Dynamo caches so that
    # no test runs into the recompile limit of a shared code object.
    torch._dynamo.reset()
    yield


def check_same(model, compiled, inputs, rtol=1e-4, atol=1e-5):
    """Outputs, parameter gradients and input gradients of compiled == eager."""
    params = [p for p in model.parameters() if p.requires_grad]
    floats = [a for a in inputs if a.is_floating_point() and a.requires_grad]
    out_c = compiled(*inputs)
    out_e = model(*inputs)
    torch.testing.assert_close(out_c, out_e, rtol=rtol, atol=atol)
    g = torch.randn_like(out_e)
    gc = torch.autograd.grad(out_c, params + floats, g, allow_unused=True)
    ge = torch.autograd.grad(out_e, params + floats, g, allow_unused=True)
    for a, b in zip(gc, ge):
        if a is None or b is None:
            assert a is None and b is None
        else:
            torch.testing.assert_close(a, b, rtol=rtol, atol=atol)


def attention_graph(N: int, M: int, E: int, seed: int = 0, dtype=torch.int64):
    """A random bipartite graph of E edges from N sources to M destinations for the attention
    ops' tests: (src, dst) as int64, the CSR by destination (build_csr) and its CSC
    (transpose_structure), indices of ``dtype``."""
    from gnncompile.ops.structure import transpose_structure

    g = torch.Generator().manual_seed(seed)
    src = torch.randint(0, N, (E,), generator=g).to(dtype)
    dst = torch.randint(0, M, (E,), generator=g).to(dtype)
    rowptr, col, perm = torch.ops.gnncompile.build_csr(dst, src, M, N)
    return src.long(), dst.long(), (rowptr, col, perm), transpose_structure(rowptr, col, perm, N)


def node_edge_data(N: int, E: int, F: int, seed: int = 0, edge_dim: int = 0):
    """Random node features [N, F], an edge_index [2, E] and edge features [E, edge_dim] (None for
    0), for the attention passes' tests."""
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(N, F, generator=g)
    ei = torch.randint(0, N, (2, E), generator=g)
    ea = torch.randn(E, edge_dim, generator=g) if edge_dim else None
    return x, ei, ea
