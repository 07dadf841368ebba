"""The server's /metrics: fleet series built fresh on each scrape from what the runtime holds."""

from __future__ import annotations

from collections.abc import Iterator
from typing import TYPE_CHECKING

from prometheus_client import CollectorRegistry
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.registry import Collector

from sentinel.accelerators.service import count_by_health

if TYPE_CHECKING:
    from sentinel.runtime import Runtime


class FleetCollector(Collector):
    def __init__(self, runtime: Runtime):
        self._rt = runtime

    def collect(self) -> Iterator[GaugeMetricFamily | CounterMetricFamily]:
        nodes = GaugeMetricFamily("sentinel_nodes", "Nodes by state", labels=["state"])
        for state, count in self._rt.fleet.count_by_state().items():
            nodes.add_metric([state], count)
        yield nodes
        accelerators = GaugeMetricFamily("sentinel_accelerators", "Present accelerators by health", labels=["health"])
        try:
            with self._rt.factory() as session:
                counts = count_by_health(session)
        except Exception:  # the database being away must not fail the scrape
            counts = {}
        for health, count in counts.items():
            accelerators.add_metric([health], count)
        yield accelerators
        ingest = self._rt.ingest
        yield CounterMetricFamily("sentinel_ingest_reports", "Node reports accepted and stored",
                                  value=ingest.accepted_total)
        yield CounterMetricFamily("sentinel_ingest_duplicates", "Replayed reports acknowledged, not counted again",
                                  value=ingest.duplicates_total)
        rejected = CounterMetricFamily("sentinel_ingest_rejected", "Reports refused, by reason", labels=["reason"])
        for reason, count in sorted(ingest.rejected_total.items()):
            rejected.add_metric([reason], count)
        yield rejected
        errors = CounterMetricFamily("sentinel_plugin_errors", "Failures of scheduled jobs and plugins",
                                     labels=["plugin"])
        for plugin, count in sorted(self._rt.plugin_errors.items()):
            errors.add_metric([plugin], count)
        yield errors


def build_registry(runtime: Runtime) -> CollectorRegistry:
    registry = CollectorRegistry(auto_describe=False)
    registry.register(FleetCollector(runtime))
    return registry
