"""Report ingest through the real app on SQLite and PostgreSQL: idempotency, validation, liveness."""

from __future__ import annotations

import json

import pytest
from fastapi.testclient import TestClient
from prometheus_client.parser import text_string_to_metric_families
from sqlalchemy import create_engine, func, select

from sentinel.events.models import Event
from sentinel.telemetry.models import ReportReceipt
from tests.conftest import FakeClock, bearer, stop_app
from tests.factories import registration, report


@pytest.fixture
def agent(client: TestClient, make_token) -> dict[str, str]:  # type: ignore[no-untyped-def]
    headers = bearer(make_token("agent"))
    assert client.post("/api/v1/nodes/register", json=registration("node-a"), headers=headers).status_code == 200
    return headers


def post_report(client: TestClient, headers: dict[str, str], body: object, node: str = "node-a"):  # type: ignore[no-untyped-def]
    data = body if isinstance(body, (bytes, str)) else json.dumps(body)
    return client.post(f"/api/v1/nodes/{node}/reports", content=data,
                       headers={**headers, "content-type": "application/json"})


def receipts(database_url: str, seq: int | None = None) -> int:
    engine = create_engine(database_url)
    with engine.connect() as conn:
        query = select(func.count()).select_from(ReportReceipt)
        if seq is not None:
            query = query.where(ReportReceipt.seq == seq)
        count = conn.scalar(query) or 0
    engine.dispose()
    return count


def metric(client: TestClient, admin_token: str, name: str) -> float | None:
    text = client.get("/metrics", headers=bearer(admin_token)).text
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.name == name and not sample.labels:
                return float(sample.value)
    return None


def test_accepted_report_is_stored_and_replay_is_not_counted_twice(client, agent, admin_token, database_url):
    first = post_report(client, agent, report(seq=1))
    assert first.status_code == 200 and first.json()["status"] == "accepted"
    again = post_report(client, agent, report(seq=1))
    assert again.status_code == 200 and again.json()["status"] == "duplicate"
    assert receipts(database_url, seq=1) == 1
    assert metric(client, admin_token, "sentinel_ingest_reports_total") == 1.0
    assert metric(client, admin_token, "sentinel_ingest_duplicates_total") == 1.0


def test_latest_sample_is_served_with_the_accelerator(client, agent, admin_token):
    post_report(client, agent, report(seq=1))
    accs = client.get("/api/v1/accelerators", params={"node": "node-a"}, headers=bearer(admin_token)).json()
    assert [a["uuid"] for a in accs] == ["SIM-node-a-0", "SIM-node-a-1"]
    assert accs[0]["latest"]["utilization_ratio"] == 0.5 and accs[0]["simulated"] is True


def test_replay_survives_a_restart_of_the_server(settings, clock, make_token, client, database_url):
    headers = bearer(make_token("agent"))
    client.post("/api/v1/nodes/register", json=registration("node-a"), headers=headers)
    assert post_report(client, headers, report(seq=7)).json()["status"] == "accepted"
    from sentinel.app import create_app

    stop_app(client)
    with TestClient(create_app(settings, clock, run_scheduler=False)) as second:
        assert post_report(second, headers, report(seq=7)).json()["status"] == "duplicate"
        stale = post_report(second, headers, report(seq=3))
        assert stale.status_code == 409
        assert post_report(second, headers, report(seq=8)).json()["status"] == "accepted"
    assert receipts(database_url) == 2


def test_out_of_order_seq_is_refused_with_409(client, agent):
    assert post_report(client, agent, report(seq=10)).status_code == 200
    response = post_report(client, agent, report(seq=4))
    assert response.status_code == 409
    assert "below its last seq 10" in response.json()["detail"]


def test_unknown_node_is_404(client, agent):
    response = post_report(client, agent, report(node="ghost", seq=1), node="ghost")
    assert response.status_code == 404 and "not registered" in response.json()["detail"]


def test_body_naming_another_node_is_422(client, agent):
    response = post_report(client, agent, report(node="node-a", seq=1), node="node-b")
    assert response.status_code == 422


def test_sample_for_an_unregistered_accelerator_is_422(client, agent, database_url):
    body = report(seq=1, accelerators=3)  # node-a registered two
    response = post_report(client, agent, body)
    assert response.status_code == 422 and "SIM-node-a-2" in response.json()["detail"]
    assert receipts(database_url) == 0


@pytest.mark.parametrize("raw, status", [
    (b"{not json", 400),
    (b"", 400),
    (json.dumps({**report(), "seq": "seven"}), 422),
    (json.dumps({**report(), "seq": 0}), 422),
    (json.dumps({**report(), "unexpected": 1}), 422),
    (json.dumps(report()).replace('"utilization_ratio": 0.5', '"utilization_ratio": NaN'), 422),
    (json.dumps(report()).replace('"power_watts": 300.0', '"power_watts": Infinity'), 422),
    (json.dumps(report()).replace('"utilization_ratio": 0.5', '"utilization_ratio": 1.5'), 422),
    (json.dumps({**report(), "accelerators": "all"}), 422),
])
def test_malformed_reports_get_a_precise_4xx_and_the_server_stays_up(client, agent, raw, status):
    response = post_report(client, agent, raw)
    assert response.status_code == status, response.text
    assert response.json()["detail"]["problems"]
    assert post_report(client, agent, report(seq=1)).status_code == 200


def test_nan_in_a_sample_names_the_field(client, agent):
    raw = json.dumps(report()).replace('"temperature_celsius": 55.0', '"temperature_celsius": NaN')
    problems = post_report(client, agent, raw).json()["detail"]["problems"]
    assert any(p["field"] == "accelerators.0.temperature_celsius" for p in problems)


def test_oversized_body_is_413_by_header_and_by_stream(client, agent):
    big = json.dumps({**report(), "events": [{"kind": "other", "message": "x" * 1000, "observed_at": 1.0}] * 100})
    assert len(big) > 64 * 1024
    assert post_report(client, agent, big).status_code == 413

    def chunks():  # no Content-Length: the limit is enforced while reading
        for i in range(0, len(big), 4096):
            yield big[i:i + 4096].encode()

    response = client.post("/api/v1/nodes/node-a/reports", content=chunks(),
                           headers={**agent, "content-type": "application/json"})
    assert response.status_code == 413
    assert post_report(client, agent, report(seq=1)).status_code == 200


def test_events_are_recorded_with_their_accelerator(client, agent, database_url):
    event = {"kind": "xid", "xid": 79, "accelerator_uuid": "SIM-node-a-1", "message": "XID 79", "observed_at": 1.8e9}
    assert post_report(client, agent, report(seq=1, events=[event])).status_code == 200
    engine = create_engine(database_url)
    with engine.connect() as conn:
        row = conn.execute(select(Event.kind, Event.severity, Event.accelerator_uuid, Event.data)
                           .where(Event.kind == "xid")).one()
    engine.dispose()
    assert row.severity == "critical" and row.accelerator_uuid == "SIM-node-a-1" and row.data["xid"] == 79


def test_event_for_an_unregistered_accelerator_is_422(client, agent):
    event = {"kind": "ecc", "accelerator_uuid": "GPU-elsewhere", "observed_at": 1.8e9}
    assert post_report(client, agent, report(seq=1, events=[event])).status_code == 422


def test_node_goes_down_after_three_missed_intervals_and_comes_back(client, agent, admin_token, clock: FakeClock):
    from sentinel.live.liveness import check_liveness

    rt = client.app.state.runtime  # type: ignore[attr-defined]
    post_report(client, agent, report(seq=1, interval=5.0))
    clock.advance(14.0)
    assert check_liveness(rt.ingest.writer.submit, rt.fleet, clock, 3) == []
    clock.advance(2.0)
    assert check_liveness(rt.ingest.writer.submit, rt.fleet, clock, 3) == ["node-a"]
    node = client.get("/api/v1/nodes/node-a", headers=bearer(admin_token)).json()
    assert node["state"] == "down" and "no report for 16.0s" in node["state_reason"]
    assert 'sentinel_nodes{state="down"} 1.0' in client.get("/metrics", headers=bearer(admin_token)).text
    events = client.get("/api/v1/events", params={"node": "node-a", "kind": "node_down"},
                        headers=bearer(admin_token)).json()
    assert len(events) == 1

    assert post_report(client, agent, report(seq=2)).status_code == 200
    node = client.get("/api/v1/nodes/node-a", headers=bearer(admin_token)).json()
    assert node["state"] == "active"
    kinds = [e["kind"] for e in client.get("/api/v1/events", params={"node": "node-a"},
                                           headers=bearer(admin_token)).json()]
    assert "node_up" in kinds
    assert 'sentinel_nodes{state="active"} 1.0' in client.get("/metrics", headers=bearer(admin_token)).text


def test_a_node_that_reports_while_the_silent_are_marked_is_not_marked(client, agent, admin_token, clock: FakeClock,
                                                                      monkeypatch):
    """At 12,500 nodes the marking took seconds, and nodes listed as silent reported meanwhile: they were
    marked down in SQL ("no report for -13.6s") while memory said active, so their return wrote nothing."""
    from sentinel.live.liveness import check_liveness

    rt = client.app.state.runtime  # type: ignore[attr-defined]
    post_report(client, agent, report(seq=1, interval=5.0))
    clock.advance(16.0)
    listed = rt.fleet.overdue

    def listed_then_reported(now: float, missed: int) -> list:
        found = listed(now, missed)
        assert post_report(client, agent, report(seq=2, interval=5.0)).status_code == 200  # arrives meanwhile
        return found

    monkeypatch.setattr(rt.fleet, "overdue", listed_then_reported)
    assert check_liveness(rt.ingest.writer.submit, rt.fleet, clock, 3) == []
    events = client.get("/api/v1/events", params={"node": "node-a", "kind": "node_down"},
                        headers=bearer(admin_token)).json()
    assert events == []
    assert client.get("/api/v1/nodes/node-a", headers=bearer(admin_token)).json()["state"] == "active"


def test_cordoned_node_returns_cordoned_after_being_down(client, agent, admin_token, clock: FakeClock):
    from sentinel.live.liveness import check_liveness

    rt = client.app.state.runtime  # type: ignore[attr-defined]
    client.post("/api/v1/nodes/node-a/cordon", json={"reason": "bad fan"}, headers=bearer(admin_token))
    post_report(client, agent, report(seq=1))
    clock.advance(100)
    check_liveness(rt.ingest.writer.submit, rt.fleet, clock, 3)
    post_report(client, agent, report(seq=2))
    assert client.get("/api/v1/nodes/node-a", headers=bearer(admin_token)).json()["state"] == "cordoned"


def test_liveness_is_flushed_in_batches_not_per_report(client, agent, admin_token, database_url):
    from sentinel.live.liveness import flush_liveness
    from sentinel.nodes.models import Node

    for seq in range(1, 6):
        post_report(client, agent, report(seq=seq))
    engine = create_engine(database_url)
    with engine.connect() as conn:
        assert conn.scalar(select(Node.last_seq).where(Node.name == "node-a")) == 0
    rt = client.app.state.runtime  # type: ignore[attr-defined]
    assert flush_liveness(rt.factory, rt.fleet) == 1
    with engine.connect() as conn:
        assert conn.scalar(select(Node.last_seq).where(Node.name == "node-a")) == 5
    engine.dispose()
