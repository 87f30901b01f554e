"""What a pass run reports: the chains it fused and the scatters it left, with reasons.

:class:`Fusions` is the part shared with :class:`gnncompile.compiler.ExplainReport` and
:class:`gnncompile.export.ExportResult`.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Dict, List


@dataclass
class Fused:
    kind: str  # 'spmm' | 'edge_softmax' | 'degree'
    reduce: str
    layer: str
    weighted: bool = False
    node: str = ""

    def __str__(self) -> str:
        what = self.kind if self.kind != "spmm" else f"spmm[{self.reduce}{', weighted' if self.weighted else ''}]"
        return f"{what:<26} in {self.layer}  (at {self.node})"


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

    @property
    def num_fused(self) -> int:
        """Fused message-passing chains (spmm and edge softmax; degree rewrites not counted)."""
        return sum(1 for f in self.fused if f.kind != "degree")


@dataclass
class PassReport(Fusions):
    structures: int = 0  # CSR structure ops inserted
    transposed: int = 0  # CSC structure ops inserted
    gathers: int = 0  # per-edge gathers given a segment-sum gradient
    hoisted: int = 0  # graph-invariant regions moved into gnncompile::hoisted
    hoisted_nodes: int = 0  # the nodes they hold
    inner: str = ""  # the inner compiler the backend handed the piece to
    dropouts: int = 0  # F.dropout calls replaced by gnncompile::dropout
    # id(parameter) -> its path below the root of the compiled frame ('lin_l.weight'); filled
    # only while explain() collects reports, to place a frame rooted at a submodule
    frame_params: Dict[int, str] = field(default_factory=dict)


def one_line(text: object, limit: int) -> str:
    """``text`` on one line (whitespace runs collapsed), cut to ``limit`` characters."""
    text = " ".join(str(text).split())
    return text if len(text) <= limit else text[:limit] + " ..."


__all__ = ["Fused", "Unfused", "Fusions", "PassReport", "one_line"]
