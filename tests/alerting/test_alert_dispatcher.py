"""The outbox and its dispatcher on SQLite and PostgreSQL, sending over real HTTP to loopback receivers.

Time is a FakeClock: backoff is checked by moving the clock, never by sleeping.
"""

from __future__ import annotations

import logging
import random
import time
from collections.abc import Iterator
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import select
from sqlalchemy.orm import Session, sessionmaker

from sentinel.alerting import service
from sentinel.alerting.dispatcher import Dispatcher
from sentinel.alerting.models import DeliveryAttempt, Notification
from sentinel.clock import to_datetime
from sentinel.config import ReceiverConfig, Settings
from sentinel.db import transaction
from sentinel.incidents.models import Incident
from tests.alerting.alerting_helpers import LoopbackReceiver, database, incident
from tests.conftest import FakeClock
from tests.live import free_port

ROUTING_KEY = "0123456789abcdef0123456789abcdef"


@pytest.fixture
def factory(database_url: str) -> Iterator[sessionmaker[Session]]:
    with database(database_url) as made:
        yield made


@pytest.fixture
def clock() -> FakeClock:
    return FakeClock()


def make_settings(tmp_path: Path, *receivers: dict[str, Any], **extra: Any) -> Settings:
    return Settings(data_dir=tmp_path, receivers=[ReceiverConfig.model_validate(r) for r in receivers], **extra)


def open_incident(factory: sessionmaker[Session], settings: Settings, clock: FakeClock, **fields: Any) -> int:
    now = to_datetime(clock.time())
    with transaction(factory) as session:
        item = incident(opened_at=now, observed_at=now, last_seen_at=now, **fields)
        session.add(item)
        session.flush()
        service.notify(session, item, "trigger", settings, now)
        return item.id


def change(factory: sessionmaker[Session], settings: Settings, clock: FakeClock, incident_id: int, event: str,
           **fields: Any) -> list[Notification]:
    now = to_datetime(clock.time())
    with transaction(factory) as session:
        item = session.get(Incident, incident_id)
        assert item is not None
        for name, value in fields.items():
            setattr(item, name, value)
        return service.notify(session, item, event, settings, now)


def outbox(factory: sessionmaker[Session], incident_id: int) -> list[Notification]:
    with factory() as session:
        return list(session.scalars(select(Notification).where(Notification.incident_id == incident_id)
                                    .order_by(Notification.id)))


def tries(factory: sessionmaker[Session], notification_id: int) -> list[DeliveryAttempt]:
    with factory() as session:
        return list(session.scalars(select(DeliveryAttempt).where(DeliveryAttempt.notification_id == notification_id)
                                    .order_by(DeliveryAttempt.id)))


def test_retries_with_backoff_then_delivers(factory, clock, tmp_path):
    with LoopbackReceiver([500, 503]) as rx:
        settings = make_settings(tmp_path, {"name": "hook", "kind": "webhook", "url": rx.url + "/in", "secret": "k"})
        incident_id = open_incident(factory, settings, clock)
        dispatcher = Dispatcher(factory, settings, clock, rng=random.Random(1))
        start = to_datetime(clock.time())

        assert dispatcher.run_once() == 1
        [row] = outbox(factory, incident_id)
        assert (row.state, row.attempts) == ("pending", 1)
        assert start + timedelta(seconds=1) <= row.next_attempt_at <= start + timedelta(seconds=1.25)
        assert dispatcher.run_once() == 0  # not due yet
        clock.advance(1.3)
        assert dispatcher.run_once() == 1
        [row] = outbox(factory, incident_id)
        second = to_datetime(clock.time())
        assert second + timedelta(seconds=2) <= row.next_attempt_at <= second + timedelta(seconds=2.5)
        clock.advance(2.6)
        assert dispatcher.run_once() == 1
        dispatcher.stop()

    [row] = outbox(factory, incident_id)
    assert (row.state, row.attempts, row.last_error) == ("delivered", 3, "")
    assert row.delivered_at == to_datetime(clock.time())
    attempts = tries(factory, row.id)
    assert [a.status_code for a in attempts] == [500, 503, 200]
    assert attempts[0].error.startswith("HTTP 500") and attempts[2].error == ""
    assert all(a.duration_seconds > 0 for a in attempts)
    assert {r.headers["idempotency-key"] for r in rx.requests} == {f"sentinel-{incident_id}-hook-trigger"}
    assert dispatcher.snapshot() == {("hook", "trigger", "retry"): 2, ("hook", "trigger", "delivered"): 1}


def test_refused_payload_fails_at_once_and_throttling_retries(factory, clock, tmp_path):
    with LoopbackReceiver([400]) as refusing, LoopbackReceiver([(429, {"Retry-After": "7"})]) as throttling:
        settings = make_settings(
            tmp_path, {"name": "refusing", "kind": "slack", "url": refusing.url + "/services/T0/B0/secret-token"},
            {"name": "throttling", "kind": "webhook", "url": throttling.url + "/in"},
            {"name": "gone", "kind": "webhook", "url": f"http://127.0.0.1:{free_port()}/in"})
        incident_id = open_incident(factory, settings, clock)
        dispatcher = Dispatcher(factory, settings, clock)
        assert dispatcher.run_once() == 3
        dispatcher.stop()
    rows = {r.receiver: r for r in outbox(factory, incident_id)}
    now = to_datetime(clock.time())
    assert (rows["refusing"].state, rows["refusing"].attempts) == ("failed", 1)
    assert rows["refusing"].last_error.startswith("HTTP 400")
    assert "secret-token" not in rows["refusing"].last_error
    assert rows["throttling"].state == "pending"
    assert rows["throttling"].next_attempt_at >= now + timedelta(seconds=7)  # Retry-After wins over 1 s
    gone = rows["gone"]
    assert gone.state == "pending" and gone.attempts == 1 and "ConnectError" in gone.last_error
    assert tries(factory, gone.id)[0].status_code is None
    assert dispatcher.snapshot() == {("refusing", "trigger", "failed"): 1, ("throttling", "trigger", "retry"): 1,
                                     ("gone", "trigger", "retry"): 1}


def test_an_unreachable_receiver_does_not_hold_up_the_others(factory, clock, tmp_path):
    with LoopbackReceiver() as rx:
        settings = make_settings(
            tmp_path, {"name": "gone", "kind": "webhook", "url": f"http://127.0.0.1:{free_port()}/in",
                       "match": {"node": "node-a"}},
            {"name": "live", "kind": "webhook", "url": rx.url, "match": {"node": "node-b"}})
        first = open_incident(factory, settings, clock, fingerprint="1")
        second = open_incident(factory, settings, clock, fingerprint="2")
        live = open_incident(factory, settings, clock, fingerprint="3", node="node-b")
        dispatcher = Dispatcher(factory, settings, clock, batch_size=2)
        assert dispatcher.run_once() == 1  # "gone" refused the connection: its second row waits too
        assert dispatcher.run_once() == 1  # so the live receiver's row is next, not behind it
        dispatcher.stop()
    [tried], [held], [sent] = outbox(factory, first), outbox(factory, second), outbox(factory, live)
    assert (tried.attempts, held.attempts, sent.state) == (1, 0, "delivered")
    assert held.state == "pending" and held.next_attempt_at == tried.next_attempt_at


def test_logs_and_errors_never_carry_keys_or_slack_urls(factory, clock, tmp_path, caplog):
    caplog.set_level(logging.DEBUG, logger="sentinel.alerting")
    with LoopbackReceiver(default=400, echo=True) as rx:
        settings = make_settings(
            tmp_path, {"name": "pd", "kind": "pagerduty", "url": rx.url + "/v2/enqueue", "secret": ROUTING_KEY},
            {"name": "chat", "kind": "slack", "url": rx.url + "/services/T000/B000/XXXXSECRETXXXX"})
        incident_id = open_incident(factory, settings, clock)
        dispatcher = Dispatcher(factory, settings, clock)
        assert dispatcher.run_once() == 2
        dispatcher.stop()
    assert ROUTING_KEY in rx.requests[0].body.decode()  # it was sent, and echoed back in the error
    rows = outbox(factory, incident_id)
    assert [r.state for r in rows] == ["failed", "failed"]
    stored = " ".join(r.last_error for r in rows) + " ".join(a.error for r in rows for a in tries(factory, r.id))
    for secret in (ROUTING_KEY, "XXXXSECRETXXXX"):
        assert secret not in caplog.text and secret not in stored
    assert "notification failed for good: notification=" in caplog.text and "receiver=pd" in caplog.text


def test_gives_up_after_max_attempts(factory, clock, tmp_path):
    with LoopbackReceiver(default=502) as rx:
        settings = make_settings(tmp_path, {"name": "hook", "kind": "webhook", "url": rx.url}, notify_max_attempts=3)
        incident_id = open_incident(factory, settings, clock)
        dispatcher = Dispatcher(factory, settings, clock)
        for _ in range(5):
            dispatcher.run_once()
            clock.advance(10)
        dispatcher.stop()
    [row] = outbox(factory, incident_id)
    assert (row.state, row.attempts) == ("failed", 3)
    assert len(rx.requests) == 3


def test_restart_sends_what_was_pending_and_nothing_twice(factory, clock, tmp_path):
    with LoopbackReceiver() as rx:
        settings = make_settings(tmp_path, {"name": "hook", "kind": "webhook", "url": rx.url + "/in"})
        first = open_incident(factory, settings, clock, fingerprint="a")
        before = Dispatcher(factory, settings, clock)
        assert before.run_once() == 1
        before.stop()
        second = open_incident(factory, settings, clock, fingerprint="b")  # queued while no dispatcher runs

        after = Dispatcher(factory, settings, clock)  # a new process: nothing in memory
        assert after.run_once() == 1
        assert after.run_once() == 0
        after.stop()
    assert [r.json()["incident"]["id"] for r in rx.requests] == [first, second]
    assert [r.state for r in outbox(factory, first) + outbox(factory, second)] == ["delivered", "delivered"]


def test_pagerduty_ack_and_resolve_follow_the_trigger_with_one_dedup_key(factory, clock, tmp_path):
    with LoopbackReceiver() as rx:
        settings = make_settings(
            tmp_path,
            {"name": "pd", "kind": "pagerduty", "url": rx.url + "/pd", "secret": ROUTING_KEY},
            {"name": "am", "kind": "alertmanager", "url": rx.url + "/am"},
            {"name": "chat", "kind": "slack", "url": rx.url + "/slack", "send_resolved": False},
            {"name": "quiet", "kind": "webhook", "url": rx.url + "/hook", "min_severity": "critical",
             "match": {"layer": "interconnect"}})
        incident_id = open_incident(factory, settings, clock)
        dispatcher = Dispatcher(factory, settings, clock)
        assert dispatcher.run_once() == 3  # "quiet" is not routed: wrong layer
        ack = change(factory, settings, clock, incident_id, "acknowledge", state="acknowledged",
                     acknowledged_by="operator:alice")
        assert sorted(r.receiver for r in ack) == ["chat", "pd"]  # Alertmanager has no acknowledge
        assert change(factory, settings, clock, incident_id, "acknowledge") == []  # never twice
        assert dispatcher.run_once() == 2
        resolved = change(factory, settings, clock, incident_id, "resolve", state="resolved",
                          resolved_at=to_datetime(clock.time()), resolved_by="operator:alice")
        assert sorted(r.receiver for r in resolved) == ["am", "pd"]  # chat: send_resolved is false
        assert dispatcher.run_once() == 2
        dispatcher.stop()

    pd = [r.json() for r in rx.on("/pd")]
    assert [e["event_action"] for e in pd] == ["trigger", "acknowledge", "resolve"]
    assert {e["dedup_key"] for e in pd} == {"xid:node-a:GPU-1:79"}
    assert "payload" in pd[0] and "payload" not in pd[1] and "payload" not in pd[2]
    assert [r.json()["text"] for r in rx.on("/slack")][1].endswith("acknowledged by operator:alice")
    am = [r.json()[0] for r in rx.on("/am/api/v2/alerts")]
    assert len(am) == 2
    assert datetime.fromisoformat(am[1]["endsAt"].replace("Z", "+00:00")) <= to_datetime(clock.time())
    assert all(r.state == "delivered" for r in outbox(factory, incident_id))


def test_a_follow_up_waits_for_its_trigger(factory, clock, tmp_path):
    with LoopbackReceiver([500]) as rx:
        settings = make_settings(tmp_path, {"name": "pd", "kind": "pagerduty", "url": rx.url, "secret": ROUTING_KEY})
        incident_id = open_incident(factory, settings, clock)
        dispatcher = Dispatcher(factory, settings, clock)
        dispatcher.run_once()  # trigger: 500, retry in ~1 s
        change(factory, settings, clock, incident_id, "resolve", state="resolved",
               resolved_at=to_datetime(clock.time()))
        assert dispatcher.run_once() == 0  # the resolve is held back behind the trigger
        clock.advance(2)
        assert dispatcher.run_once() == 2
        dispatcher.stop()
    assert [r.json()["event_action"] for r in rx.requests] == ["trigger", "trigger", "resolve"]


def test_silence_mutes_then_releases_after_it_ends(factory, clock, tmp_path):
    with LoopbackReceiver() as rx:
        settings = make_settings(tmp_path, {"name": "pd", "kind": "pagerduty", "url": rx.url, "secret": ROUTING_KEY})
        now = to_datetime(clock.time())
        with transaction(factory) as session:
            short = service.create_silence(session, matchers=[{"name": "node", "value": "node-a"}],
                                           ends_at=now + timedelta(seconds=60), now=now, created_by="operator:bob")
            longer = service.create_silence(session, matchers=[{"name": "node", "value": "node-b"}],
                                            ends_at=now + timedelta(seconds=600), now=now, created_by="operator:bob")
            short_id, longer_id = short.id, longer.id
        muted = open_incident(factory, settings, clock, fingerprint="a")
        later_resolved = open_incident(factory, settings, clock, fingerprint="b")
        still_muted = open_incident(factory, settings, clock, fingerprint="c", node="node-b")
        rows = [outbox(factory, i)[0] for i in (muted, later_resolved, still_muted)]
        assert [(r.state, r.silence_id) for r in rows] == [("silenced", short_id), ("silenced", short_id),
                                                           ("silenced", longer_id)]
        dispatcher = Dispatcher(factory, settings, clock)
        dispatcher.enqueued(rows)
        assert dispatcher.run_once() == 0
        [resolve] = change(factory, settings, clock, later_resolved, "resolve", state="resolved",
                           resolved_at=to_datetime(clock.time()))
        assert resolve.state == "silenced"  # a silenced trigger's resolve is silenced too

        clock.advance(61)
        assert dispatcher.run_once() == 1  # only the still-open incident whose silence ended
        dispatcher.stop()
    assert [r.json()["payload"]["source"] for r in rx.requests] == ["node-a"]
    assert outbox(factory, muted)[0].state == "delivered"
    assert [r.state for r in outbox(factory, later_resolved)] == ["silenced", "silenced"]
    assert outbox(factory, still_muted)[0].state == "silenced"
    assert dispatcher.snapshot() == {("pd", "trigger", "silenced"): 3, ("pd", "trigger", "delivered"): 1}


def test_a_silence_made_while_a_page_is_retrying_mutes_it(factory, clock, tmp_path):
    with LoopbackReceiver([500, 500]) as rx:
        settings = make_settings(tmp_path, {"name": "hook", "kind": "webhook", "url": rx.url})
        stays_open = open_incident(factory, settings, clock, fingerprint="a")
        acked = open_incident(factory, settings, clock, fingerprint="b")
        dispatcher = Dispatcher(factory, settings, clock)
        assert dispatcher.run_once() == 2  # both 500: retry in ~1 s
        [ack] = change(factory, settings, clock, acked, "acknowledge", state="acknowledged", acknowledged_by="bob")
        assert ack.state == "pending"  # queued behind its pending trigger
        now = to_datetime(clock.time())
        with transaction(factory) as session:
            silence_id = service.create_silence(
                session, matchers=[{"name": "detector", "value": "x.*", "is_regex": True}],
                ends_at=now + timedelta(hours=1), now=now, created_by="operator:bob").id
        clock.advance(5)
        assert dispatcher.run_once() == 0
        rows = outbox(factory, stays_open) + outbox(factory, acked)
        assert [(r.event, r.state, r.silence_id) for r in rows] == [
            ("trigger", "silenced", silence_id), ("trigger", "silenced", silence_id),
            ("acknowledge", "silenced", silence_id)]  # the ack shares its trigger's fate
        with transaction(factory) as session:  # expiring it early releases the open incident's page
            now = to_datetime(clock.time())
            assert service.expire_silence(session, silence_id, now).ends_at == now
            with pytest.raises(LookupError):
                service.expire_silence(session, 999_999, now)
        assert dispatcher.run_once() == 1
        dispatcher.stop()
    assert len(rx.requests) == 3
    assert outbox(factory, stays_open)[0].state == "delivered"
    assert [r.state for r in outbox(factory, acked)] == ["silenced", "silenced"]  # someone is on it already


def test_refresh_reposts_firing_alerts_to_alertmanager(factory, clock, tmp_path):
    with LoopbackReceiver() as rx:
        settings = make_settings(tmp_path, {"name": "am", "kind": "alertmanager", "url": rx.url},
                                 alert_resend_seconds=30)
        firing = open_incident(factory, settings, clock, fingerprint="a")
        ended = open_incident(factory, settings, clock, fingerprint="b")
        dispatcher = Dispatcher(factory, settings, clock)
        dispatcher.run_once()
        change(factory, settings, clock, ended, "resolve", state="resolved", resolved_at=to_datetime(clock.time()))
        dispatcher.run_once()
        rx.requests.clear()
        clock.advance(30)
        assert dispatcher.refresh_alertmanager() == 1
        dispatcher.stop()
    [post] = rx.requests
    [alert] = post.json()
    assert alert["labels"]["fingerprint"] == "a" and alert["generatorURL"].endswith(f"/incidents/{firing}")
    assert alert["endsAt"].startswith(to_datetime(clock.time() + 90).isoformat()[:19])


def test_background_thread_sends_on_wake(factory, tmp_path):
    from sentinel.clock import SystemClock

    clock = SystemClock()
    with LoopbackReceiver() as rx:
        settings = make_settings(tmp_path, {"name": "hook", "kind": "webhook", "url": rx.url})
        dispatcher = Dispatcher(factory, settings, clock)
        dispatcher.start()
        try:
            time.sleep(0.05)
            now = to_datetime(clock.time())
            with transaction(factory) as session:
                item = incident(opened_at=now)
                session.add(item)
                session.flush()
                rows = service.notify(session, item, "trigger", settings, now)
            started = time.monotonic()
            dispatcher.enqueued(rows)
            rx.wait_for(1, timeout=5)
            assert time.monotonic() - started < 0.9  # woken, not waiting for the 1 s tick
        finally:
            dispatcher.stop()
