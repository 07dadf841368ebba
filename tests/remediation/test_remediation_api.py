"""Remediation through the real app on SQLite and PostgreSQL: quarantine, drain, orders, placement, the
breaker, dry run, manual quarantine and release (restart storms and the breaker's limits:
test_field_hardening.py)."""

from __future__ import annotations

import threading
import time
from typing import Any

import pytest

from sentinel.detection.base import Detector, Evaluation
from sentinel.incidents.findings import Finding, Subject
from tests.conftest import bearer
from tests.factories import registration, report
from tests.remediation.conftest import health, rt, settle, timeline, xid


def test_first_placement_keeps_the_ranks_on_one_node(fleet):
    assert [(s["rank"], s["node"]) for s in fleet["placement"]] == [(0, "node-a"), (1, "node-a")] or \
        [(s["rank"], s["node"]) for s in fleet["placement"]] == [(0, "node-b"), (1, "node-b")]


def test_xid_79_quarantines_drains_and_orders_the_job_onto_the_spare(client, fleet, admin_token, clock):
    node = fleet["placement"][1]["node"]
    spare = "node-b" if node == "node-a" else "node-a"
    victim = fleet["placement"][1]["accelerators"][0]
    xid(client, fleet, 79, victim, clock)
    states = health(client, admin_token)
    assert {u: h for u, h in states.items() if u.startswith(f"SIM-{node}")} == \
        {f"SIM-{node}-0": "quarantined", f"SIM-{node}-1": "quarantined"}
    nodes = {n["name"]: n["state"] for n in client.get("/api/v1/nodes", headers=bearer(admin_token)).json()}
    assert nodes[node] == "draining" and nodes[spare] == "active"

    [order] = client.get(f"/api/v1/jobs/{fleet['job']}/orders", headers=fleet["launcher"]).json()
    assert (order["kind"], order["attempt"], order["state"]) == ("restart", 1, "pending")
    assert {s["node"] for s in order["placement"]} == {spare}, "both ranks leave the drained node, together"
    text = timeline(client, admin_token)
    assert "quarantined accelerator(s)" in text and f"drained node {node}" in text and order["id"] in text

    acked = client.post(f"/api/v1/orders/{order['id']}/ack", json={"status": "acknowledged"},
                        headers=fleet["launcher"])
    assert acked.json()["state"] == "acknowledged"
    done = client.post(f"/api/v1/orders/{order['id']}/ack", json={"status": "done", "detail": "started"},
                       headers=fleet["launcher"])
    assert done.json()["state"] == "done"
    again = client.post(f"/api/v1/orders/{order['id']}/ack", json={"status": "acknowledged"},
                        headers=fleet["launcher"])
    assert again.json()["state"] == "done", "an ack never moves an order backwards"
    assert client.get(f"/api/v1/jobs/{fleet['job']}/orders", headers=fleet["launcher"]).json() == []
    assert client.post("/api/v1/orders/nope/ack", headers=fleet["launcher"]).status_code == 404
    metrics = client.get("/metrics").text
    assert 'sentinel_remediations_total{action="quarantine_accelerator",result="done"} 1.0' in metrics
    assert "sentinel_breaker_open 0.0" in metrics
    # the replayed report does not act twice
    xid(client, fleet, 79, victim, clock)
    assert len(client.get(f"/api/v1/jobs/{fleet['job']}/orders", params={"state": "all"},
                          headers=fleet["launcher"]).json()) == 1


def test_a_long_poll_wakes_when_an_order_arrives(client, fleet, clock):
    got: list[Any] = []

    def poll() -> None:
        started = time.monotonic()
        answer = client.get(f"/api/v1/jobs/{fleet['job']}/orders", params={"wait": 20}, headers=fleet["launcher"])
        got.append((time.monotonic() - started, answer.json()))

    thread = threading.Thread(target=poll)
    thread.start()
    time.sleep(0.3)
    xid(client, fleet, 95, fleet["placement"][0]["accelerators"][0], clock)
    thread.join(20)
    took, orders = got[0]
    assert took < 10 and len(orders) == 1 and orders[0]["placement"][0]["rank"] == 0


@pytest.mark.parametrize("overrides", [{"breaker_min_accelerators": 0}])
def test_the_breaker_trips_instead_of_draining_too_much_and_a_person_resets_it(client, fleet, admin_token,
                                                                             make_token, clock, overrides):
    xid(client, fleet, 79, fleet["placement"][0]["accelerators"][0], clock)  # 2 of 4 accelerators > 10 %
    assert set(health(client, admin_token).values()) == {"healthy"}, "nothing quarantined"
    breaker = client.get("/api/v1/breaker", headers=bearer(admin_token)).json()
    assert breaker["open"] and "2 of 4 accelerators would be out of service" in breaker["reason"]
    assert client.get(f"/api/v1/jobs/{fleet['job']}/orders", headers=fleet["launcher"]).json() == []
    text = timeline(client, admin_token)
    assert "circuit breaker tripped" in text
    assert "sentinel_breaker_open 1.0" in client.get("/metrics").text

    xid(client, fleet, 48, fleet["placement"][1]["accelerators"][0], clock)
    blocked = client.get("/api/v1/remediations", headers=bearer(admin_token)).json()
    assert [r["result"] for r in blocked] == ["blocked", "blocked"], "open: every automatic action stops"

    viewer, operator = bearer(make_token("viewer")), bearer(make_token("operator"))
    assert client.post("/api/v1/breaker/reset", headers=viewer).status_code == 403
    reset = client.post("/api/v1/breaker/reset", json={"reason": "fixed"}, headers=operator)
    assert reset.status_code == 200 and not reset.json()["open"] and reset.json()["reset_by"].startswith("operator")


@pytest.mark.parametrize("overrides", [{"remediation_dry_run": True}])
def test_dry_run_records_what_it_would_do_and_does_nothing(client, fleet, admin_token, clock, overrides):
    xid(client, fleet, 48, fleet["placement"][0]["accelerators"][0], clock)
    assert set(health(client, admin_token).values()) == {"healthy"}
    assert client.get(f"/api/v1/jobs/{fleet['job']}/orders", headers=fleet["launcher"]).json() == []
    assert "dry run: would quarantine" in timeline(client, admin_token)
    assert [r["result"] for r in client.get("/api/v1/remediations", headers=bearer(admin_token)).json()] == ["dry_run"]


def test_an_order_nobody_acknowledges_escalates_the_incident(client, fleet, admin_token, clock):
    xid(client, fleet, 94, fleet["placement"][0]["accelerators"][0], clock)  # restart_task: in place
    [order] = client.get(f"/api/v1/jobs/{fleet['job']}/orders", headers=fleet["launcher"]).json()
    [incident] = client.get("/api/v1/incidents", headers=bearer(admin_token)).json()["incidents"]
    assert incident["severity"] == "warning" and order["kind"] == "restart"
    rt(client).remediation.tick()
    clock.advance(31)
    rt(client).remediation.tick()
    [incident] = client.get("/api/v1/incidents", headers=bearer(admin_token)).json()["incidents"]
    assert incident["severity"] == "critical"
    assert "was not acknowledged within 30s" in timeline(client, admin_token)


def test_manual_quarantine_moves_work_and_release_resolves_latched_incidents(client, fleet, admin_token, make_token,
                                                                            clock):
    operator, viewer = bearer(make_token("operator")), bearer(make_token("viewer"))
    victim = fleet["placement"][0]["accelerators"][0]
    assert client.post(f"/api/v1/accelerators/{victim}/quarantine", headers=viewer).status_code == 403
    assert client.post("/api/v1/accelerators/SIM-nope-0/quarantine", headers=operator).status_code == 404
    lines = client.post(f"/api/v1/accelerators/{victim}/quarantine", json={"reason": "fan"}, headers=operator).json()
    assert any("quarantined" in line for line in lines) and any("order" in line for line in lines)
    assert health(client, admin_token)[victim] == "quarantined"
    [order] = client.get(f"/api/v1/jobs/{fleet['job']}/orders", headers=fleet["launcher"]).json()
    assert all(victim not in s["accelerators"] for s in order["placement"])

    xid(client, fleet, 48, victim, clock)  # a latched incident about it
    released = client.post(f"/api/v1/accelerators/{victim}/release", json={"reason": "reseated"}, headers=operator)
    assert released.status_code == 200 and any("resolved incident" in line for line in released.json())
    assert health(client, admin_token)[victim] == "healthy"
    assert client.get("/api/v1/incidents", headers=bearer(admin_token)).json()["incidents"] == []


def test_placement_never_uses_quarantined_cordoned_or_other_models(client, fleet, admin_token, make_token):
    operator, launcher = bearer(make_token("operator")), fleet["launcher"]
    reg = registration("node-c", 4, 1.0)
    for acc in reg["accelerators"]:
        acc["model"] = "sim-a100-40gb"
    client.post("/api/v1/nodes/register", json=reg, headers=fleet["agent"])
    client.post("/api/v1/nodes/node-b/cordon", json={"reason": "test"}, headers=operator)
    job = client.post("/api/v1/jobs", json={"name": "small", "world_size": 2}, headers=launcher).json()
    placement = client.post(f"/api/v1/jobs/{job['id']}/placement", json={}, headers=launcher).json()
    assert {s["node"] for s in placement} == {"node-c"}, "node-a is busy, node-b cordoned: node-c's model"
    big = client.post("/api/v1/jobs", json={"name": "big", "world_size": 5}, headers=launcher).json()
    refused = client.post(f"/api/v1/jobs/{big['id']}/placement", json={}, headers=launcher)
    assert refused.status_code == 409 and "needed" in refused.json()["detail"]


def test_a_serving_replica_is_replaced_not_restarted(client, fleet, admin_token, make_token, clock):
    launcher = fleet["launcher"]
    job = client.post("/api/v1/jobs", json={"name": "serve", "kind": "serving", "world_size": 1},
                      headers=launcher).json()
    [slot] = client.post(f"/api/v1/jobs/{job['id']}/placement", json={}, headers=launcher).json()
    client.post(f"/api/v1/jobs/{job['id']}/tasks", headers=launcher,
                json={"rank": 0, "node": slot["node"], "accelerators": slot["accelerators"], "pid": 2000})
    xid(client, fleet, 95, slot["accelerators"][0], clock)
    [order] = client.get(f"/api/v1/jobs/{job['id']}/orders", headers=launcher).json()
    assert order["kind"] == "replace_replica" and order["placement"][0]["accelerators"] != slot["accelerators"]


class Suspect(Detector):
    """Stands in for the straggler detector: statistical evidence against one accelerator."""

    name = "test_suspect"
    periodic = True
    uuid = ""

    def evaluate(self, ctx, now):  # type: ignore[no-untyped-def]
        finding = Finding(detector=self.name, key=f"acc={self.uuid}", severity="warning", title="slow rank",
                          layer="compute", subject=Subject(node=self.uuid.rsplit("-", 1)[0].removeprefix("SIM-"),
                                                           accelerator=self.uuid),
                          seen="median step 40% above its peers", action="probe", observed_at=now)
        return Evaluation([finding] if self.uuid else [], subjects=4)


@pytest.mark.parametrize(("achieved", "quarantined"), [(0.3, True), (0.97, False)])
def test_statistical_evidence_is_probed_before_anything_is_quarantined(client, fleet, admin_token, clock,
                                                                      achieved, quarantined):
    victim = fleet["placement"][1]["accelerators"][0]
    node = fleet["placement"][1]["node"]
    detector = Suspect(rt(client).settings)
    detector.uuid = victim
    rt(client).detection.detectors[detector.name] = detector
    rt(client).detection.evaluate()
    settle(client)
    assert health(client, admin_token)[victim] == "suspect"
    [command] = client.get(f"/api/v1/nodes/{node}/commands", headers=fleet["agent"]).json()
    assert command["kind"] == "probe" and command["accelerator_index"] == int(victim.rsplit("-", 1)[1])

    fleet["seq"][0] += 1
    body = report(node=node, seq=fleet["seq"][0], interval=1.0, events=[
        {"kind": "probe", "accelerator_uuid": victim, "value": achieved, "observed_at": clock.time()}])
    assert client.post(f"/api/v1/nodes/{node}/reports", json=body, headers=fleet["agent"]).status_code == 200
    settle(client)
    text = timeline(client, admin_token, "test_suspect")
    orders = client.get(f"/api/v1/jobs/{fleet['job']}/orders", headers=fleet["launcher"]).json()
    if quarantined:
        assert health(client, admin_token)[victim] == "quarantined" and len(orders) == 1
        assert "probe confirmed" in text and "30%" in text
    else:
        assert health(client, admin_token)[victim] == "healthy" and orders == []
        assert "probe passed" in text and "not quarantined" in text


def test_an_order_is_pushed_to_the_launchers_webhook_signed(client, fleet, admin_token, make_token, clock):
    import hashlib
    import hmac
    import json as jsonlib
    from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

    got: list[tuple[dict[str, str], bytes]] = []

    class Hook(BaseHTTPRequestHandler):
        def do_POST(self) -> None:
            got.append((dict(self.headers), self.rfile.read(int(self.headers["Content-Length"]))))
            self.send_response(204)
            self.end_headers()

        def log_message(self, *_: Any) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Hook)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        rt(client).settings.order_webhook_secret = "launcher-secret"
        launcher = fleet["launcher"]
        url = f"http://127.0.0.1:{server.server_address[1]}/orders"
        job = client.post("/api/v1/jobs", json={"name": "hooked", "world_size": 1,
                                                "attributes": {"order_webhook": url}}, headers=launcher).json()
        [slot] = client.post(f"/api/v1/jobs/{job['id']}/placement", json={}, headers=launcher).json()
        client.post(f"/api/v1/jobs/{job['id']}/tasks", headers=launcher,
                    json={"rank": 0, "node": slot["node"], "accelerators": slot["accelerators"], "pid": 3000})
        xid(client, fleet, 48, slot["accelerators"][0], clock)
        deadline = time.monotonic() + 5
        while not got and time.monotonic() < deadline:
            time.sleep(0.02)
        [(headers, body)] = got
        expected = "sha256=" + hmac.new(b"launcher-secret", body, hashlib.sha256).hexdigest()
        assert hmac.compare_digest(headers["X-Sentinel-Signature"], expected)
        order = jsonlib.loads(body)["order"]
        assert order["job_id"] == job["id"] and headers["Idempotency-Key"] == order["id"]
    finally:
        server.shutdown()
