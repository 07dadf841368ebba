"""The policy routes through the real app, on SQLite and PostgreSQL: recorded decisions and the shadow summary,
for any token with read access, 401 without one, 422 for bad arguments."""

from __future__ import annotations

from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
from fastapi.testclient import TestClient

from sentinel.clock import to_datetime
from sentinel.config import Settings
from sentinel.db import transaction
from sentinel.policy.scheduled import flush_decisions, prune_decisions
from sentinel.runtime import Runtime
from tests.conftest import bearer
from tests.factories import registration
from tests.policy.conftest import incident
from tests.policy.hazard_models import hazard_model


@pytest.fixture
def settings(tmp_path: Path, database_url: str) -> Settings:
    path = tmp_path / "learned.json"
    hazard_model().save(path)
    return Settings(data_dir=tmp_path / "data", database_url=database_url, placement_shadow="learned",
                    checkpoint_interval_policy="learned", learned_policy_path=path)


def runtime(client: TestClient) -> Runtime:
    found: Runtime = client.app.state.runtime  # type: ignore[attr-defined]
    return found


@pytest.fixture
def decided(client: TestClient, make_token, clock) -> dict[str, Any]:  # type: ignore[no-untyped-def]
    """Three nodes, node-a with two recent faults; a 2-rank job placed (best-fit: node-a, the learned shadow:
    node-b) and its detail read (a learned checkpoint interval, recorded by the periodic flush)."""
    agent, launcher = bearer(make_token("agent")), bearer(make_token("launcher"))
    for name in ("node-a", "node-b", "node-c"):
        assert client.post("/api/v1/nodes/register", json=registration(name, 2), headers=agent).status_code == 200
    with transaction(runtime(client).factory) as session:
        session.add_all([incident("node-a", days_ago=3, out_days=1, now=clock.time()),
                         incident("node-a", days_ago=2, out_days=1.5, detector="heartbeat", now=clock.time())])
    job = client.post("/api/v1/jobs", json={"name": "llm", "world_size": 2}, headers=launcher).json()["id"]
    placed = client.post(f"/api/v1/jobs/{job}/placement", json={}, headers=launcher)
    assert placed.status_code == 200 and {s["node"] for s in placed.json()} == {"node-a"}, placed.text
    detail = client.get(f"/api/v1/jobs/{job}", headers=launcher).json()["checkpoints"]
    assert detail["interval_policy"] == "learned" and detail["interval_recommended_seconds"] is None
    assert flush_decisions(runtime(client).factory, runtime(client).policies.pending) == 1
    return {"job": job, "viewer": bearer(make_token("viewer"))}


def test_decisions_are_listed_for_a_viewer(client: TestClient, decided: dict[str, Any]) -> None:
    rows = client.get("/api/v1/policy/decisions", headers=decided["viewer"])
    assert rows.status_code == 200, rows.text
    interval, placement = rows.json()
    assert (interval["kind"], interval["active_policy"], interval["shadow_policy"], interval["agree"]) == \
        ("checkpoint_interval", "learned", "", None)
    assert interval["active_choice"] == {"interval_seconds": None}
    assert (placement["kind"], placement["job_id"], placement["incident_id"], placement["active_policy"],
            placement["shadow_policy"], placement["agree"]) == ("placement", decided["job"], None, "best-fit",
                                                                "learned", False)
    assert {s["node"] for s in placement["shadow_choice"]["ranks"].values()} == {"node-b"}
    assert placement["explanation"]["shadow"]["avoided"]["node"] == "node-a"
    only = client.get("/api/v1/policy/decisions", params={"kind": "placement", "job": decided["job"], "limit": 5},
                      headers=decided["viewer"]).json()
    assert [d["id"] for d in only] == [placement["id"]]
    assert client.get("/api/v1/policy/decisions", params={"job": decided["job"] + 1},
                      headers=decided["viewer"]).json() == []


def test_the_shadow_summary_compares_per_kind(client: TestClient, decided: dict[str, Any]) -> None:
    summary = client.get("/api/v1/policy/shadow", headers=decided["viewer"])
    assert summary.status_code == 200, summary.text
    placement, interval = summary.json()
    assert {k: placement[k] for k in ("kind", "active_policy", "shadow_policy", "decisions", "agreements",
                                      "agreement_ratio")} == \
        {"kind": "placement", "active_policy": "best-fit", "shadow_policy": "learned", "decisions": 1,
         "agreements": 0, "agreement_ratio": 0.0}
    assert placement["last_at"] is not None
    assert (interval["active_policy"], interval["shadow_policy"], interval["decisions"],
            interval["agreement_ratio"]) == ("learned", "", 1, None)


def test_the_shadow_summary_says_whose_nodes_went_on_to_fault(client: TestClient, decided: dict[str, Any],
                                                              clock) -> None:  # type: ignore[no-untyped-def]
    """best-fit placed the job on node-a, the learned shadow would have used node-b: node-a faults 2 days later
    (counted), node-b 9 days later (past the 7-day window: not counted), node-c (chosen by neither) too."""
    decision_at = clock.time()
    clock.advance(10 * 86400)
    with transaction(runtime(client).factory) as session:
        session.add_all([incident("node-a", days_ago=8, now=clock.time()),
                         incident("node-a", days_ago=7.5, now=clock.time()),  # the same node again: one node
                         incident("node-b", days_ago=1, now=clock.time()),
                         incident("node-c", days_ago=8, now=clock.time()),
                         incident("node-b", days_ago=9, severity="warning", now=clock.time())])  # not a fault
    assert clock.time() - decision_at == 10 * 86400
    placement, interval = client.get("/api/v1/policy/shadow", headers=decided["viewer"]).json()
    assert placement["outcome"] == {"window_days": 7.0, "disagreements": 1, "active_nodes": 1, "active_faulted": 1,
                                    "shadow_nodes": 1, "shadow_faulted": 0}
    assert interval["outcome"] is None, "not a placement, and no shadow"


def test_decisions_past_their_retention_are_pruned(client: TestClient, decided: dict[str, Any], clock) -> None:  # type: ignore[no-untyped-def]
    factory, now = runtime(client).factory, to_datetime(clock.time())
    assert prune_decisions(factory, now, retention_days=30) == 0, "both were recorded just now"
    assert prune_decisions(factory, now + timedelta(days=30, seconds=1), retention_days=30) == 2
    assert client.get("/api/v1/policy/decisions", headers=decided["viewer"]).json() == []


@pytest.mark.parametrize("path", ["/api/v1/policy/decisions", "/api/v1/policy/shadow"])
def test_a_token_is_needed(client: TestClient, path: str) -> None:
    assert client.get(path).status_code == 401
    assert client.get(path, headers=bearer("not-a-token")).status_code == 401


@pytest.mark.parametrize("params", [{"limit": 0}, {"limit": 1001}, {"kind": "degradation"}, {"job": 0},
                                    {"job": 2**31}, {"limit": "many"}])
def test_bad_arguments_are_422(client: TestClient, admin_token: str, params: dict[str, Any]) -> None:
    response = client.get("/api/v1/policy/decisions", params=params, headers=bearer(admin_token))
    assert response.status_code == 422, response.text


def test_the_routes_are_documented(client: TestClient) -> None:
    paths = client.get("/openapi.json").json()["paths"]
    for path, statuses in (("/api/v1/policy/decisions", {"200", "401", "403", "422", "429"}),
                           ("/api/v1/policy/shadow", {"200", "401", "403", "429"})):
        assert statuses <= paths[path]["get"]["responses"].keys(), path
        assert paths[path]["get"]["description"] and paths[path]["get"]["tags"] == ["policy"]
