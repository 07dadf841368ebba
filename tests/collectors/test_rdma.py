"""The rdma source against fixture sysfs trees (tests/collectors/rdma_tree.py), and its series on /metrics."""

from __future__ import annotations

import os
import time
from pathlib import Path

import pytest
from prometheus_client import generate_latest
from prometheus_client.parser import text_string_to_metric_families
from prometheus_client.registry import CollectorRegistry

from collectors.base import SourceUnavailable, create
from collectors.metrics import AgentCollector, AgentSnapshot
from collectors.rdma import RdmaCollector, advance, parse_rate, parse_state
from sentinel.telemetry.schemas import HardwareEvent, NodeReport
from tests.collectors.rdma_tree import HW_COUNTERS, RdmaTree


@pytest.fixture
def tree(tmp_path: Path) -> RdmaTree:
    t = RdmaTree(tmp_path / "sys")
    t.add_port("mlx5_0", 1, hw_counters=dict(HW_COUNTERS))
    return t


def collect(source: RdmaCollector) -> dict[str, object]:
    return {p.name: p for p in source.collect([]).nics}


def test_reads_state_rate_and_counters_in_bytes(tree: RdmaTree) -> None:
    source = RdmaCollector(tree.root, "n1")
    (port,) = source.collect([]).nics
    assert (port.device, port.port, port.name) == ("mlx5_0", 1, "mlx5_0/1")
    assert (port.state, port.state_id, port.phys_state, port.phys_state_id) == ("ACTIVE", 4, "LinkUp", 5)
    assert port.up is True
    assert port.rate_bytes_per_second == 100e9 / 8
    assert port.link_layer == "InfiniBand"
    assert port.counters["port_xmit_data"] == 4_000  # 4-octet units → bytes
    assert port.counters["port_rcv_packets"] == 20
    assert port.counters["np_cnp_sent"] == 0  # hw_counters merged in
    assert port.rates == {}  # nothing to compare with yet
    assert source.error_counts() == {}


def test_rates_over_the_window(tree: RdmaTree) -> None:
    source = RdmaCollector(tree.root, "n1")
    source.collect([])
    time.sleep(0.2)
    tree.set_counter("mlx5_0", 1, "port_xmit_data", 1_000 + 250_000)
    tree.set_counter("mlx5_0", 1, "np_cnp_sent", 5_000, hw=True)
    (port,) = source.collect([]).nics
    assert port.counters["port_xmit_data"] == 4_000 + 1_000_000
    assert 1_000_000 / 0.5 < port.rates["port_xmit_data"] < 1_000_000 / 0.2 * 1.01
    assert port.rates["np_cnp_sent"] > 5_000  # 5,000 in ≈0.2 s
    assert port.rates["symbol_error"] == 0.0


def test_a_32_bit_counter_wrap_is_added_across_the_wrap(tree: RdmaTree) -> None:
    tree.set_counter("mlx5_0", 1, "port_rcv_data", 2**32 - 100)
    source = RdmaCollector(tree.root, "n1")
    before = source.collect([]).nics[0].counters["port_rcv_data"]
    tree.set_counter("mlx5_0", 1, "port_rcv_data", 50)
    (port,) = source.collect([]).nics
    assert port.counters["port_rcv_data"] - before == 150 * 4
    assert "port_rcv_data" in port.rates  # a wrap is exact: the window has a rate


def test_a_64_bit_wrap_and_a_reset_are_told_apart() -> None:
    assert advance(2**64 - 10, 5) == (15, True)
    assert advance(2**32 - 10, 5) == (15, True)
    assert advance(1_000, 10) == (10, False)  # reset (perfquery -R): counted from zero, no rate
    assert advance(5, 9) == (4, True)


def test_a_reset_keeps_the_total_monotonic_and_has_no_rate(tree: RdmaTree) -> None:
    tree.set_counter("mlx5_0", 1, "port_xmit_packets", 5_000)
    source = RdmaCollector(tree.root, "n1")
    source.collect([])
    tree.set_counter("mlx5_0", 1, "port_xmit_packets", 7)
    (port,) = source.collect([]).nics
    assert port.counters["port_xmit_packets"] == 5_007
    assert "port_xmit_packets" not in port.rates


def test_a_narrow_error_counter_at_its_maximum_is_saturated(tree: RdmaTree) -> None:
    tree.set_counter("mlx5_0", 1, "symbol_error", 65_535)
    tree.set_counter("mlx5_0", 1, "link_downed", 255)
    (port,) = RdmaCollector(tree.root, "n1").collect([]).nics
    assert sorted(port.saturated) == ["link_downed", "symbol_error"]


@pytest.mark.parametrize(("text", "reason"), [("", "empty"), ("N/A", "not_available"), ("lots", "non_numeric"),
                                              ("-3", "non_numeric")])
def test_a_bad_counter_file_is_left_out_and_counted(tree: RdmaTree, text: str, reason: str) -> None:
    tree.write("mlx5_0", 1, "hw_counters/out_of_sequence", text)
    source = RdmaCollector(tree.root, "n1")
    (port,) = source.collect([]).nics
    assert "out_of_sequence" not in port.counters
    assert port.counters["np_cnp_sent"] == 0  # the others are read
    assert source.error_counts() == {reason: 1}


def test_missing_state_and_rate_leave_the_fields_empty(tree: RdmaTree) -> None:
    d = tree.port_dir("mlx5_0", 1)
    (d / "state").unlink()
    (d / "rate").write_text("fast\n")
    source = RdmaCollector(tree.root, "n1")
    (port,) = source.collect([]).nics
    assert port.state is None and port.up is None and port.rate_bytes_per_second is None
    assert port.counters  # the rest is read
    counts = source.error_counts()
    assert counts["missing"] >= 1 and counts["non_numeric"] == 1


@pytest.mark.skipif(os.geteuid() == 0, reason="root reads a file whatever its mode")
def test_an_unreadable_counter_is_counted(tree: RdmaTree) -> None:
    path = tree.write("mlx5_0", 1, "counters/port_rcv_errors", "3")
    path.chmod(0)
    source = RdmaCollector(tree.root, "n1")
    assert "port_rcv_errors" not in source.collect([]).nics[0].counters
    assert source.error_counts() == {"unreadable": 1}


def test_an_unreadable_counter_is_counted_as_root(tree: RdmaTree) -> None:
    # EINVAL/EACCES from a counter the driver refuses: a directory where a file should be reads as OSError
    (tree.port_dir("mlx5_0", 1) / "counters" / "port_rcv_errors").unlink()
    (tree.port_dir("mlx5_0", 1) / "counters" / "port_rcv_errors").mkdir()
    source = RdmaCollector(tree.root, "n1")
    assert "port_rcv_errors" not in source.collect([]).nics[0].counters
    assert source.error_counts() == {"unreadable": 1}


def test_no_hw_counters_directory_is_not_an_error(tmp_path: Path) -> None:
    t = RdmaTree(tmp_path / "sys")
    t.add_port("mlx4_0", 1, link_layer="Ethernet", rate="40 Gb/sec (4X QDR)")
    source = RdmaCollector(t.root, "n1")
    (port,) = source.collect([]).nics
    assert port.link_layer == "Ethernet" and "np_cnp_sent" not in port.counters
    assert source.error_counts() == {}


def test_a_port_going_down_is_a_link_down_event_and_a_flap(tree: RdmaTree) -> None:
    events: list[HardwareEvent] = []
    source = RdmaCollector(tree.root, "n1", poll_seconds=0.05)
    source.start(events.append)
    try:
        tree.set_state("mlx5_0", 1, "1: DOWN", "3: Disabled")
        deadline = time.monotonic() + 3
        while not events and time.monotonic() < deadline:
            time.sleep(0.02)
        assert [(e.kind, e.nic) for e in events] == [("link_down", "mlx5_0/1")]
        (port,) = source.collect([]).nics
        assert port.up is False and port.phys_state == "Disabled" and port.link_flaps_total == 1
        tree.set_state("mlx5_0", 1, "4: ACTIVE", "5: LinkUp")
        deadline = time.monotonic() + 3
        while len(events) < 2 and time.monotonic() < deadline:
            time.sleep(0.02)
        assert [e.kind for e in events] == ["link_down", "link_up"]
    finally:
        source.close()


def test_an_unreadable_state_is_not_a_link_down(tree: RdmaTree) -> None:
    source = RdmaCollector(tree.root, "n1")
    source.poll_links()
    tree.write("mlx5_0", 1, "state", "")
    assert source.poll_links() == []


def test_a_device_that_disappears_drops_its_ports_with_link_down(tree: RdmaTree) -> None:
    tree.add_port("mlx5_1", 1)
    source = RdmaCollector(tree.root, "n1")
    source.start(lambda e: None)
    try:
        assert sorted(collect(source)) == ["mlx5_0/1", "mlx5_1/1"]
        tree.remove_device("mlx5_1")
        events = source.poll_links()
        assert [(e.kind, e.nic, e.message) for e in events] == [("link_down", "mlx5_1/1", "device gone from sysfs")]
        assert sorted(collect(source)) == ["mlx5_0/1"]
    finally:
        source.close()


def test_no_infiniband_class_means_the_source_is_unavailable(tmp_path: Path) -> None:
    with pytest.raises(SourceUnavailable, match="no RDMA devices"):
        create(f"rdma:{tmp_path}", "n1")


def test_parsers() -> None:
    assert parse_state("4: ACTIVE") == (4, "ACTIVE")
    assert parse_state("1: DOWN") == (1, "DOWN")
    assert parse_state("garbage") == (None, "garbage")
    assert parse_state(None) == (None, None)
    assert parse_rate("2.5 Gb/sec (1X SDR)") == 2.5e9 / 8
    assert parse_rate("400 Gb/sec (4X NDR)") == 50e9
    assert parse_rate("unknown") is None


def test_ports_go_in_reports_and_on_metrics(tree: RdmaTree) -> None:
    tree.write("mlx5_0", 1, "hw_counters/out_of_sequence", "N/A")
    source = create(f"rdma:{tree.root}", "n1")
    ports = source.collect([]).nics
    report = NodeReport.model_validate({"node": "n1", "seq": 1, "sent_at": time.time(), "interval_seconds": 5,
                                        "nics": [p.model_dump() for p in ports]})
    assert report.nics[0].counters["port_rcv_data"] == 8_000
    snap = AgentSnapshot(node="n1", accelerators=[], samples={}, health={}, nics=ports,
                         plugin_errors={f"rdma:{k}": v for k, v in source.error_counts().items()})
    registry = CollectorRegistry(auto_describe=False)
    registry.register(AgentCollector(lambda: snap))
    samples = {(m.name, tuple(sorted(m.labels.items()))): m.value
               for f in text_string_to_metric_families(generate_latest(registry).decode()) for m in f.samples}

    def value(name: str, **labels: str) -> float:
        return samples[(name, tuple(sorted({"node": "n1", "device": "mlx5_0", "port": "1", **labels}.items())))]

    assert value("sentinel_nic_link_up") == 1.0
    assert value("sentinel_nic_data_received_bytes_total") == 8_000
    assert value("sentinel_nic_rate_bytes_per_second") == 12.5e9
    assert value("sentinel_nic_stat_total", stat="np_cnp_sent") == 0.0
    assert samples[("sentinel_plugin_errors_total", (("node", "n1"), ("plugin", "rdma:not_available")))] == 1.0
