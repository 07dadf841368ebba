"""Each notifier's payload, sent over real HTTP to a loopback receiver and checked against the
receiver's documented format: Slack Block Kit, PagerDuty Events API v2, Alertmanager API v2, our webhook.
What every notifier shares is tests/contracts/test_notifier_contract.py."""

from __future__ import annotations

import json
import re
from datetime import UTC, datetime, timedelta

import pytest

from sentinel.alerting import notifiers
from sentinel.alerting.notifiers import webhook
from sentinel.incidents import render as prose
from tests.alerting.alerting_helpers import LoopbackReceiver, deliver, incident, receiver

NOW = datetime(2030, 5, 6, 7, 8, 9, tzinfo=UTC)
ROUTING_KEY = "R" * 32
LABEL_NAME = re.compile(r"[a-zA-Z_][a-zA-Z0-9_]*")


def parse_time(value: str) -> datetime:
    parsed = datetime.fromisoformat(value.replace("Z", "+00:00"))
    assert parsed.tzinfo is not None, value
    return parsed


# --- Slack -------------------------------------------------------------------------------------------

def check_block_kit(message: dict) -> None:
    """The Block Kit rules this message must satisfy (types, required keys, limits)."""
    assert set(message) == {"text", "blocks"}
    assert isinstance(message["text"], str) and message["text"]
    blocks = message["blocks"]
    assert 1 <= len(blocks) <= 50
    for block in blocks:
        kind = block["type"]
        assert kind in {"header", "section", "context"}
        if kind == "header":
            assert set(block) == {"type", "text"}
            assert block["text"]["type"] == "plain_text" and isinstance(block["text"]["emoji"], bool)
            assert 0 < len(block["text"]["text"]) <= 150
        elif kind == "section":
            assert "text" in block or "fields" in block
            if "text" in block:
                assert block["text"]["type"] == "mrkdwn" and 0 < len(block["text"]["text"]) <= 3000
            for item in block.get("fields", []):
                assert item["type"] == "mrkdwn" and 0 < len(item["text"]) <= 2000
            assert len(block.get("fields", [])) <= 10
        else:
            assert 1 <= len(block["elements"]) <= 10
            for element in block["elements"]:
                assert element["type"] == "mrkdwn" and 0 < len(element["text"]) <= 3000


def test_slack_trigger_follows_block_kit_and_carries_every_section():
    item = incident(id=42)
    with LoopbackReceiver() as rx:
        message = deliver(notifiers.render(receiver("slack", rx.url + "/hook"), item, "trigger", NOW), rx).json()
    check_block_kit(message)
    header, facts, *sections, context = message["blocks"]
    assert header["type"] == "header" and "#42 XID 79 on node-a GPU 1" in header["text"]["text"]
    assert [f["text"].split("\n")[0] for f in facts["fields"]] == ["*Severity*", "*Subject*", "*Layer*", "*State*"]
    assert facts["fields"][0]["text"].endswith("CRITICAL")
    assert [s["text"]["text"].split("\n")[0] for s in sections] == [f"*{h}*" for h, _ in prose.sections(item)]
    assert "quarantined GPU-1" in sections[3]["text"]["text"]
    assert context["type"] == "context"
    line = context["elements"][0]["text"]
    assert "`xid:node-a:GPU-1:79`" in line and "<http://127.0.0.1:9480/api/v1/incidents/42|incident #42>" in line
    assert message["text"].startswith("[CRITICAL] #42")


def test_slack_escapes_and_truncates_cleanly():
    long_seen = ("a & b <c> " * 800).strip()  # 8,000 characters, and escaping makes it longer
    item = incident(id=9, title="T" * 400 + " <script>", seen=long_seen)
    with LoopbackReceiver() as rx:
        rcv = receiver("slack", rx.url + "/hook")
        request = notifiers.render(rcv, item, "trigger", NOW, external_url="https://sentinel.example/")
        message = deliver(request, rx).json()
    check_block_kit(message)
    assert message["blocks"][0]["text"]["text"].endswith("…")
    seen = message["blocks"][2]["text"]["text"]
    assert len(seen) <= 3000 and seen.endswith("…")
    body = seen.split("\n", 1)[1]
    assert "<" not in body and ">" not in body
    # no entity was cut in half: every & starts a whole entity
    assert all(part.startswith(("amp;", "lt;", "gt;")) for part in body.split("&")[1:])
    assert "https://sentinel.example/api/v1/incidents/9" in message["blocks"][-1]["elements"][0]["text"]


def test_slack_ack_and_resolve_are_short():
    with LoopbackReceiver() as rx:
        rcv = receiver("slack", rx.url + "/hook")
        acked = incident(id=3, state="acknowledged", acknowledged_by="operator:alice")
        ack = deliver(notifiers.render(rcv, acked, "acknowledge", NOW), rx).json()
        done = incident(id=3, state="resolved", resolved_by="operator:bob", resolve_reason="GPU replaced",
                        resolved_at=NOW)
        resolve = deliver(notifiers.render(rcv, done, "resolve", NOW), rx).json()
    for message in (ack, resolve):
        check_block_kit(message)
        assert len(message["blocks"]) <= 3
    assert ack["text"] == "#3 XID 79 on node-a GPU 1: fell off the bus acknowledged by operator:alice"
    assert resolve["blocks"][0]["text"]["text"].startswith(":white_check_mark: Resolved: #3")
    assert "Resolved by operator:bob: GPU replaced" in resolve["blocks"][1]["text"]["text"]


# --- PagerDuty ---------------------------------------------------------------------------------------

def test_pagerduty_trigger_matches_events_api_v2():
    item = incident(id=11)
    with LoopbackReceiver() as rx:
        rcv = receiver("pagerduty", rx.url + "/v2/enqueue", secret=ROUTING_KEY)
        got = deliver(notifiers.render(rcv, item, "trigger", NOW), rx)
    event = got.json()
    assert got.path == "/v2/enqueue"
    assert set(event) == {"routing_key", "event_action", "dedup_key", "payload", "links", "client", "client_url"}
    assert event["routing_key"] == ROUTING_KEY and event["event_action"] == "trigger"
    assert event["dedup_key"] == item.fingerprint and len(event["dedup_key"]) <= 255
    payload = event["payload"]
    assert {"summary", "source", "severity"} <= set(payload)
    assert all(isinstance(payload[k], str) for k in ("summary", "source", "severity", "component", "group", "class"))
    assert payload["summary"] == prose.headline(item) and len(payload["summary"]) <= 1024
    assert payload["source"] == "node-a" and payload["severity"] == "critical"
    assert payload["component"] == "GPU-1" and payload["group"] == "job-7" and payload["class"] == "xid"
    assert parse_time(payload["timestamp"]) == item.opened_at
    details = payload["custom_details"]
    assert details["evidence"] == {"xid": 79, "count": 1}
    assert details["What to check next"].startswith("1. check `nvidia-smi -q`")
    assert details["labels"]["alertname"] == "SentinelXid"
    assert event["links"] == [{"href": "http://127.0.0.1:9480/api/v1/incidents/11", "text": "Sentinel incident #11"}]
    assert event["client"] == "Sentinel" and event["client_url"] == "http://127.0.0.1:9480"


@pytest.mark.parametrize(("severity", "expected"), [("critical", "critical"), ("warning", "warning"),
                                                    ("info", "info"), ("weird", "error")])
def test_pagerduty_severity_map(severity, expected):
    rcv = receiver("pagerduty", "", secret=ROUTING_KEY)
    body = json.loads(notifiers.render(rcv, incident(id=1, severity=severity), "trigger", NOW).body)
    assert body["payload"]["severity"] == expected
    assert rcv.url == "https://events.pagerduty.com/v2/enqueue"


def test_pagerduty_follow_ups_carry_no_payload_and_summary_is_capped():
    rcv = receiver("pagerduty", "http://127.0.0.1:1/x", secret=ROUTING_KEY)
    for event in ("acknowledge", "resolve"):
        body = json.loads(notifiers.render(rcv, incident(id=1), event, NOW).body)
        assert body == {"routing_key": ROUTING_KEY, "event_action": event, "dedup_key": "xid:node-a:GPU-1:79"}
    fleet = incident(id=2, title="x" * 3000, node=None, accelerator_uuid=None, job_id=None, rank=None)
    payload = json.loads(notifiers.render(rcv, fleet, "trigger", NOW).body)["payload"]
    assert len(payload["summary"]) == 1024 and payload["summary"].endswith("…")
    assert payload["source"] == "sentinel-fleet" and "group" not in payload


# --- webhook -----------------------------------------------------------------------------------------

def test_webhook_is_signed_and_the_receiver_can_verify_it():
    secret = "s3cret-key-for-hmac"
    item = incident(id=21)
    with LoopbackReceiver() as rx:
        rcv = receiver("webhook", rx.url + "/sentinel", secret=secret)
        got = deliver(notifiers.render(rcv, item, "trigger", NOW), rx)
    assert webhook.verify_signature(secret, got.body, got.headers["x-sentinel-signature"])
    assert got.headers["x-sentinel-signature"].startswith("sha256=")
    assert not webhook.verify_signature(secret, got.body + b" ", got.headers["x-sentinel-signature"])
    assert not webhook.verify_signature("other-key", got.body, got.headers["x-sentinel-signature"])
    assert not webhook.verify_signature(secret, got.body, None)
    body = got.json()
    assert body["version"] == "1" and body["event"] == "trigger" and body["receiver"] == "webhook"
    assert got.headers["x-sentinel-timestamp"] == str(body["sent_at"]) == str(int(NOW.timestamp()))
    assert got.headers["idempotency-key"] == "sentinel-21-webhook-trigger"
    fields = body["incident"]
    assert fields["id"] == 21 and fields["fingerprint"] == item.fingerprint and fields["evidence"]["xid"] == 79
    assert fields["labels"] == prose.labels(item) and fields["text"] == prose.text(item)
    assert [s["heading"] for s in fields["sections"]] == [h for h, _ in prose.sections(item)]
    assert parse_time(fields["opened_at"]) == item.opened_at and fields["resolved_at"] is None


def test_webhook_without_secret_is_unsigned():
    request = notifiers.render(receiver("webhook", "http://127.0.0.1:1/x"), incident(id=1), "resolve", NOW)
    assert "X-Sentinel-Signature" not in request.headers
    assert "http" not in repr(request)  # the URL (a secret for Slack) stays out of logs


# --- Alertmanager ------------------------------------------------------------------------------------

def check_postable_alerts(body: object) -> None:
    """Alertmanager API v2 postableAlerts: a list of {labels, annotations, startsAt, endsAt, generatorURL}."""
    assert isinstance(body, list) and body
    for alert in body:
        assert set(alert) == {"labels", "annotations", "startsAt", "endsAt", "generatorURL"}
        assert alert["labels"]["alertname"]
        for group in ("labels", "annotations"):
            for name, value in alert[group].items():
                assert LABEL_NAME.fullmatch(name) and isinstance(value, str), (group, name)
        assert parse_time(alert["startsAt"]) <= parse_time(alert["endsAt"])
        assert alert["generatorURL"].startswith("http")


def test_alertmanager_firing_and_resolved_alerts():
    item = incident(id=31, opened_at=NOW - timedelta(minutes=5))
    with LoopbackReceiver() as rx:
        rcv = receiver("alertmanager", rx.url + "/")
        firing = deliver(notifiers.render(rcv, item, "trigger", NOW, resend_seconds=60), rx)
        item.state, item.resolved_at = "resolved", NOW + timedelta(seconds=30)
        resolved = deliver(notifiers.render(rcv, item, "resolve", NOW + timedelta(seconds=31)), rx)
    assert firing.path == resolved.path == "/api/v2/alerts"
    for got in (firing, resolved):
        check_postable_alerts(got.json())
    alert = firing.json()[0]
    assert alert["labels"] == prose.labels(item)
    assert alert["annotations"]["summary"] == prose.headline(item)
    assert alert["annotations"]["description"].startswith("[CRITICAL] #31")
    assert alert["annotations"]["what_to_check"] == "check `nvidia-smi -q` on node-a\nreseat GPU 1 if it recurs"
    assert alert["annotations"]["what_sentinel_did"] == "- quarantined GPU-1\n- restarted job 7"
    assert parse_time(alert["startsAt"]) == item.opened_at
    assert parse_time(alert["endsAt"]) == NOW + timedelta(seconds=180)  # 3 × resend: expires if Sentinel dies
    assert parse_time(resolved.json()[0]["endsAt"]) == item.resolved_at
    assert alert["generatorURL"] == "http://127.0.0.1:9480/api/v1/incidents/31"
