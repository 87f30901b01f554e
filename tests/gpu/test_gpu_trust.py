"""Trust that survives, on CUDA: after its first training step a compiled GAT validates no
structure and waits on the host nowhere (native/common/trust.h; tests/ops/test_trust_survives.py
is the CPU side). Steps 2-10 run in torch's sync-debug mode "error", in which any call that
synchronises the host with the device raises.

Skipped unless a GPU is visible and the extension was built with its CUDA kernels."""
from __future__ import annotations

import pytest
import torch

import gnncompile
from gnncompile.ops import hoisted, validation_count, validations_since

HAS_CUDA_KERNELS = torch.cuda.is_available() and bool(gnncompile.info()["cuda_kernels"])
pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not HAS_CUDA_KERNELS, reason="needs a CUDA device and gnncompile built with CUDA kernels"),
]

DEV = "cuda"


@pytest.mark.parametrize("inner", ["aot_eager", "inductor"])
def test_compiled_gat_steps_neither_validate_nor_wait(inner):
    from torch_geometric.nn.models import GAT

    from gnncompile.data.synthetic import power_law_graph

    ei = power_law_graph(3000, 30_000, seed=1).to(DEV)
    g = torch.Generator().manual_seed(0)
    x = torch.randn(3000, 16, generator=g).to(DEV)
    y = torch.randint(0, 4, (3000,), generator=g).to(DEV)
    torch.manual_seed(0)
    model = GAT(16, 32, 2, 4, heads=4).to(DEV)
    m = gnncompile.compile(model, inner=inner, settings={"choices": {"guard": "off"}})
    # plain SGD: its step is a foreach update with no host-side scalar read of a device tensor
    opt = torch.optim.SGD(model.parameters(), lr=0.05)

    def step():
        opt.zero_grad(set_to_none=True)
        loss = torch.nn.functional.cross_entropy(m(x, ei), y)
        loss.backward()
        opt.step()
        return loss.detach()

    first = step()  # compiles, builds and records the structures (host waits allowed here)
    torch.cuda.synchronize()
    mark, hits = validation_count(), hoisted.hoist_info()["hits"]
    previous = torch.cuda.get_sync_debug_mode()
    torch.cuda.set_sync_debug_mode("error")
    try:
        losses = [step() for _ in range(9)]  # steps 2-10
    finally:
        torch.cuda.set_sync_debug_mode(previous)
    torch.cuda.synchronize()
    assert validations_since(mark) == 0
    assert hoisted.hoist_info()["hits"] - hits >= 9  # the compiled graph ran, structures from its cache
    assert torch.isfinite(torch.stack(losses)).all()
    assert float(losses[-1]) < float(first)
