"""Notifiers turn one incident event into one HTTP request for one kind of receiver.

Each kind is a module with `EVENTS` (the events it takes) and `render(...)`; the table below
registers them by name. Rendering is pure (no I/O), so the dispatcher owns every send and retry.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from typing import Protocol

from sentinel.alerting.notifiers import alertmanager, pagerduty, slack, webhook
from sentinel.alerting.notifiers.common import DEFAULT_EXTERNAL_URL, OutboundRequest
from sentinel.config import ReceiverConfig
from sentinel.incidents.models import Incident

__all__ = ["DEFAULT_EXTERNAL_URL", "NOTIFIERS", "Notifier", "OutboundRequest", "render", "sends"]


class Render(Protocol):
    def __call__(self, receiver: ReceiverConfig, incident: Incident, event: str, now: datetime, *,
                 external_url: str | None, resend_seconds: float, cell: str = "") -> OutboundRequest: ...


@dataclass(frozen=True)
class Notifier:
    events: tuple[str, ...]
    render: Render


NOTIFIERS: dict[str, Notifier] = {
    "alertmanager": Notifier(alertmanager.EVENTS, alertmanager.render),
    "webhook": Notifier(webhook.EVENTS, webhook.render),
    "slack": Notifier(slack.EVENTS, slack.render),
    "pagerduty": Notifier(pagerduty.EVENTS, pagerduty.render),
}


def sends(kind: str, event: str) -> bool:
    """Whether a receiver of `kind` is told about `event` at all (Alertmanager has no acknowledge)."""
    notifier = NOTIFIERS.get(kind)
    return notifier is not None and event in notifier.events


def render(receiver: ReceiverConfig, incident: Incident, event: str, now: datetime, *,
           external_url: str | None = None, resend_seconds: float = 60.0, cell: str = "") -> OutboundRequest:
    """The request that tells `receiver` about `event` on `incident`. ValueError for an unknown kind or event.
    `cell` (the server's `cell` setting) is added to the labels of what is sent."""
    notifier = NOTIFIERS.get(receiver.kind)
    if notifier is None:
        raise ValueError(f"no notifier for receiver kind {receiver.kind!r}")
    return notifier.render(receiver, incident, event, now, external_url=external_url or DEFAULT_EXTERNAL_URL,
                           resend_seconds=resend_seconds, cell=cell)
