"""Outbound webhooks (alerts and launcher orders) are signed over a body that carries `sent_at`, so a receiver
refuses a replayed body and one whose time was changed; checked with a real HTTP receiver on loopback."""

from __future__ import annotations

import json
import time
from datetime import UTC, datetime

import httpx

from sentinel.alerting import notifiers
from sentinel.alerting.notifiers import webhook
from sentinel.alerting.notifiers.webhook import REPLAY_TOLERANCE_SECONDS, sign, verify_signature
from sentinel.config import ReceiverConfig
from sentinel.remediation.executors.launcher import OrderBoard
from tests.alerting.alerting_helpers import LoopbackReceiver, Recorded, incident

SECRET = "hmac-secret-for-tests"


def check(got: Recorded, now: float) -> bool:
    return verify_signature(SECRET, got.body, got.headers.get("x-sentinel-signature"), now=now,
                            max_age_seconds=REPLAY_TOLERANCE_SECONDS,
                            timestamp_header=got.headers.get("x-sentinel-timestamp"))


def test_alert_webhook_signature_covers_its_time_and_stale_bodies_are_refused():
    now = time.time()
    with LoopbackReceiver() as rx:
        rcv = ReceiverConfig.model_validate({"name": "hook", "kind": "webhook", "url": rx.url + "/in",
                                             "secret": SECRET})
        request = notifiers.render(rcv, incident(id=5), "trigger", datetime.fromtimestamp(now, UTC))
        assert httpx.post(request.url, content=request.body, headers=request.headers, timeout=5).status_code == 200
        got = rx.requests[-1]
    assert check(got, now)
    assert check(got, now + REPLAY_TOLERANCE_SECONDS - 1)
    assert not check(got, now + REPLAY_TOLERANCE_SECONDS + 1), "a replay after the tolerance is refused"
    assert not check(got, now - REPLAY_TOLERANCE_SECONDS - 1), "so is a body from the future"
    body = json.loads(got.body)
    body["sent_at"] = int(now) + 3600  # a replayer cannot move the time: it is under the signature
    moved = json.dumps(body).encode()
    assert not verify_signature(SECRET, moved, got.headers["x-sentinel-signature"], now=now + 3600,
                                max_age_seconds=REPLAY_TOLERANCE_SECONDS)
    assert not verify_signature(SECRET, got.body, got.headers["x-sentinel-signature"], now=now,
                                max_age_seconds=REPLAY_TOLERANCE_SECONDS, timestamp_header=str(int(now) + 5))
    unstamped = b'{"event": "trigger"}'
    assert verify_signature(SECRET, unstamped, sign(SECRET, unstamped))
    assert not verify_signature(SECRET, unstamped, sign(SECRET, unstamped), max_age_seconds=60)
    assert webhook.signed_time(b"not json") is None


def test_order_webhook_is_signed_with_its_time_and_stale_orders_are_refused():
    order = {"id": "0b9e-order", "job_id": 7, "kind": "restart", "attempt": 1}
    with LoopbackReceiver() as rx:
        assert OrderBoard.push_webhook(rx.url + "/orders", SECRET, order) == ""
        got = rx.requests[-1]
    sent_at = json.loads(got.body)["sent_at"]
    assert got.headers["x-sentinel-timestamp"] == str(sent_at) and abs(sent_at - time.time()) < 60
    assert json.loads(got.body)["order"] == order
    assert check(got, time.time())
    assert not check(got, sent_at + REPLAY_TOLERANCE_SECONDS + 1)
    assert not verify_signature("other", got.body, got.headers["x-sentinel-signature"])
