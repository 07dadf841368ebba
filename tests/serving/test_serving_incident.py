"""A decode replica frozen mid-stream, through the real app: its reports say requests are in flight and no token
came for 20 s; the serving stall detector opens one incident naming the job, the stage and the replica, with
what was seen, and remediation orders the replica replaced (a serving job's restart_task)."""

from __future__ import annotations

import time

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
    assert "3 requests in flight, none past its first token, no token for 20.0 s" in detail["seen"]
    orders = client.get(f"/api/v1/jobs/{job.job}/orders", headers=job.launcher).json()
    assert [o["kind"] for o in orders] == ["replace_replica"], orders


def test_streams_frozen_mid_answer_are_judged_at_the_report_not_at_the_next_turn(job, client):
    """No call to evaluate: the report that shows streams mid-answer silent past mid_stream_seconds (3 s) has the
    detector run at once; a shorter silence waits for its turn."""
    job.requests(1, 20, ttft=0.3, tpot=0.03)
    job.round()
    runtime = rt(client)
    stall = runtime.detection.detectors["serving_stall"]
    job.clock.advance(2.0)
    job.report(1, {"running": 3, "streaming": 3, "oldest_inflight_seconds": 2.5,
                   "last_token_at": job.clock.time() - 2.0})
    assert not stall.points, "2 s without a token is not judged early"
    job.clock.advance(1.0)
    job.report(1, {"running": 3, "streaming": 3, "oldest_inflight_seconds": 5.5,
                   "last_token_at": job.clock.time() - 5.0})
    deadline = time.monotonic() + 10.0
    while time.monotonic() < deadline and not client.get(
            "/api/v1/incidents", params={"detector": "serving_stall"}, headers=job.viewer).json()["incidents"]:
        time.sleep(0.05)
    [found] = client.get("/api/v1/incidents", params={"detector": "serving_stall"},
                         headers=job.viewer).json()["incidents"]
    detail = client.get(f"/api/v1/incidents/{found['id']}", headers=job.viewer).json()
    assert "3 requests in flight, 3 of them mid-stream, no token for 5.0 s" in detail["seen"]


def test_a_late_frozen_report_of_the_replaced_replica_opens_no_second_incident(job, client):
    """CI's serving demo, under load: the replaced replica's last frozen report arrived after the order was done
    and before its replacement's first report; the incident had resolved, so that report opened a second one
    and the healthy replacement was replaced. The launcher's done retires the replaced replica."""
    job.requests(1, 20, ttft=0.3, tpot=0.03)
    job.round()
    runtime = rt(client)

    def frozen() -> None:
        job.clock.advance(2.0)
        job.report(1, {"running": 3, "streaming": 3, "oldest_inflight_seconds": 21.0,
                       "last_token_at": job.clock.time() - 20.0})

    frozen()
    runtime.detection.evaluate("serving_stall")
    settle(client)
    [order] = client.get(f"/api/v1/jobs/{job.job}/orders", headers=job.launcher).json()
    for status in ("acknowledged", "done"):
        answer = client.post(f"/api/v1/orders/{order['id']}/ack", json={"status": status, "detail": "d1 → d1.a1"},
                             headers=job.launcher)
        assert answer.status_code == 200, answer.text
    runtime.remediation.tick()
    [first] = client.get("/api/v1/incidents", params={"detector": "serving_stall", "state": "resolved"},
                         headers=job.viewer).json()["incidents"]
    assert [r["replica"] for r in job.serving()["replicas"]] == ["p0"], "the replaced d1 speaks for no one"
    frozen()  # its last report, sent before its stop, arriving late
    runtime.detection.evaluate("serving_stall")
    settle(client)
    incidents = client.get("/api/v1/incidents", params={"detector": "serving_stall", "state": "all"},
                           headers=job.viewer).json()["incidents"]
    assert [i["id"] for i in incidents] == [first["id"]], "no second incident"
    assert len(client.get(f"/api/v1/jobs/{job.job}/orders", params={"state": "all"},
                          headers=job.launcher).json()) == 1
    job.clock.advance(2.0)
    job.report(1, {"replica": "d1.a1", "running": 1, "last_token_at": job.clock.time() - 0.1})
    assert sorted(r["replica"] for r in job.serving()["replicas"]) == ["d1.a1", "p0"], "the replacement does"
