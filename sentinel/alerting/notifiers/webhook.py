"""Generic webhook: the whole incident as JSON, signed with HMAC-SHA256 so a receiver can trust it.

Headers: `X-Sentinel-Signature: sha256=<hex HMAC of the raw body>`, `X-Sentinel-Timestamp` (unix
seconds, also inside the signed body as `sent_at`, so a receiver can refuse stale replays) and
`Idempotency-Key`, the same for every retry of one notification, so a receiver can drop duplicates.
The signature covers `sent_at`, so a replayed body cannot be given a fresh time: a receiver calls
`verify_signature(secret, body, header, max_age_seconds=REPLAY_TOLERANCE_SECONDS)`. Launcher order
webhooks (remediation/orders.py) are signed the same way.
"""

from __future__ import annotations

import hashlib
import hmac
import json
import time
from datetime import datetime
from typing import Any

from sqlalchemy import inspect

from sentinel.alerting.notifiers.common import EVENTS, OutboundRequest, check_event, incident_url, json_body, with_cell
from sentinel.config import ReceiverConfig
from sentinel.incidents import render as prose
from sentinel.incidents.models import Incident

VERSION = "1"
SIGNATURE_HEADER = "X-Sentinel-Signature"
TIMESTAMP_HEADER = "X-Sentinel-Timestamp"
REPLAY_TOLERANCE_SECONDS = 300.0  # what a receiver should allow for clock skew and retries in flight


def sign(secret: str, body: bytes) -> str:
    return "sha256=" + hmac.new(secret.encode(), body, hashlib.sha256).hexdigest()


def verify_signature(secret: str, body: bytes, header: str | None, *, max_age_seconds: float | None = None,
                     now: float | None = None, timestamp_header: str | None = None) -> bool:
    """For receivers: True when `header` is the signature of `body` under `secret` (constant-time compare)
    and, with `max_age_seconds`, the signed `sent_at` in the body is within that many seconds of `now`
    (default: the current time) and agrees with `timestamp_header` when one is given. Pass
    `max_age_seconds=REPLAY_TOLERANCE_SECONDS` to refuse replays of old, validly signed bodies."""
    if not secret or not header:
        return False
    if not hmac.compare_digest(sign(secret, body).encode(), header.strip().encode()):
        return False
    if max_age_seconds is None:
        return True
    sent_at = signed_time(body)
    if sent_at is None:
        return False
    if timestamp_header is not None and timestamp_header.strip() != str(sent_at):
        return False
    return abs((time.time() if now is None else now) - sent_at) <= max_age_seconds


def signed_time(body: bytes) -> int | None:
    """The `sent_at` (unix seconds) inside a signed body, or None when there is none."""
    try:
        value = json.loads(body).get("sent_at")
    except (ValueError, AttributeError):
        return None
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def idempotency_key(incident: Incident, receiver: ReceiverConfig, event: str) -> str:
    """Identity of the notification row: (incident, receiver, event) is unique in the outbox."""
    return f"sentinel-{incident.id}-{receiver.name}-{event}"


def incident_fields(incident: Incident, cell: str = "") -> dict[str, Any]:
    """Every column of the incident, plus the rendered labels (with the server's cell), text and sections."""
    fields = {attr.key: getattr(incident, attr.key) for attr in inspect(Incident).column_attrs}
    fields["labels"] = with_cell(prose.labels(incident), cell)
    fields["subject"] = prose.subject(incident)
    fields["headline"] = prose.headline(incident)
    fields["text"] = prose.text(incident)
    fields["sections"] = [{"heading": h, "text": t} for h, t in prose.sections(incident)]
    return fields


def render(receiver: ReceiverConfig, incident: Incident, event: str, now: datetime, *,
           external_url: str | None, resend_seconds: float, cell: str = "") -> OutboundRequest:
    check_event("webhook", event, EVENTS)
    sent_at = int(now.timestamp())
    message: dict[str, Any] = {"version": VERSION, "event": event, "receiver": receiver.name, "sent_at": sent_at,
                               "url": incident_url(external_url, incident.id),
                               "incident": incident_fields(incident, cell)}
    if cell:
        message["cell"] = cell
    body = json_body(message)
    headers = {"Content-Type": "application/json", "User-Agent": "sentinel-webhook/" + VERSION,
               "X-Sentinel-Event": event, TIMESTAMP_HEADER: str(sent_at),
               "Idempotency-Key": idempotency_key(incident, receiver, event)}
    secret = receiver.resolved_secret()
    if secret:
        headers[SIGNATURE_HEADER] = sign(secret, body)
    return OutboundRequest(url=receiver.url, headers=headers, body=body)
