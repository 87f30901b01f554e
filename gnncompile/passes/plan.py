"""Phase 4, plan (read only): which graph structures the fused chains of one graph piece share.

* One CSR per distinct (edge_index, number of destinations) when a chain aggregates over row 1
  of a ``[2, E]`` edge_index (and, for an aggregation, gathers from row 0 of the same tensor):
  a cached structure (``gnncompile::cached_csr``), shared by every layer of the piece and
  across steps.
* Otherwise one structure per distinct (destination index, source index, number of
  destinations), built from the two index tensors (``gnncompile::pair_csr``, not cached). A
  softmax over such an index joins an aggregation over the same index when there is one.
* A degree count joins a structure over its index when the piece builds one anyway; otherwise
  it stays as it is (a scalar scatter is cheaper than a counting sort).

Where a member needs the transposed structure (the sum / mean gradient of its features), the
rewrite adds one CSC per structure and number of sources.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Dict, List, Optional

from torch.fx import Node

from .match import Aggregate, IndexRef, Match, Matches

DEGREE_LEFT_ALONE = ("degree count (scatter of ones): no gather-scatter on this index in this graph "
                     "piece; left as an O(E) scalar scatter")


@dataclass
class SharedStructure:
    """One structure and the chains that use it. ``edge_index`` is set for a cached structure of
    a ``[2, E]`` node; otherwise it is built from ``dst`` and ``src``."""

    num_dst: str
    dst: IndexRef
    src: Optional[IndexRef] = None
    edge_index: Optional[Node] = None
    members: List[Match] = field(default_factory=list)

    def owns_index(self, ref: IndexRef, num_dst: str) -> bool:
        """Does this structure group the edges by ``ref`` into ``num_dst`` rows?"""
        if num_dst != self.num_dst:
            return False
        if self.edge_index is not None:
            return ref.is_row(1, of=self.edge_index)
        return ref == self.dst

    def pair_src_index(self) -> Node:
        """The source index of a pair structure: that of its first aggregation, else the first
        member's destination index (a lone softmax reads no source)."""
        agg = next((m for m in self.members if isinstance(m, Aggregate)), None)
        return agg.src_index if agg is not None else self.members[0].dst_index


@dataclass
class Plan:
    structures: List[SharedStructure] = field(default_factory=list)
    unfused: Dict[Node, str] = field(default_factory=dict)
    claimed: List[Node] = field(default_factory=list)


def _key(m: Match) -> Optional[tuple]:
    """The structure a chain joins by itself, or None (a softmax over an arbitrary index)."""
    if m.dst.row == 1:
        if isinstance(m, Aggregate) and not m.src.is_row(0, of=m.dst.tensor):
            return ("pair", m.dst, m.src, m.num_dst)
        return ("edge_index", m.dst.tensor, m.num_dst)
    if isinstance(m, Aggregate):
        return ("pair", m.dst, m.src, m.num_dst)
    return None


def _new(key: tuple, m: Match) -> SharedStructure:
    if key[0] == "edge_index":
        return SharedStructure(m.num_dst, m.dst, edge_index=key[1])
    return SharedStructure(m.num_dst, key[1], src=key[2])


def plan(matches: Matches, order: Dict[Node, int]) -> Plan:
    """Groups the matched chains into shared structures, members in graph order (``order``: the
    position of every node); degree counts with no structure to join are reported unfused."""
    out = Plan(unfused=dict(matches.unfused), claimed=list(matches.claimed))
    by_key: Dict[tuple, SharedStructure] = {}
    chains: List[Match] = [*matches.softmaxes, *matches.aggregates]
    for m in chains:
        key = _key(m)
        if key is not None:
            by_key.setdefault(key, _new(key, m)).members.append(m)
    for m in chains:
        if _key(m) is not None:
            continue
        s = next((s for k, s in by_key.items() if k[0] == "pair" and k[1] == m.dst and s.num_dst == m.num_dst),
                 None)
        if s is None:
            key = ("pair", m.dst, m.dst, m.num_dst)
            s = by_key.setdefault(key, _new(key, m))
        s.members.append(m)
    for deg, node in matches.degrees:
        s = next((s for s in by_key.values() if s.owns_index(deg.dst, deg.num_dst)), None)
        if s is None:
            out.unfused[node] = DEGREE_LEFT_ALONE
        else:
            s.members.append(deg)
    out.structures = list(by_key.values())
    for s in out.structures:
        s.members.sort(key=lambda m: order[m.anchor])
    return out


__all__ = ["SharedStructure", "Plan", "plan", "DEGREE_LEFT_ALONE"]
