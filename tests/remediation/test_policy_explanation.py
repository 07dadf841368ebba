"""The learned placement while remediating, through the real app on SQLite and PostgreSQL: a job moved off a
failed node goes to the safe spare, not the one that faulted twice this week, and the incident says why —
the features that mattered — and what the best-fit shadow would have done."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from fastapi.testclient import TestClient

from sentinel.db import transaction
from tests.conftest import FakeClock, bearer
from tests.factories import registration
from tests.policy.conftest import incident
from tests.policy.hazard_models import hazard_model
from tests.remediation.conftest import rt, timeline, xid


@pytest.fixture
def overrides(tmp_path: Path) -> dict[str, Any]:
    path = tmp_path / "learned.json"
    hazard_model().save(path)
    return {"placement_policy": "learned", "placement_shadow": "best-fit", "learned_policy_path": path}


def test_the_incident_explains_the_learned_placement(client: TestClient, fleet: dict[str, Any], admin_token: str,
                                                     clock: FakeClock) -> None:
    assert {s["node"] for s in fleet["placement"]} == {"node-a"}
    assert client.post("/api/v1/nodes/register", json=registration("node-c", 2, 1.0),
                       headers=fleet["agent"]).status_code == 200
    with transaction(rt(client).factory) as session:  # node-b faulted twice this week
        session.add_all([incident("node-b", days_ago=3, out_days=1, now=clock.time(), detector="heartbeat"),
                         incident("node-b", days_ago=2, out_days=1.5, now=clock.time(), detector="heartbeat")])
    xid(client, fleet, 79, "SIM-node-a-1", clock)  # node-a falls off the bus: drained, the job moves

    [order] = client.get(f"/api/v1/jobs/{fleet['job']}/orders", headers=fleet["launcher"]).json()
    assert {s["node"] for s in order["placement"]} == {"node-c"}, "best fit would have taken node-b (by name)"
    text = timeline(client, admin_token)
    assert "placement (learned): ranks 0, 1 → node-c (risk 0.02: log_days_since_fault=5.9); avoided node-b " \
           "(risk 0.98: faults_7d=2, faults_30d=2)" in text, text
    assert "shadow best-fit would have placed ranks 0, 1 → node-b (risk 0.98); learned placed ranks 0, 1 → node-c" \
        in text

    decisions = client.get("/api/v1/policy/decisions", params={"kind": "placement"},
                           headers=bearer(admin_token)).json()
    moved, first = decisions
    assert first["incident_id"] is None and first["job_id"] == fleet["job"], "the first placement, by the API"
    assert moved["incident_id"] is not None and (moved["active_policy"], moved["shadow_policy"], moved["agree"]) == \
        ("learned", "best-fit", False)
    assert moved["explanation"]["active"]["avoided"]["node"] == "node-b"
