"""Data for training: the pooled mini-batch loader and the graphs gnncompile generates itself.

* :class:`PooledLoader` (:mod:`.loader`): PyG ``DataLoader`` batches collated natively into
  reused buffers, optionally filled by worker processes, which can also build each batch's
  graph structure for the compiled model (``structures=True``), or pad every batch to one of
  a few fixed sizes for CUDA graphs (``pad_to_buckets``; :mod:`.buckets`, :class:`BucketPadding`).
* :func:`prefetch_structures` (:mod:`.prefetch`): any loader's batches (PyG's ``DataLoader``)
  with their structures prepared ahead in a background thread.
* :class:`NeighborLoader` / :class:`NeighborSampler` (:mod:`.neighbor`): PyG-compatible
  neighbor sampling for mini-batch training on large graphs, with a native kernel; sharded over
  the ranks of data-parallel training with ``distributed=True``.
* :func:`shared_graph` (:mod:`.shared`): one copy of the graph, and of the sampler's CSC, per
  host in shared memory, for the ranks of data-parallel training.
* :mod:`.synthetic`: :func:`power_law_graph` and :func:`graph_dataset`, for the demo, the
  benchmarks and the tuner's default workloads.
"""
from .buckets import BucketPadding
from .loader import PooledLoader
from .prefetch import prefetch_structures
from .neighbor import NeighborLoader, NeighborSampler
from .shared import SharedInfo, shared_graph
from .synthetic import GraphList, graph_dataset, power_law_graph

__all__ = ["PooledLoader", "BucketPadding", "prefetch_structures", "NeighborLoader", "NeighborSampler", "shared_graph", "SharedInfo", "power_law_graph",
           "graph_dataset", "GraphList"]
