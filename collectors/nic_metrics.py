"""The agent's RDMA port series (`sentinel_nic_*`, labels node/device/port; DESIGN §7) and the count of bad
inputs its sources skipped (`sentinel_plugin_errors_total{node,plugin}`), named after node_exporter's
infiniband collector where one exists (`..._data_transmitted_bytes_total`, `..._link_downed_total`)."""

from __future__ import annotations

from collections.abc import Iterator

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

from sentinel.telemetry.schemas import NicPort

P = "sentinel_nic_"
LABELS = ["node", "device", "port"]
# counter file → (series name, help); the rest go to sentinel_nic_stat_total{stat} (promtool refuses a counter
# named ..._counter_total)
NAMED = {
    "port_xmit_data": ("data_transmitted_bytes", "Bytes sent on the port (port_xmit_data × 4)"),
    "port_rcv_data": ("data_received_bytes", "Bytes received on the port (port_rcv_data × 4)"),
    "port_xmit_packets": ("packets_transmitted", "Packets sent on the port"),
    "port_rcv_packets": ("packets_received", "Packets received on the port"),
}


def nic_families(node: str, ports: list[NicPort],
                 plugin_errors: dict[str, int]) -> Iterator[GaugeMetricFamily | CounterMetricFamily]:
    up = GaugeMetricFamily(P + "link_up", "1 while the port's state is ACTIVE", labels=LABELS)
    state = GaugeMetricFamily(P + "state_id", "The port's logical state (1 DOWN, 2 INIT, 3 ARMED, 4 ACTIVE)",
                              labels=LABELS)
    phys = GaugeMetricFamily(P + "physical_state_id", "The port's physical state (5 LinkUp, 3 Disabled, 2 Polling)",
                             labels=LABELS)
    rate = GaugeMetricFamily(P + "rate_bytes_per_second", "The port's signalling rate", labels=LABELS)
    info = GaugeMetricFamily(P + "info", "1 per port, with its link layer and states as text",
                             labels=[*LABELS, "link_layer", "state", "phys_state"])
    flaps = CounterMetricFamily(P + "link_flaps", "Times the port left ACTIVE since the agent started", labels=LABELS)
    named = {f: CounterMetricFamily(P + name, doc, labels=LABELS) for f, (name, doc) in NAMED.items()}
    other = CounterMetricFamily(P + "stat", "Every other counter of counters/ and hw_counters/, kept monotonic",
                                labels=[*LABELS, "stat"])
    saturated = GaugeMetricFamily(P + "stat_saturated", "1 while a narrow PMA counter is stuck at its maximum",
                                  labels=[*LABELS, "stat"])
    for p in ports:
        labels = [node, p.device, str(p.port)]
        if p.up is not None:
            up.add_metric(labels, 1.0 if p.up else 0.0)
        if p.state_id is not None:
            state.add_metric(labels, p.state_id)
        if p.phys_state_id is not None:
            phys.add_metric(labels, p.phys_state_id)
        if p.rate_bytes_per_second is not None:
            rate.add_metric(labels, p.rate_bytes_per_second)
        info.add_metric([*labels, p.link_layer or "", p.state or "", p.phys_state or ""], 1.0)
        flaps.add_metric(labels, p.link_flaps_total)
        for counter, value in sorted(p.counters.items()):
            if counter in named:
                named[counter].add_metric(labels, value)
            else:
                other.add_metric([*labels, counter], value)
        for counter in p.saturated:
            saturated.add_metric([*labels, counter], 1.0)
    yield from (up, state, phys, rate, info)
    yield flaps
    yield from named.values()
    yield from (other, saturated)
    errors = CounterMetricFamily("sentinel_plugin_errors", "Bad inputs a source skipped (missing, empty, "
                                 "non-numeric, unreadable or N/A files), by source:reason", labels=["node", "plugin"])
    for plugin, n in sorted(plugin_errors.items()):
        errors.add_metric([node, plugin], n)
    yield errors
