"""What a pass run reports: the chains it fused and the scatters it left, with reasons.

:class:`Fusions` is the part shared with :class:`gnncompile.compiler.ExplainReport` and
:class:`gnncompile.export.ExportResult`.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Dict, List


@dataclass
class Fused:
    # 'spmm' | 'edge_softmax' | 'attention' (logits, softmax, dropout and aggregation in one op) |
    # 'attention_v2' (GATv2's) | 'attention_dot' (TransformerConv's dot-product attention) |
    # 'dense_attention' (a multi-head attention over a padded dense batch, passes/dense_attention.py) |
    # 'degree' | 'message' (a message program over gathered inputs,
    # reduced in one pass) | 'segment' (a message computed outside, reduced over the CSR instead of
    # scattered; not counted as a fused chain) | 'edges' (a per-edge program, message_edges) |
    # 'message_softmax' (a softmax aggregation of a message program in one pass)
    kind: str
    reduce: str
    layer: str
    weighted: bool = False
    node: str = ""
    detail: str = ""  # message programs: the operations and the inputs they read
    # what of the chain is not fused ('segment': the message computed beforehand, as written):
    # said here, so that each chain is in one list of the report
    note: str = ""
    # spmm: the implementation that runs and why (passes/portfolio.py), '' where none was chosen
    impl: str = ""
    # the precision it gathers in when choices['precision'] is 'bf16' (passes/precision.py): that
    # it gathers bf16, or why it stays fp32; '' with the default
    precision: str = ""

    def __str__(self) -> str:
        what = self.kind if self.kind != "spmm" else \
            f"spmm[{self.reduce}{', weighted' if self.weighted else ''}{', ' + self.detail if self.detail else ''}]"
        if self.kind in ("attention", "attention_v2", "attention_dot", "dense_attention"):
            what = f"{self.kind}[{self.detail}]" if self.detail else self.kind
        if self.kind in ("message", "segment", "edges", "message_softmax"):
            what = f"{self.kind}[{self.reduce}: {self.detail}]"
        return (f"{what:<26} in {self.layer}  (at {self.node})" + (f"; {self.note}" if self.note else "")
                + (f"; {self.impl}" if self.impl and self.kind == "spmm" else "")
                + (f"; {self.precision}" if self.precision else ""))


@dataclass
class Unfused:
    op: str
    layer: str
    reason: str
    node: str = ""

    def __str__(self) -> str:
        return f"{self.op:<16} in {self.layer}: {self.reason}  (at {self.node})"


@dataclass
class Fusions:
    fused: List[Fused] = field(default_factory=list)
    unfused: List[Unfused] = field(default_factory=list)
    notes: List[str] = field(default_factory=list)  # choices the passes made that a user can change

    @property
    def num_fused(self) -> int:
        """Fused message-passing chains (spmm, edge softmax, message programs; degree rewrites and
        segment reductions of messages computed outside not counted)."""
        return sum(1 for f in self.fused if f.kind not in ("degree", "segment"))


@dataclass
class PassReport(Fusions):
    structures: int = 0  # CSR structure ops inserted
    transposed: int = 0  # CSC structure ops inserted
    gathers: int = 0  # per-edge gathers given a segment-sum gradient
    hoisted: int = 0  # graph-invariant regions moved into gnncompile::hoisted
    hoisted_nodes: int = 0  # the nodes they hold
    inner: str = ""  # the inner compiler the backend handed the piece to
    dropouts: int = 0  # F.dropout calls replaced by gnncompile::dropout
    linear_moved: int = 0  # linear maps of gathered rows moved to the nodes (passes.algebra)
    aggregated_first: int = 0  # fused sums moved before their linear map, (A x) W (passes.order, reassociate)
    vendor: int = 0  # fused spmm calls that run the vendor implementation (passes.portfolio)
    bf16: int = 0  # fused spmm calls that gather bfloat16 features (passes.precision, opt-in)
    self_terms: int = 0  # fused spmm sums that also add the node's own term, spmm_self (passes.self_term)
    # why Dynamo ended the piece where it did, when that was a graph break: its reason (without
    # Dynamo's hints) and the user's line it broke at ('file.py:12 (forward)')
    graph_break: str = ""
    break_at: str = ""
    compile_id: str = ""  # Dynamo's frame compile the piece came from (pieces of one DDP split share it)
    # the fused compute ops the rewritten graph calls ('spmm', 'csr_degree', 'edge_softmax',
    # 'message_reduce', 'message_edges', 'attention'; hoisted regions included), per op: what one forward
    # runs (a chain can call more than one, e.g. an edge program recomputed in CSR order, and
    # equal calls of several chains are computed once)
    op_calls: Dict[str, int] = field(default_factory=dict)
    # id(parameter) -> its path below the root of the compiled frame ('lin_l.weight'); filled
    # only while explain() collects reports, to place a frame rooted at a submodule
    frame_params: Dict[int, str] = field(default_factory=dict)


def one_line(text: object, limit: int) -> str:
    """``text`` on one line (whitespace runs collapsed), cut to ``limit`` characters."""
    text = " ".join(str(text).split())
    return text if len(text) <= limit else text[:limit] + " ..."


__all__ = ["Fused", "Unfused", "Fusions", "PassReport", "one_line"]
