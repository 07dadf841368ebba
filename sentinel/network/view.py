"""The network tier's live state on the leader: the probe plan, the pair matrix, the RDMA ports, and the
latest localisation (probe_mesh recomputes it twice a probe round; other readers reuse it for half a round).

Fed by registration (a node's labels: its probe address and its domains) and by reports (`probes`, `nics`);
read by the interconnect detectors, the remediation's placement exclusion, the API and /metrics.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass, field

from sqlalchemy import select
from sqlalchemy.orm import Session

from sentinel.config import Settings
from sentinel.network.localise import Localisation, Thresholds, localise
from sentinel.network.matrix import PairStats, ProbeMatrix
from sentinel.network.nics import NicStore
from sentinel.network.plan import PROBE_LABEL, ProbePlan
from sentinel.network.rules import NicRule, load_rules
from sentinel.nodes.models import Node
from sentinel.telemetry.schemas import NicPort, ProbeResult, ProbeTarget

LOCALISE_SECONDS = 1.0


@dataclass
class NetworkView:
    plan: ProbePlan
    matrix: ProbeMatrix
    nics: NicStore
    rules: list[NicRule]
    thresholds: Thresholds
    domain_labels: tuple[str, ...]
    labels: dict[str, dict[str, str]] = field(default_factory=dict)
    _lock: threading.Lock = field(default_factory=threading.Lock)
    _localised: tuple[float, Localisation, list[PairStats]] | None = None

    @classmethod
    def build(cls, *, peers: int, round_seconds: float, window_seconds: float, rules: list[NicRule],
              thresholds: Thresholds, domain_labels: tuple[str, ...]) -> NetworkView:
        longest = max((r.window_seconds for r in rules if r.increase is not None), default=300.0)
        return cls(plan=ProbePlan(peers, round_seconds), matrix=ProbeMatrix(window_seconds),
                   nics=NicStore({r.counter for r in rules}, longest), rules=rules, thresholds=thresholds,
                   domain_labels=domain_labels)

    @classmethod
    def from_settings(cls, settings: Settings) -> NetworkView:
        t = Thresholds(rtt_seconds=settings.probe_rtt_seconds, rtt_factor=settings.probe_rtt_factor,
                       loss_ratio=settings.probe_loss_ratio)
        return cls.build(peers=settings.probe_peers, round_seconds=settings.probe_round_seconds,
                         window_seconds=settings.probe_window_seconds, rules=load_rules(settings.nic_rules_file),
                         thresholds=t, domain_labels=tuple(settings.network_domain_labels))

    def load(self, session: Session) -> None:
        for name, labels in session.execute(select(Node.name, Node.labels)):
            self.registered(name, {str(k): str(v) for k, v in (labels or {}).items()})

    def registered(self, node: str, labels: dict[str, str]) -> None:
        with self._lock:
            self.labels[node] = {k: v for k, v in labels.items() if k in self.domain_labels}
        self.plan.set_participant(node, labels.get(PROBE_LABEL))

    def forget(self, node: str) -> None:
        with self._lock:
            self.labels.pop(node, None)
        self.plan.set_participant(node, None)
        self.matrix.forget(node)
        self.nics.forget(node)

    def reported(self, node: str, probes: list[ProbeResult], nics: list[NicPort], now: float) -> None:
        if probes:
            self.matrix.add(node, probes, now)
        if nics:
            self.nics.add(node, nics, now)

    def targets(self, node: str, now: float) -> list[ProbeTarget] | None:
        return self.plan.targets(node, now)

    def localisation(self, now: float, *, fresh: bool = False) -> Localisation:
        return self.snapshot(now, fresh=fresh)[0]

    def snapshot(self, now: float, *, fresh: bool = False) -> tuple[Localisation, list[PairStats]]:
        """The localisation and the window's pairs it was computed from (one pass over the matrix serves the
        detector, /metrics and the API alike)."""
        with self._lock:
            cached = self._localised
            labels = dict(self.labels)
        ttl = max(LOCALISE_SECONDS, self.plan.round_seconds / 2)  # probe_mesh recomputes it that often
        if cached is not None and not fresh and 0 <= now - cached[0] < ttl:
            return cached[1], cached[2]
        pairs = self.matrix.pairs(now)
        found = localise(pairs, labels, self.domain_labels, self.thresholds)
        with self._lock:
            self._localised = (now, found, pairs)
        return found, pairs

    def excluded(self, now: float) -> dict[str, str]:
        """Nodes a slow link or a bad node puts out of placement (when `network_exclude_slow_nodes` is on)."""
        found = self.localisation(now)
        out = {n.node: f"bad on {n.bad_peers} of {n.measured_peers} probed pairs" for n in found.nodes}
        for link in found.links:
            if link.confident:
                for end in (link.a, link.b):
                    out.setdefault(end, f"an end of slow link {link.name}")
        return out
