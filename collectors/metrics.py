"""The agent's own /metrics: per-accelerator series (DESIGN §7), built fresh on each scrape."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass, field

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.registry import Collector

from collectors.nic_metrics import nic_families
from sentinel.telemetry.schemas import AcceleratorInfo, AcceleratorSample, NicPort

THROTTLE_REASONS = ("sw_power_cap", "hw_slowdown", "hw_thermal_slowdown", "sw_thermal_slowdown",
                    "hw_power_brake_slowdown", "sync_boost")
HEALTH = ("healthy", "degraded", "offline")
LABELS = ["node", "accelerator", "uuid", "model"]


@dataclass
class AgentSnapshot:
    node: str
    accelerators: list[AcceleratorInfo]
    samples: dict[str, AcceleratorSample]
    health: dict[str, str]
    counters: dict[str, float] = field(default_factory=dict)
    sources_up: dict[str, bool] = field(default_factory=dict)
    # uuid → (kind, xid or "") → recent now; a fault seen once stays listed, reading 0 once it clears
    recent: dict[str, dict[tuple[str, str], bool]] = field(default_factory=dict)
    nics: list[NicPort] = field(default_factory=list)  # the rdma source's ports (collectors/nic_metrics.py)
    plugin_errors: dict[str, int] = field(default_factory=dict)  # "source:reason" → bad inputs skipped


class AgentCollector(Collector):
    def __init__(self, snapshot: Callable[[], AgentSnapshot]):
        self._snapshot = snapshot

    def collect(self) -> Iterator[GaugeMetricFamily | CounterMetricFamily]:
        snap = self._snapshot()
        p = "sentinel_accelerator_"
        gauges = {
            "utilization_ratio": ("Accelerator utilization, 0-1", lambda s: s.utilization_ratio),
            "memory_used_bytes": ("Device memory in use", lambda s: s.memory_used_bytes),
            "memory_peak_bytes": ("Highest device memory in use since the agent started",
                                  lambda s: s.memory_peak_bytes),
            "memory_total_bytes": ("Device memory capacity", lambda s: s.memory_total_bytes),
            "power_watts": ("Power draw", lambda s: s.power_watts),
            "temperature_celsius": ("Die temperature", lambda s: s.temperature_celsius),
        }
        families = {name: GaugeMetricFamily(p + name, doc, labels=LABELS) for name, (doc, _) in gauges.items()}
        xid = CounterMetricFamily(p + "xid_errors", "XID errors by code", labels=[*LABELS, "xid"])
        ecc = CounterMetricFamily(p + "ecc_errors", "ECC errors by kind", labels=[*LABELS, "kind"])
        throttled = GaugeMetricFamily(p + "throttled", "1 while clocks are held down for this reason",
                                      labels=[*LABELS, "reason"])
        health = GaugeMetricFamily(p + "health", "1 for the accelerator's current state as the agent sees it",
                                   labels=[*LABELS, "state"])
        recent = GaugeMetricFamily(p + "fault_recent", "1 while a fault of this kind (and XID) is recent and not "
                                   "cleared; 0 once released, recovered or quiet", labels=[*LABELS, "kind", "xid"])
        for info in snap.accelerators:
            labels = [snap.node, str(info.index), info.uuid, info.model]
            state = snap.health.get(info.uuid, "healthy")
            for s in HEALTH:
                health.add_metric([*labels, s], 1.0 if s == state else 0.0)
            for (kind, code), on in sorted(snap.recent.get(info.uuid, {}).items()):
                recent.add_metric([*labels, kind, code], 1.0 if on else 0.0)
            sample = snap.samples.get(info.uuid)
            if sample is None:
                continue
            for name, (_, read) in gauges.items():
                value = read(sample)
                if value is not None:
                    families[name].add_metric(labels, float(value))
            for code, count in sorted(sample.xid_errors_total.items()):
                xid.add_metric([*labels, code], count)
            if sample.ecc_corrected_total is not None:
                ecc.add_metric([*labels, "corrected"], sample.ecc_corrected_total)
            if sample.ecc_uncorrected_total is not None:
                ecc.add_metric([*labels, "uncorrected"], sample.ecc_uncorrected_total)
            for reason in sorted(set(THROTTLE_REASONS) | set(sample.throttle_reasons)):
                throttled.add_metric([*labels, reason], 1.0 if reason in sample.throttle_reasons else 0.0)
        yield from families.values()
        yield from (xid, ecc, throttled, health, recent)
        yield from self._agent_series(snap)
        yield from nic_families(snap.node, snap.nics, snap.plugin_errors)

    @staticmethod
    def _agent_series(snap: AgentSnapshot) -> Iterator[GaugeMetricFamily | CounterMetricFamily]:
        up = GaugeMetricFamily("sentinel_agent_source_up", "1 when the source started and collects",
                               labels=["node", "source"])
        for source, ok in sorted(snap.sources_up.items()):
            up.add_metric([snap.node, source], 1.0 if ok else 0.0)
        yield up
        for name, value in sorted(snap.counters.items()):
            if name.endswith("_total"):
                yield _counter(name, snap.node, value)
            else:
                g = GaugeMetricFamily(f"sentinel_agent_{name}", name.replace("_", " "), labels=["node"])
                g.add_metric([snap.node], value)
                yield g


def _counter(name: str, node: str, value: float) -> CounterMetricFamily:
    c = CounterMetricFamily(f"sentinel_agent_{name[:-6]}", name[:-6].replace("_", " "), labels=["node"])
    c.add_metric([node], value)
    return c
