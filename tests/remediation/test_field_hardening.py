"""Wrong actions the field complains about, through the real app on SQLite and PostgreSQL: application-XID
storms that must drain nothing, restart storms that must stop, a breaker that must block only taking
capacity away, and late events that must not be acted on."""

from __future__ import annotations

from typing import Any

import pytest
from fastapi.testclient import TestClient

from tests.conftest import FakeClock, bearer
from tests.factories import report
from tests.remediation.conftest import health, rt, settle, xid


def post(client: TestClient, fleet: dict[str, Any], node: str, **fields: Any) -> None:
    fleet["seq"][0] += 1
    body = report(node=node, seq=fleet["seq"][0], interval=1.0)
    body.update(fields)
    assert client.post(f"/api/v1/nodes/{node}/reports", json=body, headers=fleet["agent"]).status_code == 200
    settle(client)


def fail(client: TestClient, fleet: dict[str, Any], rank: int, pid: int, clock: FakeClock) -> None:
    node = fleet["placement"][0]["node"]
    post(client, fleet, node, task_exits=[{"job_id": fleet["job"], "rank": rank, "pid": pid, "exit_code": 1,
                                           "observed_at": clock.time()}])


def orders(client: TestClient, fleet: dict[str, Any]) -> list[dict[str, Any]]:
    return client.get(f"/api/v1/jobs/{fleet['job']}/orders", params={"state": "all"}, headers=fleet["launcher"]).json()


def carry_out(client: TestClient, fleet: dict[str, Any], order: dict[str, Any]) -> None:
    """The launcher's part: acknowledge, start the attempt, register its tasks (pids 1000·attempt + rank)."""
    client.post(f"/api/v1/orders/{order['id']}/ack", json={"status": "done"}, headers=fleet["launcher"])
    for slot in order["placement"]:
        assert client.post(f"/api/v1/jobs/{fleet['job']}/tasks", headers=fleet["launcher"], json={
            "rank": slot["rank"], "node": slot["node"], "accelerators": slot["accelerators"],
            "pid": 1000 * (order["attempt"] + 1) + slot["rank"], "attempt": order["attempt"]}).status_code == 201


def incidents(client: TestClient, token: str, **params: Any) -> list[dict[str, Any]]:
    return client.get("/api/v1/incidents", params={"state": "all", **params},
                      headers=bearer(token)).json()["incidents"]


def actions(client: TestClient, token: str, incident_id: int) -> str:
    return "\n".join(a["text"] for a in client.get(f"/api/v1/incidents/{incident_id}",
                                                   headers=bearer(token)).json()["actions"])


# -- storms drain nothing ------------------------------------------------------------------------------------

def test_an_application_xid_storm_is_one_job_incident_that_restarts_and_drains_nothing(client, fleet, admin_token,
                                                                                      clock):
    node = fleet["placement"][0]["node"]
    uuids = [u for slot in fleet["placement"] for u in slot["accelerators"]]
    events = [{"kind": "xid", "accelerator_uuid": u, "xid": code, "observed_at": clock.time(), "count": 40}
              for u in uuids for code in (13, 43)]
    post(client, fleet, node, events=events[:2])
    post(client, fleet, node, events=events[2:])
    found = incidents(client, admin_token, detector="hardware")
    assert len(found) == 1, [i["title"] for i in found]
    [incident] = found
    assert incident["job_id"] == fleet["job"] and incident["layer"] == "software"
    assert incident["occurrences"] == 40 * len(events), "each event's count adds up"
    assert f"{len(uuids)} accelerator(s)" in incident["title"]
    assert set(health(client, admin_token).values()) == {"healthy"}, "no accelerator quarantined"
    states = {n["name"]: n["admin_state"] for n in client.get("/api/v1/nodes", headers=bearer(admin_token)).json()}
    assert set(states.values()) == {"active"}, f"no node drained: {states}"
    assert len(orders(client, fleet)) == 1, "the job restarts once"


# -- restart storms stop -------------------------------------------------------------------------------------

@pytest.mark.parametrize("overrides", [{"restart_storm_restarts": 2}])
def test_a_restart_storm_opens_one_critical_incident_and_holds_restarts_until_a_person_resolves_it(
        client, fleet, admin_token, clock, overrides):
    fail(client, fleet, 0, 1000, clock)  # attempt 0 fails: restart 1
    [first] = orders(client, fleet)
    carry_out(client, fleet, first)
    fail(client, fleet, 0, 2000, clock)  # attempt 1 fails: restart 2
    assert len(orders(client, fleet)) == 2
    carry_out(client, fleet, orders(client, fleet)[-1])
    fail(client, fleet, 0, 3000, clock)  # attempt 2 fails: 2 restarts in 30 min already, a storm
    assert len(orders(client, fleet)) == 2, "no third restart"
    [storm] = incidents(client, admin_token, detector="remediation")
    assert storm["severity"] == "critical" and storm["latched"] and storm["job_id"] == fleet["job"]
    assert "restarted 2 times in the last 30 min" in storm["seen"]
    assert "automatic restarts" in storm["title"]

    clock.advance(7200)  # the counts have aged out; the hold has not
    fail(client, fleet, 1, 3001, clock)
    assert len(orders(client, fleet)) == 2, "held while the storm incident is open"
    [failure] = [i for i in incidents(client, admin_token, detector="task_exit") if i["state"] != "resolved"]
    assert f"held by restart-storm incident #{storm['id']}" in actions(client, admin_token, failure["id"])
    assert len(incidents(client, admin_token, detector="remediation")) == 1, "one storm incident, not one per failure"

    operator = bearer(admin_token)
    assert client.post(f"/api/v1/incidents/{storm['id']}/resolve", json={"note": "fixed the data loader"},
                       headers=operator).status_code == 200
    uuid = orders(client, fleet)[-1]["placement"][0]["accelerators"][0]
    assert client.post(f"/api/v1/accelerators/{uuid}/quarantine", json={"reason": "suspect"},
                       headers=operator).status_code == 200  # moving the job off it is a restart too
    assert len(orders(client, fleet)) == 3, "a person resolved it: restarts resume"


# -- the breaker blocks only taking capacity away -------------------------------------------------------------

@pytest.mark.parametrize("overrides", [{"breaker_min_accelerators": 0}])
def test_an_open_breaker_still_restarts_jobs_uncordons_and_releases(client, fleet, admin_token, make_token, clock,
                                                                   overrides):
    operator = bearer(make_token("operator"))
    xid(client, fleet, 79, fleet["placement"][0]["accelerators"][0], clock)  # trips: 2 of 4 > 10 %
    assert client.get("/api/v1/breaker", headers=operator).json()["open"]
    assert orders(client, fleet) == []

    fail(client, fleet, 1, 1001, clock)  # a task failure while it is open: the job restarts in place
    [order] = orders(client, fleet)
    assert order["attempt"] == 1
    results = {(r["action"], r["result"]) for r in client.get("/api/v1/remediations", headers=operator).json()}
    assert ("restart_job", "done") in results and ("quarantine_accelerator", "blocked") in results

    assert client.post("/api/v1/nodes/node-b/cordon", json={"reason": "test"}, headers=operator).status_code == 200
    assert client.post("/api/v1/nodes/node-b/uncordon", json={"reason": "test"}, headers=operator).status_code == 200
    uuid = fleet["placement"][0]["accelerators"][0]
    assert client.post(f"/api/v1/accelerators/{uuid}/quarantine", json={"reason": "by hand"},
                       headers=operator).status_code == 200
    assert client.post(f"/api/v1/accelerators/{uuid}/release", json={"reason": "repaired"},
                       headers=operator).status_code == 200
    assert health(client, admin_token)[uuid] == "healthy"
    assert client.get("/api/v1/breaker", headers=operator).json()["open"], "none of it closed the breaker"


@pytest.mark.parametrize("overrides", [{"breaker_min_accelerators": 0}])
def test_a_breaker_reset_replays_nothing(client, fleet, admin_token, make_token, clock, overrides):
    operator = bearer(make_token("operator"))
    xid(client, fleet, 79, fleet["placement"][0]["accelerators"][0], clock)
    xid(client, fleet, 48, fleet["placement"][1]["accelerators"][0], clock)
    assert client.post("/api/v1/breaker/reset", json={"reason": "understood"}, headers=operator).status_code == 200
    settle(client)
    assert set(health(client, admin_token).values()) == {"healthy"}, "the events blocked while open stay blocked"
    assert orders(client, fleet) == []


def test_an_event_older_than_the_breaker_window_is_not_acted_on(client, fleet, admin_token, clock, settings):
    uuid = fleet["placement"][0]["accelerators"][0]
    node = fleet["placement"][0]["node"]
    late = clock.time() - settings.breaker_window_seconds - 600  # an agent's spool, replayed after a partition
    post(client, fleet, node, events=[{"kind": "xid", "accelerator_uuid": uuid, "xid": 79, "observed_at": late}])
    [incident] = incidents(client, admin_token, detector="hardware")
    assert incident["severity"] == "critical"
    assert "not acted on automatically" in actions(client, admin_token, incident["id"])
    assert set(health(client, admin_token).values()) == {"healthy"} and orders(client, fleet) == []


# -- telemetry for a rank comes from the node it runs on ----------------------------------------------------

def test_task_telemetry_from_another_node_than_the_ranks_is_dropped_and_counted(client, fleet, clock):
    home = fleet["placement"][0]["node"]
    other = "node-b" if home == "node-a" else "node-a"

    def telemetry(tokens: int) -> list[dict[str, Any]]:
        return [{"job_id": fleet["job"], "rank": 0, "pid": 1000, "steps": 10, "last_step": 10, "tokens": tokens,
                 "step_seconds": [0.1] * 10, "busy_seconds": 1.0}]

    post(client, fleet, other, tasks=telemetry(10**9))  # a process on the wrong node claiming rank 0
    stats = rt(client).live.jobs.find(fleet["job"])
    assert stats is None or 0 not in stats.ranks, "nothing of it reached the job's view"
    assert "sentinel_ingest_dropped_total{reason=\"task_elsewhere\"} 1.0" in client.get("/metrics").text
    post(client, fleet, home, tasks=telemetry(4096))  # the rank itself, from its node
    stats = rt(client).live.jobs.find(fleet["job"])
    assert stats is not None and stats.ranks[0].node == home
