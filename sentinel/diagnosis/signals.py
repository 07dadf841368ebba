"""Node signals that go with a rank's slowdown: its accelerators' throttle reasons and clocks, the CPU its process
waits for, its host's memory, and what the network tier says about its node (NIC alerts, the probe mesh)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from sentinel.network.nics import port_alerts

if TYPE_CHECKING:
    from sentinel.diagnosis.context import LiveContext as DetectionContext

MEMORY_PRESSURE = 0.95  # host memory used ÷ total at which a node is under memory pressure


@dataclass
class RankSignals:
    rank: int
    node: str
    accelerators: list[str] = field(default_factory=list)
    throttle_reasons: dict[str, list[str]] = field(default_factory=dict)  # uuid → reasons, where any
    clocks_hz: dict[str, float] = field(default_factory=dict)  # uuid → SM clock now
    memory_ratio: float | None = None  # host memory used ÷ total
    nic_alerts: list[str] = field(default_factory=list)
    mesh: list[str] = field(default_factory=list)  # the probe mesh's verdicts naming its node

    def as_evidence(self) -> dict[str, Any]:
        out: dict[str, Any] = {"node": self.node, "accelerators": self.accelerators}
        for name in ("throttle_reasons", "clocks_hz", "memory_ratio", "nic_alerts", "mesh"):
            value = getattr(self, name)
            if value:
                out[name] = value
        return out


def gather(ctx: DetectionContext, job_id: int, rank_nodes: dict[int, str], hosts: dict[str, float],
           now: float) -> dict[int, RankSignals]:
    """`hosts`: node → memory used ÷ total from its last report."""
    out: dict[int, RankSignals] = {}
    nodes = sorted(set(rank_nodes.values()))
    alerts: dict[str, list[str]] = {}
    mesh: dict[str, list[str]] = {}
    if ctx.network is not None:
        alerts = port_alerts(ctx.network.nics, ctx.network.rules, nodes)
        found = ctx.network.localisation(now)
        for link in found.links:
            for end in (link.a, link.b):
                mesh.setdefault(end, []).append(f"slow link {link.name}")
        for bad in found.nodes:
            mesh.setdefault(bad.node, []).append(f"bad node {bad.node}")
    for rank, node in rank_nodes.items():
        placed_on, uuids = ctx.placement(job_id, rank)
        signals = RankSignals(rank=rank, node=placed_on or node, accelerators=uuids,
                              memory_ratio=hosts.get(node), nic_alerts=alerts.get(node, []),
                              mesh=mesh.get(node, []))
        for uuid in uuids:
            latest = ctx.samples.latest(uuid)
            if latest is None:
                continue
            sample = latest[1]
            if sample.throttle_reasons:
                signals.throttle_reasons[uuid] = list(sample.throttle_reasons)
            if sample.sm_clock_hz:
                signals.clocks_hz[uuid] = sample.sm_clock_hz
        out[rank] = signals
    return out
