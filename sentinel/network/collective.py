"""Collective health: from a job's per-rank collective timing, tell a slow link from a slow rank, and a hang
from both; then name the link or port on the job's nodes when the network tier has one (C4D's idea: the
collective's own timing points at the component, the fabric's counters confirm it).

Per rank the SDK measures the share of each step spent inside collectives. In a synchronous collective
every rank waits for the slowest one, so:

* a rank whose share is far *below* its peers' (≤ `straggler_ratio` × their median) while theirs is high
  arrives last: it computes slower, and the others wait for it — a **compute straggler**, not the network;
* shares high and alike on every rank: the collective itself is slow — **communication** (interconnect),
  localised to a bad link, node or port among the job's nodes when the probe mesh or the NIC rules see one;
* no step completed by any rank in the window: a **hang** (a collective that never returns), reported as
  such; the mesh's unreachable nodes among the job's are named when there are any.

The verdict is evidence, not an action: the allreduce-spike incident carries it, and slowdown attribution
(sentinel/diagnosis/, when it exists) reads the same function.
"""

from __future__ import annotations

import statistics
from dataclasses import dataclass, field
from typing import Any, Literal

from sentinel.network.localise import Localisation

Kind = Literal["hang", "compute_straggler", "communication", "healthy", "unknown"]


@dataclass
class CollectiveVerdict:
    kind: Kind
    layer: str  # compute | interconnect | unknown
    summary: str
    ranks: list[int] = field(default_factory=list)
    nodes: list[str] = field(default_factory=list)
    links: list[str] = field(default_factory=list)
    ports: list[str] = field(default_factory=list)

    def as_evidence(self) -> dict[str, Any]:
        return {"kind": self.kind, "layer": self.layer, "summary": self.summary, "ranks": self.ranks,
                "nodes": self.nodes, "links": self.links, "ports": self.ports}


def verdict(rank_shares: dict[int, float], rank_nodes: dict[int, str], steps: int, *,
            localisation: Localisation | None = None, port_alerts: dict[str, list[str]] | None = None,
            high_share: float = 0.3, straggler_ratio: float = 0.5) -> CollectiveVerdict:
    """`rank_shares`: rank → collective ÷ step time over the window; `rank_nodes`: where each rank runs;
    `port_alerts`: node → its ports with an open NIC-rule incident."""
    job_nodes = sorted(set(rank_nodes.values()))
    if steps == 0:
        unreachable = [n.node for n in (localisation.nodes if localisation else []) if n.node in job_nodes]
        named = f"; unreachable on the probe mesh: {', '.join(unreachable)}" if unreachable else ""
        return CollectiveVerdict("hang", "interconnect" if unreachable else "unknown",
                                 "no rank finished a step in the window: a hang, not a slow collective" + named,
                                 nodes=unreachable)
    if len(rank_shares) < 2:
        return CollectiveVerdict("unknown", "unknown", "one rank: nothing to compare its collective time with")
    median = statistics.median(rank_shares.values())
    if median < high_share:
        return CollectiveVerdict("healthy", "unknown", f"collectives take {median:.0%} of a step (median rank)")
    slow = sorted(r for r, share in rank_shares.items() if share <= straggler_ratio * median)
    if slow and len(slow) <= max(1, len(rank_shares) // 4):
        where = sorted({rank_nodes[r] for r in slow if r in rank_nodes})
        return CollectiveVerdict(
            "compute_straggler", "compute",
            f"rank(s) {', '.join(map(str, slow))} spend {max(rank_shares[r] for r in slow):.0%} of a step in "
            f"collectives against {median:.0%} for the median rank: they arrive last and the others wait for "
            "them; the network is not what is slow", ranks=slow, nodes=where)
    return _communication(median, job_nodes, localisation, port_alerts or {})


def _communication(median: float, job_nodes: list[str], localisation: Localisation | None,
                   port_alerts: dict[str, list[str]]) -> CollectiveVerdict:
    mine = set(job_nodes)
    links = [link.name for link in (localisation.links if localisation else []) if {link.a, link.b} & mine]
    bad = [n.node for n in (localisation.nodes if localisation else []) if n.node in mine]
    ports = [f"{node}:{p}" for node in job_nodes for p in port_alerts.get(node, [])]
    named = ([f"slow link(s) {', '.join(links)}"] if links else []) + \
            ([f"node(s) bad on every probed pair: {', '.join(bad)}"] if bad else []) + \
            ([f"port alerts {', '.join(ports)}"] if ports else [])
    summary = f"every rank spends about {median:.0%} of a step in collectives: the collective itself is slow"
    summary += "; the network tier names " + "; ".join(named) if named else \
        "; not localised: no probed pair, node or RDMA port of the job's nodes is bad (congestion elsewhere in " \
        "the fabric, or the collective's algorithm or message size)"
    return CollectiveVerdict("communication", "interconnect", summary, nodes=sorted(set(bad)), links=links, ports=ports)
