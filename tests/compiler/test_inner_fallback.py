"""A piece that inductor cannot compile goes to aot_eager instead, with the reason (backend.py).

GATConv(edge_dim=...) keeps the self-loops' edge features (``E' + N`` rows, ``E'`` the count of
``edge_index[:, mask]``: a data-dependent size) for lin_edge's backward; inductor (torch 2.13)
fails to compile that backward ("expected [u0] to have been codegen-ed"), at the first
``backward()``, so the training step crashed with ``inner='inductor'`` and under 'auto' on large
graphs (found at 100k nodes / 1M edges by benchmarks/messages.py's GATE workload)."""
import warnings

import torch
from torch_geometric.nn import GATConv

import gnncompile
from gnncompile.compiler import backend


def _graph(n=40, e=160, d=4, f=8, seed=0):
    g = torch.Generator().manual_seed(seed)
    ei = torch.stack([torch.randint(0, n, (e,), generator=g), torch.randint(0, n, (e,), generator=g)])
    return torch.randn(n, f, generator=g), ei, torch.randn(e, d, generator=g)


def _step(run, model, x, ei, ea):
    for p in model.parameters():
        p.grad = None
    out = run(x, ei, ea) if ea is not None else run(x, ei)
    out.square().mean().backward()
    return out.detach(), [p.grad.clone() for p in model.parameters()]


def test_gat_with_edge_features_trains_under_inductor_with_a_warning():
    torch._dynamo.reset()
    torch.manual_seed(0)
    model = GATConv(8, 6, heads=2, edge_dim=4)
    x, ei, ea = _graph()
    expect, expect_grads = _step(model, model, x, ei, ea)
    compiled = gnncompile.compile(model, inner="inductor", settings={"choices": {"guard": "off"}})
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        got, grads = _step(compiled, model, x, ei, ea)
    torch.testing.assert_close(got, expect, rtol=1e-5, atol=1e-5)
    for a, b in zip(grads, expect_grads):
        torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-5)
    said = [str(w.message) for w in caught if "aot_eager instead of inductor" in str(w.message)]
    assert said and "data-dependent size" in said[0], [str(w.message) for w in caught]


def test_unbacked_sizes_found_only_where_they_stay_in_the_graph():
    captured = []

    def spy(gm, example_inputs):
        captured.append(gm)
        return gm.forward

    x, ei, ea = _graph()
    torch._dynamo.reset()
    with torch._dynamo.config.patch(capture_dynamic_output_shape_ops=True):
        def f(x, ei):
            keep = ei[0] != ei[1]
            return x[ei[0][keep]].sum(0) * 2

        torch.compile(f, backend=spy, fullgraph=True)(x, ei)
    assert backend.unbacked_sized(captured[-1]), "a mask's count is a data-dependent size"
    captured.clear()
    torch._dynamo.reset()
    torch.compile(lambda x: (x * 2).sum(0), backend=spy, fullgraph=True)(x)
    assert backend.unbacked_sized(captured[-1]) == []


def test_needs_grad():
    a, b = torch.ones(2), torch.ones(2, requires_grad=True)
    assert not backend.needs_grad([a, 3])
    assert backend.needs_grad([a, b])
    with torch.no_grad():
        assert not backend.needs_grad([a, b])


def test_inference_keeps_inductor():
    """Without a backward, nothing needs the fallback: inductor compiles the piece, no warning."""
    torch._dynamo.reset()
    torch.manual_seed(0)
    model = GATConv(8, 6, heads=2, edge_dim=4)
    x, ei, ea = _graph(seed=1)
    compiled = gnncompile.compile(model, inner="inductor", settings={"choices": {"guard": "off"}})
    with torch.no_grad(), warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        torch.testing.assert_close(compiled(x, ei, ea), model(x, ei, ea), rtol=1e-5, atol=1e-5)
    assert not [w for w in caught if "aot_eager instead of inductor" in str(w.message)]
