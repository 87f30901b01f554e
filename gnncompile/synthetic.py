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
