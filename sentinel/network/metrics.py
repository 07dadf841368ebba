"""The network tier's server series: the probe mesh summarised across every pair probed in the window."""

from __future__ import annotations

import math
from collections.abc import Iterator

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric

from sentinel.network.localise import bad_now
from sentinel.network.view import NetworkView

QUANTILES = (0.5, 0.9, 0.99, 1.0)


def _quantile(values: list[float], q: float) -> float:
    """Nearest rank on sorted values (q = 1.0: the largest)."""
    return values[min(len(values) - 1, max(0, math.ceil(q * len(values)) - 1))]


def network_families(net: NetworkView, now: float) -> Iterator[Metric]:
    found, pairs = net.snapshot(now)
    # a summary over the pairs probed in the window (not over time): quantiles of their median RTTs, with the
    # pairs' count and the sum of those medians
    rtt = Metric("sentinel_network_probe_rtt_seconds",
                 "Median probe RTT of the pairs probed in the window: its quantiles across pairs", "summary")
    medians = sorted(p.rtt_p50_seconds for p in pairs if p.rtt_p50_seconds is not None)
    for q in QUANTILES if medians else ():
        rtt.add_sample("sentinel_network_probe_rtt_seconds", {"quantile": f"{q:g}"}, _quantile(medians, q))
    rtt.add_sample("sentinel_network_probe_rtt_seconds_count", {}, len(medians))
    rtt.add_sample("sentinel_network_probe_rtt_seconds_sum", {}, math.fsum(medians))
    yield rtt
    states = GaugeMetricFamily("sentinel_network_probe_pairs", "Ordered pairs probed in the window, by verdict",
                               labels=["state"])
    bad = sum(1 for p in pairs if bad_now(p, found.baseline_rtt_seconds, net.thresholds))
    states.add_metric(["bad"], bad)
    states.add_metric(["ok"], len(pairs) - bad)
    yield states
    sent, received = sum(p.sent for p in pairs), sum(p.received for p in pairs)
    yield GaugeMetricFamily("sentinel_network_probe_loss_ratio", "Probes lost ÷ sent over the window, all pairs",
                            value=1.0 - received / sent if sent else 0.0)
    yield GaugeMetricFamily("sentinel_network_probe_participants", "Agents taking part in the probe mesh",
                            value=len(net.plan.participants()))
    located = GaugeMetricFamily("sentinel_network_localised", "Faults the probe mesh localises now, by kind",
                                labels=["kind"])
    for kind, count in (("link", sum(1 for link in found.links if link.confident)), ("node", len(found.nodes)),
                        ("domain", len(found.domains)), ("fleet_wide", int(found.fleet_wide))):
        located.add_metric([kind], count)
    yield located
    yield CounterMetricFamily("sentinel_network_probe_results", "Probe results (one pair, one window) taken",
                              value=net.matrix.results_total)
    ports = GaugeMetricFamily("sentinel_network_nic_ports", "RDMA ports reported by agents, by link state",
                              labels=["state"])
    up = [p.port.up for p in net.nics.ports()]
    for state, count in (("up", up.count(True)), ("down", up.count(False)), ("unknown", up.count(None))):
        ports.add_metric([state], count)
    yield ports
