"""Data for training: the pooled mini-batch loader and the graphs gnncompile generates itself.

* :class:`PooledLoader` (:mod:`.loader`): PyG ``DataLoader`` batches collated natively into
  reused buffers, optionally filled by worker processes.
* :mod:`.synthetic`: :func:`power_law_graph` and :func:`graph_dataset`, for the demo, the
  benchmarks and the tuner's default workloads.
"""
from .loader import PooledLoader
from .synthetic import GraphList, graph_dataset, power_law_graph

__all__ = ["PooledLoader", "power_law_graph", "graph_dataset", "GraphList"]
