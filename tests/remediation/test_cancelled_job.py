"""A job its launcher cancels (a stop signal, a scheduler's cancel): the exits that follow page no one and
restart nothing, and an order still pending for it is superseded. On SQLite and PostgreSQL."""

from __future__ import annotations

from typing import Any

from fastapi.testclient import TestClient

from tests.conftest import FakeClock, bearer
from tests.factories import report
from tests.remediation.conftest import settle


def exit_report(client: TestClient, fleet: dict[str, Any], rank: int, signal: int, clock: FakeClock) -> None:
    fleet["seq"][0] += 1
    body = report(node="node-a", seq=fleet["seq"][0], accelerators=0, interval=1.0)
    body["task_exits"] = [{"job_id": fleet["job"], "rank": rank, "pid": 1000 + rank, "signal": signal,
                           "observed_at": clock.time()}]
    assert client.post("/api/v1/nodes/node-a/reports", json=body, headers=fleet["agent"]).status_code == 200


def test_a_cancelled_job_s_exits_are_no_failure_and_its_pending_order_is_superseded(
        client: TestClient, fleet: dict[str, Any], make_token, clock: FakeClock) -> None:  # type: ignore[no-untyped-def]
    job_id, launcher = fleet["job"], fleet["launcher"]
    exit_report(client, fleet, 0, 9, clock)  # rank 0 killed: a failure, and a restart ordered
    settle(client)
    [pending] = client.get(f"/api/v1/jobs/{job_id}/orders", params={"state": "all"}, headers=launcher).json()
    assert pending["state"] == "pending"

    viewer = bearer(make_token("viewer"))
    assert client.post(f"/api/v1/jobs/{job_id}/finish", json={"state": "cancelled"}, headers=viewer).status_code == 403
    assert client.post(f"/api/v1/jobs/{job_id}/finish", json={"state": "failed"}, headers=launcher).status_code == 422
    assert client.post("/api/v1/jobs/999/finish", json={"state": "cancelled"}, headers=launcher).status_code == 404
    done = client.post(f"/api/v1/jobs/{job_id}/finish", headers=launcher,
                       json={"state": "cancelled", "reason": "SIGTERM to the launcher"})
    assert done.status_code == 200 and done.json()["state"] == "cancelled"
    again = client.post(f"/api/v1/jobs/{job_id}/finish", json={"state": "succeeded"}, headers=launcher)
    assert again.json()["state"] == "cancelled", "the first word stands"

    clock.advance(1)
    exit_report(client, fleet, 1, 15, clock)  # rank 1 stopped by the cancellation
    settle(client)
    tasks = {t["rank"]: t for t in client.get(f"/api/v1/jobs/{job_id}", headers=launcher).json()["tasks"]}
    assert (tasks[0]["state"], tasks[0]["failure_reason"]) == ("failed", "signal:SIGKILL"), "before: a failure"
    assert (tasks[1]["state"], tasks[1]["exit_signal"], tasks[1]["failure_reason"]) == ("exited", 15, "")
    orders = client.get(f"/api/v1/jobs/{job_id}/orders", params={"state": "all"}, headers=launcher).json()
    assert [(o["id"], o["state"]) for o in orders] == [(pending["id"], "superseded")]
    assert orders[0]["result"] == "the job was cancelled before its launcher took the order"
    incidents = client.get("/api/v1/incidents", params={"state": "all"}, headers=launcher).json()["incidents"]
    assert [i["occurrences"] for i in incidents if i["detector"] == "task_exit"] == [1], "the cancel paged no one"
    events = client.get("/api/v1/events", params={"kind": "job_cancelled"}, headers=launcher).json()
    [event] = [e["message"] for e in events]
    assert event.startswith(f"job {job_id} (llm) cancelled by launcher:")
    assert event.endswith(": SIGTERM to the launcher")
    exited = client.get("/api/v1/events", params={"kind": "task_exited"}, headers=launcher).json()
    assert [e["message"] for e in exited] == [f"job {job_id} rank 1 (pid 1001) killed by signal 15 (SIGTERM) (the "
                                              "job was cancelled)"]
