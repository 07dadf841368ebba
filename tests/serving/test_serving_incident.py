"""A decode replica frozen mid-stream, through the real app: its reports say requests are in flight and no token
came for 20 s; the serving stall detector opens one incident naming the job, the stage and the replica, with
what was seen, and remediation orders the replica replaced (a serving job's restart_task)."""

from __future__ import annotations

import pytest

from tests.remediation.conftest import rt, settle
from tests.serving.driver import ServingDriver


@pytest.fixture
def job(client, make_token, clock) -> ServingDriver:  # type: ignore[no-untyped-def]
    return ServingDriver(client, make_token, clock)


def test_a_frozen_decode_replica_opens_an_incident_and_is_replaced(job, client):
    job.requests(1, 20, ttft=0.3, tpot=0.03)
    job.round()
    runtime = rt(client)
    runtime.detection.evaluate("serving_stall")
    settle(client)
    assert client.get("/api/v1/incidents", params={"detector": "serving_stall"},
                      headers=job.viewer).json()["incidents"] == [], "tokens flowing: healthy"
    for _ in range(3):
        job.clock.advance(2.0)
        job.report(1, {"running": 3, "oldest_inflight_seconds": 21.0, "last_token_at": job.clock.time() - 20.0})
    runtime.detection.evaluate("serving_stall")
    settle(client)
    [found] = client.get("/api/v1/incidents", params={"detector": "serving_stall"},
                         headers=job.viewer).json()["incidents"]
    assert "decode replica d1" in found["title"] and found["job_id"] == job.job
    detail = client.get(f"/api/v1/incidents/{found['id']}", headers=job.viewer).json()
    assert "3 requests in flight, no token for 20 s" in detail["seen"]
    orders = client.get(f"/api/v1/jobs/{job.job}/orders", headers=job.launcher).json()
    assert [o["kind"] for o in orders] == ["replace_replica"], orders
