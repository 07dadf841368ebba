"""Generic webhook: the whole incident as JSON, signed with HMAC-SHA256 so a receiver can trust it.

Headers: `X-Sentinel-Signature: sha256=<hex HMAC of the raw body>`, `X-Sentinel-Timestamp` (unix
seconds, also inside the signed body as `sent_at`, so a receiver can refuse stale replays) and
`Idempotency-Key`, the same for every retry of one notification, so a receiver can drop duplicates.
"""

from __future__ import annotations

import hashlib
import hmac
from datetime import datetime
from typing import Any

from sqlalchemy import inspect

from sentinel.alerting.config import ReceiverConfig
from sentinel.alerting.notifiers.common import EVENTS, OutboundRequest, check_event, incident_url, json_body
from sentinel.incidents import render as prose
from sentinel.incidents.models import Incident

VERSION = "1"
SIGNATURE_HEADER = "X-Sentinel-Signature"
TIMESTAMP_HEADER = "X-Sentinel-Timestamp"


def sign(secret: str, body: bytes) -> str:
    return "sha256=" + hmac.new(secret.encode(), body, hashlib.sha256).hexdigest()


def verify_signature(secret: str, body: bytes, header: str | None) -> bool:
    """For receivers: True when `header` is the signature of `body` under `secret` (constant-time compare)."""
    if not secret or not header:
        return False
    return hmac.compare_digest(sign(secret, body).encode(), header.strip().encode())


def idempotency_key(incident: Incident, receiver: ReceiverConfig, event: str) -> str:
    """Identity of the notification row: (incident, receiver, event) is unique in the outbox."""
    return f"sentinel-{incident.id}-{receiver.name}-{event}"


def incident_fields(incident: Incident) -> dict[str, Any]:
    """Every column of the incident, plus the rendered labels, text and sections."""
    fields = {attr.key: getattr(incident, attr.key) for attr in inspect(Incident).column_attrs}
    fields["labels"] = prose.labels(incident)
    fields["subject"] = prose.subject(incident)
    fields["headline"] = prose.headline(incident)
    fields["text"] = prose.text(incident)
    fields["sections"] = [{"heading": h, "text": t} for h, t in prose.sections(incident)]
    return fields


def render(receiver: ReceiverConfig, incident: Incident, event: str, now: datetime, *,
           external_url: str | None, resend_seconds: float) -> OutboundRequest:
    check_event("webhook", event, EVENTS)
    sent_at = int(now.timestamp())
    body = json_body({"version": VERSION, "event": event, "receiver": receiver.name, "sent_at": sent_at,
                      "url": incident_url(external_url, incident.id), "incident": incident_fields(incident)})
    headers = {"Content-Type": "application/json", "User-Agent": "sentinel-webhook/" + VERSION,
               "X-Sentinel-Event": event, TIMESTAMP_HEADER: str(sent_at),
               "Idempotency-Key": idempotency_key(incident, receiver, event)}
    secret = receiver.resolved_secret()
    if secret:
        headers[SIGNATURE_HEADER] = sign(secret, body)
    return OutboundRequest(url=receiver.url, headers=headers, body=body)
