"""Incidents opened by the detectors through the real app, on SQLite and PostgreSQL: dedup by
fingerprint, dense feedback, ack/resolve, auto-resolve with hysteresis, fleet-wide collapse."""

from __future__ import annotations

from typing import Any

import pytest
from fastapi.testclient import TestClient
from prometheus_client.parser import text_string_to_metric_families

from sentinel.app import create_app
from sentinel.audit.service import list_entries
from sentinel.config import Settings
from sentinel.detection.base import Detector, Evaluation
from sentinel.incidents.findings import Finding, Subject
from sentinel.runtime import Runtime
from tests.conftest import FakeClock, bearer, stop_app
from tests.factories import registration, report


@pytest.fixture
def settings(tmp_path, database_url: str) -> Settings:  # type: ignore[no-untyped-def]
    return Settings(data_dir=tmp_path / "data", database_url=database_url, resolve_after_seconds=30.0,
                    metrics_require_token=False)


def rt(client: TestClient) -> Runtime:
    runtime: Runtime = client.app.state.runtime  # type: ignore[attr-defined]
    return runtime


def post(client: TestClient, agent: dict[str, str], body: dict[str, Any]) -> None:
    response = client.post(f"/api/v1/nodes/{body['node']}/reports", json=body, headers=agent)
    assert response.status_code == 200, response.text
    assert rt(client).detection.drain()


def incidents(client: TestClient, token: str, **params: Any) -> list[dict[str, Any]]:
    response = client.get("/api/v1/incidents", params=params, headers=bearer(token))
    assert response.status_code == 200, response.text
    return list(response.json()["incidents"])


def xid(code: int, uuid: str = "SIM-node-a-0", at: float = 1.8e9) -> dict[str, Any]:
    return {"kind": "xid", "accelerator_uuid": uuid, "xid": code, "message": f"XID {code}", "observed_at": at}


@pytest.fixture
def agent(client: TestClient, make_token) -> dict[str, str]:  # type: ignore[no-untyped-def]
    agent = bearer(make_token("agent"))
    assert client.post("/api/v1/nodes/register", json=registration("node-a", 2, interval=1.0),
                       headers=agent).status_code == 200
    return agent


def test_xid_79_opens_one_critical_incident_that_explains_itself(client, agent, admin_token, clock: FakeClock):
    post(client, agent, report(seq=1, events=[xid(79, at=clock.time() - 0.2)], interval=1.0))
    [one] = incidents(client, admin_token)
    assert (one["severity"], one["detector"], one["layer"], one["recommended_action"]) == \
        ("critical", "hardware", "hardware", "restart_node")
    assert one["node"] == "node-a" and one["accelerator_uuid"] == "SIM-node-a-0" and one["latched"]
    assert "XID 79 fell off the bus" in one["title"]
    assert one["detection_latency_seconds"] == pytest.approx(0.2, abs=0.05)
    detail = client.get(f"/api/v1/incidents/{one['id']}", headers=bearer(admin_token)).json()
    assert detail["evidence"]["event"]["xid"] == 79 and detail["evidence"]["event"]["seq"] == 1
    assert "earlier fault" in detail["comparison"]
    assert any("node-a" in step for step in detail["next_steps"])
    for heading in ("What was seen:", "Compared with:", "Points at:", "What Sentinel did:", "What to check next:"):
        assert heading in detail["text"]
    assert "recommended: take the node out of service" in detail["text"]

    post(client, agent, report(seq=2, events=[xid(79)], interval=1.0))
    [again] = incidents(client, admin_token)
    assert again["id"] == one["id"] and again["occurrences"] == 2, "same fingerprint: one incident"
    post(client, agent, report(seq=3, events=[xid(79, uuid="SIM-node-a-1")], interval=1.0))
    assert len(incidents(client, admin_token)) == 2, "another accelerator is another incident"


@pytest.mark.parametrize(("code", "severity", "action", "layer"), [
    (48, "critical", "reset_accelerator", "hardware"), (94, "warning", "restart_task", "hardware"),
    (13, "warning", "restart_task", "software"), (74, "critical", "reset_accelerator", "interconnect"),
    (999, "warning", "record", "hardware")])
def test_xid_buckets_follow_the_catalog(client, agent, admin_token, code, severity, action, layer):
    post(client, agent, report(seq=1, events=[xid(code)], interval=1.0))
    [one] = incidents(client, admin_token)
    assert (one["severity"], one["recommended_action"], one["layer"]) == (severity, action, layer)


def test_informational_xids_are_events_not_incidents(client, agent, admin_token):
    post(client, agent, report(seq=1, events=[xid(63), xid(92)], interval=1.0))
    assert incidents(client, admin_token) == []
    events = client.get("/api/v1/events", headers=bearer(admin_token)).json()
    assert {e["data"].get("xid") for e in events if e["kind"] == "xid"} == {63, 92}


def test_ack_resolve_and_their_errors(client, agent, admin_token, make_token):
    post(client, agent, report(seq=1, events=[xid(48)], interval=1.0))
    [one] = incidents(client, admin_token)
    viewer, operator = bearer(make_token("viewer")), bearer(make_token("operator", "alice"))
    assert client.post(f"/api/v1/incidents/{one['id']}/ack", headers=viewer).status_code == 403
    acked = client.post(f"/api/v1/incidents/{one['id']}/ack", json={"note": "looking"}, headers=operator)
    assert acked.status_code == 200 and acked.json()["state"] == "acknowledged"
    assert acked.json()["acknowledged_by"] == "operator:alice"
    assert client.post(f"/api/v1/incidents/{one['id']}/ack", headers=operator).json()["state"] == "acknowledged"
    resolved = client.post(f"/api/v1/incidents/{one['id']}/resolve", json={"note": "GPU reseated"}, headers=operator)
    assert resolved.json()["state"] == "resolved" and resolved.json()["resolve_reason"] == "GPU reseated"
    late = client.post(f"/api/v1/incidents/{one['id']}/ack", headers=operator)
    assert late.status_code == 409 and "already resolved" in late.json()["detail"]
    assert client.post("/api/v1/incidents/999999/resolve", headers=operator).status_code == 404
    assert client.get("/api/v1/incidents/999999", headers=viewer).status_code == 404
    assert incidents(client, admin_token) == []
    assert [i["id"] for i in incidents(client, admin_token, state="resolved")] == [one["id"]]
    with rt(client).factory() as session:
        audit = [(a.actor, a.action) for a in list_entries(session, subject=f"incident/{one['id']}")]
    assert ("operator:alice", "incident.ack") in audit and ("operator:alice", "incident.resolve") in audit
    # the same fault after a resolve is a new incident
    post(client, agent, report(seq=2, events=[xid(48)], interval=1.0))
    assert incidents(client, admin_token)[0]["id"] != one["id"]


def test_open_incidents_and_detection_latency_are_metrics(client, agent, admin_token, clock: FakeClock):
    post(client, agent, report(seq=1, events=[xid(79, at=clock.time() - 0.3)], interval=1.0))
    text = client.get("/metrics").text
    families = {f.name: f for f in text_string_to_metric_families(text)}
    open_by = {s.labels["severity"]: s.value for s in families["sentinel_incidents_open"].samples}
    assert open_by["critical"] == 1 and open_by["warning"] == 0
    count = [s for s in families["sentinel_detection_latency_seconds"].samples
             if s.name.endswith("_count") and s.labels["detector"] == "hardware"]
    assert count and count[0].value == 1


def test_heartbeat_loss_opens_an_incident_and_it_resolves_after_hysteresis(client, agent, admin_token,
                                                                         clock: FakeClock):
    post(client, agent, report(seq=1, interval=1.0))
    clock.advance(3.5)
    rt(client).check_liveness()
    [one] = incidents(client, admin_token)
    assert (one["detector"], one["node"], one["severity"]) == ("heartbeat", "node-a", "warning")
    assert "3.5 of its 1s intervals" in one["seen"]
    assert one["detection_latency_seconds"] == pytest.approx(2.5, abs=0.01), "from the first missed report"
    post(client, agent, report(seq=2, interval=1.0))
    rt(client).detection.evaluate()
    clock.advance(20)
    rt(client).detection.evaluate()
    assert incidents(client, admin_token)[0]["state"] == "open", "clear for 20 s < 30 s of hysteresis"
    clock.advance(11)
    rt(client).detection.evaluate()
    assert incidents(client, admin_token) == []
    [done] = incidents(client, admin_token, state="resolved")
    assert done["resolved_by"] == "sentinel" and "auto-resolved" in done["resolve_reason"]


def test_an_agent_that_said_goodbye_is_down_without_an_incident_and_its_next_report_brings_it_back(
        client, agent, admin_token, clock: FakeClock):  # type: ignore[no-untyped-def]
    post(client, agent, report(seq=1, interval=1.0))
    post(client, agent, {**report(seq=2, interval=1.0), "leaving": True})  # systemctl stop: its last report
    clock.advance(3.5)
    rt(client).check_liveness()
    rt(client).detection.evaluate()
    assert incidents(client, admin_token, state="all") == [], "a stop on purpose pages no one"
    node = client.get("/api/v1/nodes/node-a", headers=bearer(admin_token)).json()
    assert node["state"] == "down" and node["state_reason"].startswith("its agent stopped on purpose (its last "
                                                                       "report, seq 2, said so)")
    [down] = client.get("/api/v1/events", params={"kind": "node_down"}, headers=bearer(admin_token)).json()
    assert down["severity"] == "info"
    post(client, agent, report(seq=3, interval=1.0))  # started again
    assert client.get("/api/v1/nodes/node-a", headers=bearer(admin_token)).json()["state"] == "active"
    clock.advance(3.5)  # and now it goes silent without a word: that is heartbeat loss again
    rt(client).check_liveness()
    rt(client).detection.evaluate()
    assert [i["detector"] for i in incidents(client, admin_token)] == ["heartbeat"]


def test_a_partition_is_one_fleet_wide_incident_not_one_per_node(client, make_token, admin_token, clock):
    agent = bearer(make_token("agent"))
    for i in range(8):
        client.post("/api/v1/nodes/register", json=registration(f"n{i}", 1, interval=1.0), headers=agent)
    for i in range(8):
        post(client, agent, report(node=f"n{i}", seq=1, accelerators=1, interval=1.0))
    clock.advance(2.0)
    for i in range(4):  # half keep reporting
        post(client, agent, report(node=f"n{i}", seq=2, accelerators=1, interval=1.0))
    clock.advance(2.0)
    for i in range(4):
        post(client, agent, report(node=f"n{i}", seq=3, accelerators=1, interval=1.0))
    rt(client).check_liveness()
    rt(client).detection.evaluate()
    [one] = incidents(client, admin_token)
    assert one["detector"] == "heartbeat" and one["node"] is None and one["severity"] == "critical"
    assert "4 of 8 nodes stopped reporting at once" in one["title"] and one["layer"] == "interconnect"


def test_a_task_exit_opens_one_incident_per_job_and_resolves_when_it_steps_again(client, agent, admin_token,
                                                                                 make_token, clock: FakeClock):
    launcher = bearer(make_token("launcher"))
    job_id = client.post("/api/v1/jobs", json={"name": "llm", "world_size": 2}, headers=launcher).json()["id"]
    for rank in range(2):
        body = {"rank": rank, "node": "node-a", "accelerators": [f"SIM-node-a-{rank}"], "pid": 1000 + rank}
        assert client.post(f"/api/v1/jobs/{job_id}/tasks", json=body, headers=launcher).status_code == 201
    # a broken collective: both ranks end within the same second, before any restart is ordered (an exit
    # after the order is of an attempt being replaced, expected and not judged)
    body = report(seq=1, interval=1.0)
    body["task_exits"] = [{"job_id": job_id, "rank": 0, "pid": 1000, "signal": 9, "observed_at": clock.time()},
                          {"job_id": job_id, "rank": 1, "pid": 1001, "exit_code": 1, "observed_at": clock.time()}]
    post(client, agent, body)
    [one] = incidents(client, admin_token)
    assert (one["detector"], one["job_id"], one["occurrences"]) == ("task_exit", job_id, 2)
    assert one["layer"] == "software"
    detail = client.get(f"/api/v1/incidents/{one['id']}", headers=bearer(admin_token)).json()
    assert "OOM killer" in detail["text"] or "exited with code 1" in detail["text"]

    # restarted: a new attempt steps
    clock.advance(5)
    body = report(seq=3, interval=1.0)
    body["tasks"] = [{"job_id": job_id, "rank": r, "attempt": 1, "pid": 2000 + r, "steps": 3, "last_step": 3,
                      "step_seconds": [0.1] * 3, "tokens": 30, "busy_seconds": 0.3} for r in range(2)]
    post(client, agent, body)
    rt(client).detection.evaluate()
    clock.advance(31)
    rt(client).detection.evaluate()
    assert incidents(client, admin_token) == []


def test_a_task_exit_right_after_an_xid_points_at_the_hardware(client, agent, admin_token, make_token, clock):
    launcher = bearer(make_token("launcher"))
    job_id = client.post("/api/v1/jobs", json={"name": "llm", "world_size": 1}, headers=launcher).json()["id"]
    client.post(f"/api/v1/jobs/{job_id}/tasks", json={"rank": 0, "node": "node-a", "accelerators": ["SIM-node-a-0"],
                                                       "pid": 1000}, headers=launcher)
    post(client, agent, report(seq=1, events=[xid(79, at=clock.time())], interval=1.0))
    body = report(seq=2, interval=1.0)
    body["task_exits"] = [{"job_id": job_id, "rank": 0, "pid": 1000, "signal": 6, "observed_at": clock.time() + 0.4}]
    post(client, agent, body)
    exit_incident = incidents(client, admin_token, detector="task_exit")[0]
    assert exit_incident["layer"] == "hardware" and "xid 79" in exit_incident["seen"]
    xid_incident = incidents(client, admin_token, detector="hardware")[0]
    assert (xid_incident["job_id"], xid_incident["rank"]) == (job_id, 0), "the XID names the task it hit"


def test_a_rank_that_stops_stepping_while_alive_is_hung(client, agent, admin_token, make_token, clock: FakeClock):
    launcher = bearer(make_token("launcher"))
    job_id = client.post("/api/v1/jobs", json={"name": "llm", "world_size": 2}, headers=launcher).json()["id"]
    for rank in range(2):
        client.post(f"/api/v1/jobs/{job_id}/tasks", json={"rank": rank, "node": "node-a",
                                                           "accelerators": [f"SIM-node-a-{rank}"], "pid": 1000 + rank},
                    headers=launcher)
    seq = 0
    for step in range(10):  # 10 intervals of 1 s, 10 steps of 0.1 s each
        seq += 1
        body = report(seq=seq, interval=1.0)
        body["tasks"] = [{"job_id": job_id, "rank": r, "pid": 1000 + r, "steps": 10, "last_step": 10 * (step + 1),
                          "step_seconds": [0.1] * 10, "tokens": 100, "busy_seconds": 1.0} for r in range(2)]
        post(client, agent, body)
        clock.advance(1.0)
    rt(client).detection.evaluate()
    assert incidents(client, admin_token) == [], "stepping normally"
    for _ in range(1):  # rank 1 stops at once; rank 0 one interval later (blocked in the collective)
        seq += 1
        body = report(seq=seq, interval=1.0)
        if seq == 11:
            body["tasks"] = [{"job_id": job_id, "rank": 0, "pid": 1000, "steps": 5, "last_step": 105,
                              "step_seconds": [0.1] * 5, "tokens": 50, "busy_seconds": 0.5}]
        post(client, agent, body)
        clock.advance(1.0)
    rt(client).detection.evaluate()
    # the limit is the rank's own cadence (10 × 0.1 s) but no less than the data's freshness: 1.25 report
    # intervals + the SDK's 1 s flush = 2.25 s (detectors/hang.py; it was a fixed 5 s floor)
    assert incidents(client, admin_token) == [], "2 s without progress < its 2.25 s limit"
    for _ in range(3):
        seq += 1
        post(client, agent, report(seq=seq, interval=1.0))
        clock.advance(1.0)
    rt(client).detection.evaluate()
    [one] = incidents(client, admin_token)
    assert (one["detector"], one["job_id"], one["rank"], one["severity"]) == ("hang", job_id, 1, "critical")
    assert "2 of 2 ranks stalled; rank 1 stopped first" in one["seen"]

    # a rank whose process exited is not hung: the job's incident clears once no live rank is stalled
    body = report(seq=seq + 1, interval=1.0)
    body["task_exits"] = [{"job_id": job_id, "rank": r, "pid": 1000 + r, "exit_code": 0, "observed_at": clock.time()}
                          for r in range(2)]
    post(client, agent, body)
    rt(client).detection.evaluate()
    clock.advance(31)
    rt(client).detection.evaluate()
    assert incidents(client, admin_token, detector="hang") == []


def test_incidents_survive_a_restart_without_duplicates(settings, clock, client, agent, admin_token):
    post(client, agent, report(seq=1, events=[xid(95)], interval=1.0))
    [before] = incidents(client, admin_token)
    stop_app(client)
    with TestClient(create_app(settings, clock, run_scheduler=False)) as again:
        again.post("/api/v1/nodes/node-a/reports", json=report(seq=2, events=[xid(95)], interval=1.0),
                   headers=agent)
        rt(again).detection.drain()
        [after] = incidents(again, admin_token)
    assert after["id"] == before["id"] and after["occurrences"] == 2


def test_an_event_the_last_leader_acknowledged_but_never_opened_is_opened_by_the_next(settings, clock, client,
                                                                                      agent, admin_token):
    """The ack commits a report's events; their incident is written a moment later. A leader that dies in
    between leaves an event with no incident: the next leader opens it, and handles nothing twice."""
    post(client, agent, report(seq=1, events=[xid(79, at=clock.time() - 0.2)], interval=1.0))
    [handled] = incidents(client, admin_token)
    runtime = rt(client)
    runtime.pipeline.detect = lambda live, report, exits: None  # acknowledges, then "dies" before the incident
    post(client, agent, report(seq=2, events=[xid(48, "SIM-node-a-1", at=clock.time() - 0.1)], interval=1.0))
    assert [i["id"] for i in incidents(client, admin_token)] == [handled["id"]]
    stop_app(client)
    clock.advance(5)
    for _ in range(2):  # the second start finds both handled
        with TestClient(create_app(settings, clock, run_scheduler=False)) as again:
            found = {i["accelerator_uuid"]: i for i in incidents(again, admin_token)}
            replayed = again.get(f"/api/v1/incidents/{found['SIM-node-a-1']['id']}", headers=bearer(admin_token))
        assert sorted(found) == ["SIM-node-a-0", "SIM-node-a-1"]
        assert found["SIM-node-a-0"]["id"] == handled["id"] and found["SIM-node-a-0"]["occurrences"] == 1
        detail = replayed.json()
        assert "XID 48" in detail["title"] and detail["occurrences"] == 1
        assert "the previous leader stopped before opening this incident" in detail["seen"]
        assert detail["detection_latency_seconds"] == pytest.approx(5.1)


class Dip(Detector):
    """A stand-in statistical detector: an MFU dip on the first `dipping` of 100 jobs."""

    name = "test_dip"
    periodic = True
    dipping = 0

    def evaluate(self, ctx, now):  # type: ignore[no-untyped-def]
        return Evaluation([Finding(detector=self.name, key=f"job={j}", severity="warning", title=f"job {j} MFU dip",
                                   layer="compute", subject=Subject(job_id=j), seen="MFU 30% below its baseline",
                                   observed_at=now) for j in range(1, self.dipping + 1)], subjects=100)


def test_a_fleet_wide_dip_is_one_incident_and_single_dips_are_their_own(client, admin_token, clock: FakeClock):
    engine = rt(client).detection
    dip = Dip(engine.ctx.settings)
    engine.detectors[dip.name] = dip
    dip.dipping = 2
    engine.evaluate()
    assert sorted(i["job_id"] for i in incidents(client, admin_token)) == [1, 2], "2 of 100: each its own"
    dip.dipping = 80
    engine.evaluate()
    active = incidents(client, admin_token)
    assert len(active) == 3, "80 of 100 at once: one fleet-wide incident, not 78 more"
    wide = next(i for i in active if i["job_id"] is None)
    assert wide["title"] == "test_dip: 80 of 100 subjects at once"
    dip.dipping = 0
    engine.evaluate()
    clock.advance(31)
    engine.evaluate()
    assert incidents(client, admin_token) == [], "all clear: the fleet-wide and the single ones resolve"
