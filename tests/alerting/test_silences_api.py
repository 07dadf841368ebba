"""Silences and notifications over the real app (SQLite and PostgreSQL), with real tokens and roles."""

from __future__ import annotations

from datetime import timedelta

import pytest
from fastapi.testclient import TestClient

from sentinel.alerting.models import DeliveryAttempt, Notification
from sentinel.audit.service import list_entries
from sentinel.clock import to_datetime
from sentinel.db import transaction
from tests.alerting.alerting_helpers import incident
from tests.conftest import bearer

NODE_A = [{"name": "node", "value": "node-a"}]


@pytest.fixture
def api(client: TestClient) -> TestClient:
    return client


def test_viewer_lists_operator_creates_and_expires(api, make_token, clock):
    viewer, operator = bearer(make_token("viewer")), bearer(make_token("operator", "alice"))
    assert api.get("/api/v1/silences", headers=viewer).json() == []
    denied = api.post("/api/v1/silences", json={"matchers": NODE_A, "duration_seconds": 60}, headers=viewer)
    assert denied.status_code == 403 and "operator" in denied.json()["detail"]

    made = api.post("/api/v1/silences", json={"matchers": NODE_A, "duration_seconds": 3600, "comment": "reseat GPU"},
                    headers=operator)
    assert made.status_code == 201, made.text
    silence = made.json()
    assert silence["active"] is True and silence["created_by"] == "operator:alice"
    assert silence["matchers"] == [{"name": "node", "value": "node-a", "is_regex": False, "is_equal": True}]
    assert [s["id"] for s in api.get("/api/v1/silences", headers=viewer).json()] == [silence["id"]]
    assert api.get(f"/api/v1/silences/{silence['id']}", headers=viewer).json()["comment"] == "reseat GPU"

    clock.advance(10)
    expired = api.delete(f"/api/v1/silences/{silence['id']}", headers=operator)
    assert expired.status_code == 200 and expired.json()["active"] is False
    assert api.get("/api/v1/silences", headers=viewer).json() == []
    assert [s["id"] for s in api.get("/api/v1/silences", params={"all": "true"}, headers=viewer).json()] == [
        silence["id"]]
    assert api.delete(f"/api/v1/silences/{silence['id']}", headers=viewer).status_code == 403

    with api.app.state.runtime.factory() as session:
        audit = [(e.actor, e.action, e.reason) for e in list_entries(session, subject=f"silence/{silence['id']}")]
    assert audit == [("operator:alice", "silence.expire", ""), ("operator:alice", "silence.create", "reseat GPU")]


BAD = [
    ({"matchers": [{"name": "node", "value": "(", "is_regex": True}], "duration_seconds": 60},
     "invalid regular expression"),
    ({"matchers": [{"name": "node", "value": ".*", "is_regex": True}], "duration_seconds": 60},
     "must not match the empty string"),
    ({"matchers": [], "duration_seconds": 60}, "at least 1 item"),
    ({"matchers": NODE_A * 33, "duration_seconds": 60}, "at most 32 items"),
    ({"matchers": [{"name": "bad-name", "value": "x"}], "duration_seconds": 60}, "should match pattern"),
    ({"matchers": NODE_A, "duration_seconds": 0}, "greater than 0"),
    ({"matchers": NODE_A, "duration_seconds": 366 * 86400}, "less than or equal to 31536000"),
    ({"matchers": NODE_A}, "exactly one of duration_seconds and ends_at"),
    ({"matchers": NODE_A, "duration_seconds": 60, "ends_at": "2099-01-01T00:00:00Z"}, "exactly one"),
    ({"matchers": NODE_A, "ends_at": "2000-01-01T00:00:00Z"}, "ends_at must be in the future"),
    ({"matchers": NODE_A, "ends_at": "2099-01-01T00:00:00"}, "timezone"),
]


def test_bad_silences_are_422_with_a_reason(api, admin_token):
    for body, says in BAD:  # one app for all cases: each start costs a migration run
        response = api.post("/api/v1/silences", json=body, headers=bearer(admin_token))
        assert response.status_code == 422, (body, response.text)
        assert says in response.text, (body, response.text)
    assert api.get("/api/v1/silences", params={"all": "true"}, headers=bearer(admin_token)).json() == []


def test_unknown_silence_is_404(api, admin_token):
    response = api.delete("/api/v1/silences/424242", headers=bearer(admin_token))
    assert response.status_code == 404 and "424242" in response.json()["detail"]
    assert api.get("/api/v1/silences/424242", headers=bearer(admin_token)).status_code == 404
    assert api.get("/api/v1/silences").status_code == 401


def test_notifications_of_an_incident_with_their_attempts(api, make_token, clock):
    rt = api.app.state.runtime
    now = to_datetime(clock.time())
    with transaction(rt.factory) as session:
        item = incident(opened_at=now)
        other = incident(opened_at=now, fingerprint="other")
        session.add_all([item, other])
        session.flush()
        sent = Notification(incident_id=item.id, receiver="pd", kind="pagerduty", event="trigger", state="delivered",
                            attempts=2, next_attempt_at=now, delivered_at=now + timedelta(seconds=3), created_at=now)
        session.add_all([sent, Notification(incident_id=other.id, receiver="pd", kind="pagerduty", event="trigger",
                                            next_attempt_at=now, created_at=now)])
        session.flush()
        session.add_all([DeliveryAttempt(notification_id=sent.id, at=now, status_code=500, error="HTTP 500: boom",
                                         duration_seconds=0.01),
                         DeliveryAttempt(notification_id=sent.id, at=now, status_code=202, duration_seconds=0.02)])
        incident_id = item.id
    listed = api.get("/api/v1/notifications", params={"incident": incident_id},
                     headers=bearer(make_token("viewer"))).json()
    assert len(listed) == 1
    [row] = listed
    assert (row["receiver"], row["event"], row["state"], row["attempts"]) == ("pd", "trigger", "delivered", 2)
    assert [(a["status_code"], a["error"]) for a in row["delivery_attempts"]] == [(500, "HTTP 500: boom"), (202, "")]
    assert len(api.get("/api/v1/notifications", headers=bearer(make_token("viewer"))).json()) == 2
