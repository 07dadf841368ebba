"""Fault traces: the real one loads as its SOURCE.md describes it, and a record that cannot be right is an
error naming it."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from sentinel.simulate.costs import CostsError, load_costs
from sentinel.simulate.trace import DAY, Trace, TraceError, load_trace, parse_trace, synthetic_trace
from tests.simulate.conftest import FIGURES, event, write_figures


def test_the_real_trace_loads_with_its_counts(real_trace: Trace) -> None:
    assert len(real_trace.nodes) == 400 and len(set(real_trace.nodes)) == 400
    assert len(real_trace.faults) == 312  # fault_start events; 309 end inside days 0–174
    assert sum(1 for f in real_trace.faults if f.end is None) == 3
    assert real_trace.rate_per_1000_node_days(0, 174) == pytest.approx(312 / 400 / 174 * 1000)
    kinds = {f.kind for f in real_trace.faults}
    assert kinds == {"gpu", "network", "hardware", "other"}
    assert all(f.end is None or f.end >= f.start for f in real_trace.faults)


@pytest.mark.parametrize(("events", "message"), [
    ([{"event_time": 1.0, "event_type": "fault_start"}], "record 0: missing field 'node_id'"),
    ([event("a", 2.0), event("a", 1.0, "fault_end")], "record 1: fault_end at day 1.0 before its fault_start"),
    ([event("a", 1.0, "fault_end")], "record 0: fault_end for a at day 1.0 with no open fault_start"),
    ([event("a", 1.0), event("a", 2.0)], "record 1: fault_start for a at day 2.0 while its fault from record 0"),
    ([{"node_id": "a", "event_time": 1.0, "event_type": "reboot"}], "record 0: event_type must be"),
    ([{"node_id": "a", "event_time": float("nan"), "event_type": "fault_end"}], "record 0: event_time must be"),
    ([{"node_id": "a", "event_time": -1, "event_type": "fault_end"}], "record 0: event_time must be"),
    ([{"node_id": "", "event_time": 1, "event_type": "fault_end"}], "record 0: node_id must be"),
    ([{"node_id": "a", "event_time": 1, "event_type": "fault_start"}], "record 0: missing field 'fault_type'"),
    ({"events": []}, "expected a JSON list of events"),
])
def test_a_bad_record_is_an_error_naming_it(events: Any, message: str) -> None:
    with pytest.raises(TraceError, match=message.replace("(", r"\(")):
        parse_trace(events)


def test_node_ids_beyond_the_cluster_or_the_inventory_are_errors(tmp_path: Path) -> None:
    events = [event(f"n{k}", 1.0 + k) for k in range(3)]
    with pytest.raises(TraceError, match="record 2: node_id 'n2' is node 3 of a 2-node cluster"):
        parse_trace(events, nodes=2)
    with pytest.raises(TraceError, match="record 1: node_id 'n1' is not in the inventory"):
        parse_trace(events, inventory=["n0", "n2"])
    trace_file, inventory = tmp_path / "t.json", tmp_path / "nodes.txt"
    trace_file.write_text(json.dumps(events))
    inventory.write_text("n0\nn1\nn2\nspare-a\n")
    trace = load_trace(trace_file, nodes=3, inventory=inventory)
    assert len(trace.nodes) == 4 and "spare-a" in trace.nodes  # the inventory's size wins over a smaller --nodes
    trace_file.write_text("{not json")
    with pytest.raises(TraceError, match="not JSON"):
        load_trace(trace_file)


def test_a_fault_open_at_the_end_stays_open_and_windows_select_what_touches_them() -> None:
    trace = parse_trace([event("a", 1.0), event("a", 3.0, "fault_end"), event("b", 5.0)], nodes=4)
    assert trace.nodes[:2] == ["a", "b"] and len(trace.nodes) == 4
    assert [(f.node, f.end) for f in trace.faults] == [("a", 3.0 * DAY), ("b", None)]
    assert [f.node for f in trace.between(2.0, 4.0)] == ["a"]
    assert [f.node for f in trace.between(3.0, 9.0)] == ["b"]


def test_synthetic_faults_come_at_the_asked_rate() -> None:
    trace = synthetic_trace(nodes=400, days=500, per_1000_node_days=4.0, repair_hours=24, seed=2)
    assert trace.rate_per_1000_node_days(0, 500) == pytest.approx(4.0, rel=0.05)
    weibull = synthetic_trace(nodes=400, days=500, per_1000_node_days=4.0, repair_hours=24, seed=2, shape=0.7)
    assert weibull.rate_per_1000_node_days(0, 500) == pytest.approx(4.0, rel=0.08)


def test_costs_come_from_the_file_and_a_missing_figure_names_its_benchmark(tmp_path: Path) -> None:
    costs = load_costs(write_figures(tmp_path / "m.json", FIGURES))
    assert costs.recover_gpu == 0.19 and costs.cold_restart == 3.9
    assert costs.serving_failover == 0.19 and "not measured yet" in costs.notes[0]
    partial = {k: v for k, v in FIGURES.items() if k != "torch_load_seconds_per_gib"}
    with pytest.raises(CostsError, match=r"lacks .torch_load_seconds_per_gib.: run benchmarks/checkpoint\.py"):
        load_costs(write_figures(tmp_path / "p.json", partial))
    with pytest.raises(CostsError, match="must be a finite number"):
        load_costs(write_figures(tmp_path / "n.json", FIGURES | {"torch_save_seconds_per_gib": float("nan")}))
    with pytest.raises(CostsError, match="cannot read"):
        load_costs(tmp_path / "absent.json")


def test_the_benchmarks_file_in_the_repository_has_every_figure_the_simulator_needs() -> None:
    costs = load_costs()
    assert costs.recover_gpu > 0 and costs.stall_per_gib > 0 and costs.cold_restart > costs.recover_gpu
