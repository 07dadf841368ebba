"""Who probes whom: each round, every participating agent gets `k` peers, a rotating subset.

Participants are registered nodes that advertise a probe address (label `probe_addr`); nothing else is ever
a target. A round's assignment is a set of `k` distinct offsets drawn from the round number: node i probes
nodes i+o (mod N) for each offset o. Every node is then probed by exactly `k` others per round, so the cost
per node is O(k) whatever the fleet size, and over rounds every pair is covered (Pingmesh probes a fixed
full mesh within a rack and a sample beyond it; R-Pingmesh samples too). The assignment is computed once
per round (O(N·k)), not per report.
"""

from __future__ import annotations

import ipaddress
import random
import threading

from sentinel.telemetry.schemas import ProbeTarget

PROBE_LABEL = "probe_addr"


def split_address(address: str) -> tuple[str, int] | None:
    """"10.0.0.5:9481" / "[fd00::5]:9481" → (host, port); None for anything but an IP literal (no names, so no
    lookups; not 0.0.0.0 or a multicast group) and a port."""
    host, sep, port = address.rpartition(":")
    host = host[1:-1] if host.startswith("[") and host.endswith("]") else host
    if not sep or not port.isdigit() or not 0 < int(port) < 65536:
        return None
    try:
        ip = ipaddress.ip_address(host)
    except ValueError:
        return None
    if ip.is_unspecified or ip.is_multicast:
        return None
    return str(ip), int(port)  # normalised: replies are matched on the address they come from


def valid_address(address: str) -> bool:
    return split_address(address) is not None


class ProbePlan:
    def __init__(self, peers: int, round_seconds: float):
        self.peers = max(0, peers)
        self.round_seconds = max(1.0, round_seconds)
        self._lock = threading.Lock()
        self._participants: dict[str, str] = {}  # node → probe address
        self._version = 0
        self._cached: tuple[int, int, dict[str, list[ProbeTarget]]] | None = None

    def set_participant(self, node: str, address: str | None) -> None:
        """A node (re)registered: it takes part when it advertised a valid probe address."""
        address = address if address and valid_address(address) else None
        with self._lock:
            if self._participants.get(node) == address:
                return
            if address is None:
                self._participants.pop(node, None)
            else:
                self._participants[node] = address
            self._version += 1

    def participants(self) -> dict[str, str]:
        with self._lock:
            return dict(self._participants)

    def targets(self, node: str, now: float) -> list[ProbeTarget] | None:
        """The peers `node` probes this round; None when `node` does not take part."""
        round_no = int(now // self.round_seconds)
        with self._lock:
            if node not in self._participants:
                return None
            cached = self._cached
            if cached is None or cached[0] != round_no or cached[1] != self._version:
                cached = (round_no, self._version, self._assign(round_no))
                self._cached = cached
            return list(cached[2].get(node, []))

    def _assign(self, round_no: int) -> dict[str, list[ProbeTarget]]:
        names = sorted(self._participants)
        n = len(names)
        k = min(self.peers, n - 1)
        if k <= 0:
            return {name: [] for name in names}
        offsets = random.Random(round_no).sample(range(1, n), k)
        targets = [ProbeTarget(node=name, address=self._participants[name]) for name in names]
        return {name: [targets[(i + o) % n] for o in offsets] for i, name in enumerate(names)}
