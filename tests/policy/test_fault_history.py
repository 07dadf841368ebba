"""The live node fault history from the incidents, on SQLite and PostgreSQL: which incidents are faults, their
kinds, the bounded look-back, and the learned placement reading it."""

from __future__ import annotations

import pytest
from sqlalchemy import event
from sqlalchemy.orm import Session, sessionmaker

from sentinel.clock import to_datetime
from sentinel.policy.features import Fault
from sentinel.policy.history import node_fault_history
from sentinel.policy.placement import LearnedPlacement
from sentinel.remediation.placement import Inventory, PlacementRequest, Slot
from tests.policy.conftest import NOW, add_incidents, incident
from tests.policy.hazard_models import hazard_model

DAY = 86400.0


def test_hardware_incidents_per_node_are_its_faults(sessions: sessionmaker[Session]) -> None:
    add_incidents(sessions,
                  incident("n1", days_ago=3, out_days=1),  # an XID: a GPU fault, back after a day
                  incident("n1", days_ago=1, out_days=None, layer="interconnect"),  # still out
                  incident("n2", days_ago=10, detector="heartbeat", severity="warning"),  # a silent node
                  incident("n2", days_ago=2, severity="warning", detector="throttle"),  # a warning: not a fault
                  incident("n3", days_ago=2, layer="software"),  # not the hardware
                  incident(None, days_ago=2),  # fleet-wide: no node
                  incident("n4", days_ago=200),  # past the look-back
                  incident("n4", days_ago=300, out_days=None),  # still open: kept whatever its age
                  incident("n5", days_ago=-1))  # after `now`
    with sessions() as session:
        history = node_fault_history(session, to_datetime(NOW))
    assert history == {
        "n1": [Fault(NOW - 3 * DAY, NOW - 2 * DAY, "gpu"), Fault(NOW - DAY, None, "network")],
        "n2": [Fault(NOW - 10 * DAY, NOW - 9.5 * DAY, "hardware")],
        "n4": [Fault(NOW - 300 * DAY, None, "gpu")],
    }


def test_the_learned_placement_reads_the_history_and_avoids_the_risky_node(sessions: sessionmaker[Session]) -> None:
    add_incidents(sessions, incident("b", days_ago=3, out_days=1), incident("b", days_ago=2, out_days=1.5))
    slots = {f"{n}-{i}": Slot(f"{n}-{i}", n, i, "h100", 80 * 2**30) for n in ("a", "b", "c") for i in range(2)}
    inventory = Inventory(slots=slots, free={u for u in slots if not u.startswith("a")})
    request = PlacementRequest(1, {0: ["a-0"], 1: ["a-1"]}, frozenset({0, 1}))
    with sessions() as session:
        policy = LearnedPlacement(hazard_model()).prepare(session, to_datetime(NOW), incident_id=9)
    out = policy.place(request, inventory)
    assert {n for n, _ in out.values()} == {"c"}
    assert policy.risks.risk("b") > 0.9 > 0.05 > policy.risks.risk("c")
    [line] = policy.explanation()
    assert line.startswith("placement (learned): ranks 0, 1 → c (risk 0.02: ")
    assert "; avoided b (risk 0.9" in line and "faults_7d=2" in line


@pytest.mark.parametrize("database_url", ["sqlite"], indirect=True)
def test_a_history_is_one_query(sessions: sessionmaker[Session]) -> None:
    add_incidents(sessions, *[incident(f"n{i}", days_ago=i) for i in range(20)])
    statements: list[str] = []
    with sessions() as session:
        event.listen(session.get_bind(), "before_cursor_execute", lambda *a: statements.append(a[2]))
        history = node_fault_history(session, to_datetime(NOW))
    assert len(history) == 20 and len(statements) == 1
