"""From the pair matrix to a place: the bad link, the bad node, the bad domain (rack, switch).

A pair (either direction) is *bad* when it lost at least `loss_ratio` of its probes, or its median RTT is
above both `rtt_seconds` and `rtt_factor` × the fleet's median pair RTT, over the window and in its newest
window as well (a pair that recovered is not named while its old windows age out). Then, in this order:

* a **domain** (the nodes sharing a value of one of `domain_labels`, e.g. rack=r7) is bad when it has at least
  two nodes and either `node_share` of them are bad, or `node_share` of the pairs leaving it (at least
  `min_peers` measured) are bad while at least two of its nodes have such pairs: its switch or uplink, not its
  nodes (with only two domains an uplink fault looks the same from both sides, and both are named);
* a **node** is bad when at least `min_peers` peers were measured with it and `node_share` of them are bad:
  all its pairs are bad, so its own link or host is (a node whose every pair is lost is *unreachable*);
* a **link** is a bad pair whose two ends are otherwise fine: each has at least `min_peers - 1` other peers
  measured, and most of those are good (Pingmesh's reading: one pair slow while both ends talk to everyone
  else at the usual speed). A bad pair with too few other measurements is a *suspect*, not yet a link.

When more than half of the measured nodes are bad, or more than half of the pairs that touch no bad node are
lossy or above `rtt_seconds`, the cause is shared (the management network, the probing hosts themselves):
`fleet_wide` is set and nothing smaller is named. (The relative test cannot see a fleet-wide slowdown: the
fleet's median moves with it.)
"""

from __future__ import annotations

import statistics
from collections import defaultdict
from collections.abc import Iterable
from dataclasses import dataclass, field

from sentinel.network.matrix import PairStats


@dataclass(frozen=True)
class Thresholds:
    rtt_seconds: float = 0.005
    rtt_factor: float = 4.0
    loss_ratio: float = 0.2
    min_peers: int = 3
    node_share: float = 0.75


@dataclass(frozen=True)
class Link:
    a: str
    b: str
    rtt_seconds: float | None  # the worse direction's median
    loss_ratio: float
    confident: bool  # both ends measured well enough to clear them

    @property
    def name(self) -> str:
        return f"{self.a}↔{self.b}"


@dataclass(frozen=True)
class BadNode:
    node: str
    bad_peers: int
    measured_peers: int
    unreachable: bool  # every pair lost everything


@dataclass(frozen=True)
class BadDomain:
    label: str
    value: str
    bad_nodes: list[str]
    nodes: int


@dataclass
class Localisation:
    baseline_rtt_seconds: float | None  # the fleet's median pair RTT
    pairs: int
    bad_pairs: int
    links: list[Link] = field(default_factory=list)
    nodes: list[BadNode] = field(default_factory=list)
    domains: list[BadDomain] = field(default_factory=list)
    fleet_wide: bool = False


def is_bad(pair: PairStats, baseline: float | None, t: Thresholds) -> bool:
    if pair.sent and pair.loss_ratio >= t.loss_ratio:
        return True
    if pair.rtt_p50_seconds is None:
        return False
    limit = max(t.rtt_seconds, t.rtt_factor * baseline) if baseline is not None else t.rtt_seconds
    return pair.rtt_p50_seconds > limit


class _Graph:
    """The probed pairs by direction, so that only the nodes near a suspect pair are ever looked at closely:
    a pair can be bad only when it lost probes or is above `rtt_seconds` (the relative limit is never lower),
    so the full pass over the window's pairs is a dict insert per pair and the rest scales with the suspects."""

    def __init__(self, pairs: list[PairStats], t: Thresholds):
        self.fwd: dict[str, dict[str, PairStats]] = defaultdict(dict)
        self.rev: dict[str, dict[str, PairStats]] = defaultdict(dict)
        self.suspects: set[tuple[str, str]] = set()
        for p in pairs:
            self.fwd[p.source][p.target] = p
            self.rev[p.target][p.source] = p
            if (p.sent and p.loss_ratio >= t.loss_ratio) or (p.rtt_p50_seconds or 0.0) > t.rtt_seconds:
                self.suspects.add(_key(p.source, p.target))
        mutual = sum(1 for p in pairs if p.source in self.fwd.get(p.target, ()))
        self.unordered = len(pairs) - mutual // 2
        self.nodes = set(self.fwd) | set(self.rev)
        self._peers: dict[str, set[str]] = {}

    def peers(self, node: str) -> set[str]:
        seen = self._peers.get(node)
        if seen is None:
            seen = self._peers[node] = set(self.fwd.get(node, ())) | set(self.rev.get(node, ()))
        return seen

    def both(self, key: tuple[str, str]) -> list[PairStats]:
        a, b = key
        return [p for p in (self.fwd.get(a, {}).get(b), self.fwd.get(b, {}).get(a)) if p is not None]


def bad_now(pair: PairStats, baseline: float | None, t: Thresholds) -> bool:
    """Bad over the window (is_bad) and in its newest window too; a pair whose newest window is not known counts on
    the window alone."""
    if not is_bad(pair, baseline, t):
        return False
    if not pair.last_sent:
        return True
    if 1.0 - pair.last_received / pair.last_sent >= t.loss_ratio:
        return True
    limit = max(t.rtt_seconds, t.rtt_factor * baseline) if baseline is not None else t.rtt_seconds
    return pair.last_p50 is not None and pair.last_p50 > limit


def localise(pairs: list[PairStats], labels: dict[str, dict[str, str]], domain_labels: Iterable[str],
             t: Thresholds) -> Localisation:
    rtts = [p.rtt_p50_seconds for p in pairs if p.rtt_p50_seconds is not None]
    baseline = statistics.median(rtts) if rtts else None
    g = _Graph(pairs, t)
    bad = {key for key in g.suspects if any(bad_now(p, baseline, t) for p in g.both(key))}
    out = Localisation(baseline_rtt_seconds=baseline, pairs=g.unordered, bad_pairs=len(bad))
    bad_peers: dict[str, set[str]] = defaultdict(set)
    for a, b in bad:
        bad_peers[a].add(b)
        bad_peers[b].add(a)
    bad_nodes = {n for n, hit in bad_peers.items()
                 if len(g.peers(n)) >= t.min_peers and len(hit) >= t.node_share * len(g.peers(n))}
    touching = {_key(n, o) for n in bad_nodes for o in g.peers(n)}
    clear = g.unordered - len(touching)
    absolute = sum(1 for key in g.suspects - touching if any(is_bad(p, None, t) for p in g.both(key)))
    if len(g.nodes) >= 4 and (len(bad_nodes) > len(g.nodes) / 2 or absolute > clear / 2):
        out.fleet_wide = True
        return out
    out.domains = _domains(bad_nodes, bad, g, labels, domain_labels, t)
    in_bad_domain = {n for d in out.domains for n in d.bad_nodes}
    for n in sorted(bad_nodes - in_bad_domain):
        lost = all(p.received == 0 for other in g.peers(n) for p in g.both(_key(n, other)))
        out.nodes.append(BadNode(n, len(bad_peers[n]), len(g.peers(n)), unreachable=lost))
    placed = bad_nodes | in_bad_domain
    for key in sorted(bad):
        a, b = key
        if a in placed or b in placed:
            continue
        both = g.both(key)
        rtt = max((p.rtt_p50_seconds for p in both if p.rtt_p50_seconds is not None), default=None)
        sent, received = sum(p.sent for p in both), sum(p.received for p in both)
        confident = all(_others_fine(n, other, g.peers(n), bad_peers, t) for n, other in ((a, b), (b, a)))
        out.links.append(Link(a, b, rtt, 1.0 - received / sent if sent else 0.0, confident))
    return out


def _others_fine(node: str, other: str, peers: set[str], bad_peers: dict[str, set[str]], t: Thresholds) -> bool:
    rest = peers - {other}
    return len(rest) >= max(1, t.min_peers - 1) and len(bad_peers[node] - {other}) < len(rest) / 2


def _key(a: str, b: str) -> tuple[str, str]:
    return (a, b) if a < b else (b, a)


def _domains(bad_nodes: set[str], bad: set[tuple[str, str]], g: _Graph, labels: dict[str, dict[str, str]],
             domain_labels: Iterable[str], t: Thresholds) -> list[BadDomain]:
    """Only a domain that holds an end of a bad pair can be named, so only those are looked at."""
    ends = {n for key in bad for n in key}
    found = []
    for label in domain_labels:
        members: dict[str, list[str]] = defaultdict(list)
        for node, node_labels in labels.items():
            if label in node_labels:
                members[node_labels[label]].append(node)
        for value, nodes in sorted(members.items()):
            if len(nodes) < 2 or sum(1 for n in nodes if n in ends) < 2:
                continue
            inside = set(nodes)
            cross = {_key(n, p) for n in nodes for p in g.peers(n) if p not in inside}
            cross_bad = cross & bad
            reached = sorted({n for pair in cross_bad for n in pair if n in inside})
            hit = sorted(n for n in nodes if n in bad_nodes)
            if len(hit) >= 2 and len(hit) >= t.node_share * len(nodes):
                found.append(BadDomain(label, value, hit, len(nodes)))
            elif len(cross) >= t.min_peers and len(reached) >= 2 and len(cross_bad) >= t.node_share * len(cross):
                found.append(BadDomain(label, value, reached, len(nodes)))
    return found
