"""Each node's RDMA ports as its latest report gave them, with a short history of their counters.

The history keeps, per port, at most `HISTORY` points spaced at least `spacing_seconds` apart (the longest
rule window ÷ HISTORY), and only the counters some rule reads: 12,500 nodes × 2 ports stay a few tens of MB.
"""

from __future__ import annotations

import threading
from collections import deque
from dataclasses import dataclass

from sentinel.network.rules import NicRule
from sentinel.telemetry.schemas import NicPort

HISTORY = 10
FLAPS = "link_flaps"


@dataclass
class PortLive:
    node: str
    port: NicPort
    at: float  # when the server took the report
    history: deque[tuple[float, dict[str, int]]]  # anchors: (when, counter totals), oldest first
    latest: dict[str, int]


class NicStore:
    def __init__(self, watched: set[str], longest_window_seconds: float):
        self.watched = set(watched)
        self.spacing_seconds = max(1.0, longest_window_seconds / (HISTORY - 2))
        self._lock = threading.Lock()
        self._ports: dict[str, dict[str, PortLive]] = {}  # node → "dev/port" → live

    def add(self, node: str, ports: list[NicPort], now: float) -> None:
        """A report's ports replace the node's: a port it no longer lists is gone (the agent said link_down)."""
        with self._lock:
            before = self._ports.get(node, {})
            after: dict[str, PortLive] = {}
            for port in ports:
                live = before.get(port.name) or PortLive(node, port, now, deque(maxlen=HISTORY), {})
                values = {k: v for k, v in port.counters.items() if k in self.watched}
                values[FLAPS] = port.link_flaps_total
                live.port, live.at, live.latest = port, now, values
                if not live.history or now - live.history[-1][0] >= self.spacing_seconds:
                    live.history.append((now, values))
                after[port.name] = live
            if after:
                self._ports[node] = after
            else:
                self._ports.pop(node, None)

    def ports(self, node: str | None = None) -> list[PortLive]:
        with self._lock:
            nodes = [node] if node is not None else sorted(self._ports)
            return [live for n in nodes for _, live in sorted(self._ports.get(n, {}).items())]

    def forget(self, node: str) -> None:
        with self._lock:
            self._ports.pop(node, None)


def fired(live: PortLive, rule: NicRule) -> tuple[float, str] | None:
    """(value, what was measured) when `rule` holds on this port now, else None."""
    if rule.per_second is not None:
        value = live.port.rates.get(rule.counter)
        if value is None or value < rule.per_second:
            return None
        return value, f"{value:.1f}/s (threshold {rule.per_second:g}/s)"
    grown = increase(live, rule.counter, rule.window_seconds)
    if grown is None or rule.increase is None or grown < rule.increase:
        return None
    return grown, f"+{grown:g} in {rule.window_seconds:g}s (threshold {rule.increase:g})"


def port_alerts(store: NicStore, rules: list[NicRule], nodes: list[str]) -> dict[str, list[str]]:
    """node → its ports that are down or on which a rule holds now, with why ("mlx5_0/1 down",
    "mlx5_0/1 symbol_errors")."""
    out: dict[str, list[str]] = {}
    for node in nodes:
        for live in store.ports(node):
            why = ["down"] if live.port.up is False else [r.name for r in rules if fired(live, r) is not None]
            if why:
                out.setdefault(node, []).append(f"{live.port.name} {','.join(why)}")
    return out


def increase(live: PortLive, counter: str, window_seconds: float) -> float | None:
    """How much `counter` grew over about the last `window_seconds` (None: not reported, or no history)."""
    if counter not in live.latest:
        return None
    older = [values for at, values in live.history if at <= live.at - window_seconds and counter in values]
    base = older[-1] if older else next((v for _, v in live.history if counter in v), None)
    if base is None:
        return None
    return float(max(0, live.latest[counter] - base[counter]))
