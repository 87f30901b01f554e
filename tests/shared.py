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
