"""The op overloads that graph rewrites insert (:mod:`gnncompile.passes`) and that export
translates or replaces (:mod:`gnncompile.export`), and the sampler's op
(:mod:`gnncompile.data.neighbor`): the rest of the package names the ops through this module,
never through ``torch.ops.gnncompile`` (a test checks it)."""
from __future__ import annotations

from . import autograd  # noqa: F401  (the ops carry their autograd formulas wherever they go)
from . import hoisted as _hoisted  # noqa: F401  (defines gnncompile::hoisted)
from . import message as _message  # noqa: F401  (message programs: reference, fake, autograd)
from . import structure  # noqa: F401  (defines the structure ops)
from . import slots as _slots  # noqa: F401  (defines gnncompile::slot_rows, cached_slot_rows)
from . import vendor  # noqa: F401  (defines gnncompile::spmm_sparse, the spmm portfolio's vendor candidate)
from .dense import mha_forward as MHA_FORWARD  # multi-head attention over gnncompile::dense_attention
from .schemas import ops

BUILD_CSR = ops.build_csr.default
SPMM = ops.spmm.default
SPMM_SELF = ops.spmm_self.default  # spmm's sum + scale * x (GINConv's self term; passes/self_term.py)
SPMM_SPARSE = ops.spmm_sparse.default  # the vendor library's spmm (ops/vendor.py)
SPMM_BF16 = ops.spmm_bf16.default  # spmm gathering bfloat16, float32 out (opt-in, passes/precision.py)
EDGE_SOFTMAX = ops.edge_softmax.default
ATTENTION = ops.attention.default
ATTENTION_V2 = ops.attention_v2.default
ATTENTION_DOT = ops.attention_dot.default
DENSE_ATTENTION = ops.dense_attention.default
GATHER = ops.gather.default
CACHED_CSR = ops.cached_csr.default
CACHED_CSC = ops.cached_csc.default
PAIR_CSR = ops.pair_csr.default
PAIR_CSC = ops.pair_csc.default
CSR_DEGREE = ops.csr_degree.default
HOISTED = ops.hoisted.default
DROPOUT = ops.dropout.default
MESSAGE_REDUCE = ops.message_reduce.default
MESSAGE_EDGES = ops.message_edges.default
CACHED_SLOT_ROWS = ops.cached_slot_rows.default  # an edge input in CSR slot order, cached (ops/slots.py)
MESSAGE_SOFTMAX = ops.message_softmax.default
NEIGHBOR_SAMPLE = ops.neighbor_sample.default  # called by gnncompile.data.neighbor
HETERO_NEIGHBOR_SAMPLE = ops.hetero_neighbor_sample.default

__all__ = ["BUILD_CSR", "SPMM", "SPMM_SPARSE", "SPMM_BF16", "EDGE_SOFTMAX", "ATTENTION", "ATTENTION_V2", "ATTENTION_DOT", "DENSE_ATTENTION", "MHA_FORWARD", "GATHER", "CACHED_CSR", "CACHED_CSC", "PAIR_CSR",
           "PAIR_CSC", "CSR_DEGREE", "HOISTED", "DROPOUT", "MESSAGE_REDUCE", "MESSAGE_EDGES", "MESSAGE_SOFTMAX", "CACHED_SLOT_ROWS",
           "NEIGHBOR_SAMPLE", "HETERO_NEIGHBOR_SAMPLE"]
