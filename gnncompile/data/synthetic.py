"""Graphs that gnncompile generates itself, for demos, benchmarks and default tuning workloads."""
from __future__ import annotations

import torch


def power_law_graph(num_nodes: int, num_edges: int, exponent: float = 0.8, seed: int = 0,
                    dtype: torch.dtype = torch.int64) -> torch.Tensor:
    """A directed graph with a power-law (Zipf-like) in- and out-degree distribution.

    Node ``i`` of a random ranking is picked as an endpoint with probability proportional to
    ``(i + 1) ** -exponent``: a few hubs with thousands of edges and a long tail, as in
    citation and social graphs. Returns an unsorted ``[2, num_edges]`` edge_index.
    """
    if num_nodes <= 0 or num_edges < 0:
        raise ValueError("power_law_graph: num_nodes must be > 0 and num_edges >= 0")
    g = torch.Generator().manual_seed(seed)
    weights = torch.arange(1, num_nodes + 1, dtype=torch.float64).pow(-exponent)
    ends = torch.multinomial(weights, 2 * num_edges, replacement=True, generator=g)
    relabel = torch.randperm(num_nodes, generator=g)
    ends = relabel[ends].view(2, num_edges)
    # Independent rankings for sources and destinations, so hubs in one are not hubs in both.
    relabel_src = torch.randperm(num_nodes, generator=g)
    ends[0] = relabel_src[ends[0]]
    return ends.to(dtype)


class GraphList(list):
    """A list of graphs (a plain list that can be weakly referenced, so loaders can cache
    their view of it)."""


def graph_dataset(num_graphs: int, min_nodes: int = 10, max_nodes: int = 40, num_features: int = 16,
                  num_classes: int = 2, avg_degree: float = 4.0, seed: int = 0) -> list:
    """A graph-classification dataset of ``num_graphs`` small random graphs (a list of ``Data``,
    as a :class:`GraphList`).

    Graph ``i`` has ``n`` nodes (uniform in ``[min_nodes, max_nodes]``), about ``n *
    avg_degree`` directed edges (both directions of ``n * avg_degree / 2`` random pairs),
    float32 features ``[n, num_features]`` and a label ``y`` of shape ``[1]`` that depends on
    the graph (its density and mean feature), so a model can learn something.
    """
    import warnings

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        from torch_geometric.data import Data

    if num_graphs < 0 or min_nodes < 1 or max_nodes < min_nodes:
        raise ValueError("graph_dataset: need num_graphs >= 0 and 1 <= min_nodes <= max_nodes")
    g = torch.Generator().manual_seed(seed)
    sizes = torch.randint(min_nodes, max_nodes + 1, (num_graphs,), generator=g).tolist()
    out = GraphList()
    for n in sizes:
        m = max(1, int(n * avg_degree / 2))
        src = torch.randint(0, n, (m,), generator=g)
        dst = torch.randint(0, n, (m,), generator=g)
        ei = torch.stack([torch.cat([src, dst]), torch.cat([dst, src])])
        x = torch.randn(n, num_features, generator=g)
        score = x[:, 0].mean() + 0.1 * (n - (min_nodes + max_nodes) / 2)
        y = torch.tensor([int(score > 0) % num_classes if num_classes == 2 else
                          int(abs(float(score)) * num_classes) % num_classes])
        out.append(Data(x=x, edge_index=ei, y=y))
    return out
