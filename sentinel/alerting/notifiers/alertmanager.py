"""Alertmanager: `POST {url}/api/v2/alerts` with a list of alerts.

Alertmanager expects a client to re-send firing alerts before their `endsAt` (the dispatcher's
`refresh_alertmanager`), so a firing alert ends 3 resend periods ahead: if Sentinel dies, the
alert expires on its own instead of firing forever. A resolved alert ends at the resolve time.
Alertmanager has no "acknowledged" state; acks are not sent here.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from datetime import datetime, timedelta

from sentinel.alerting.notifiers.common import OutboundRequest, check_event, incident_url, json_body, rfc3339, with_cell
from sentinel.config import ReceiverConfig
from sentinel.incidents import render as prose
from sentinel.incidents.models import Incident

EVENTS = ("trigger", "resolve")


def annotation_key(heading: str) -> str:
    """`What to check next` → `what_to_check_next` (annotation names follow label-name rules)."""
    return re.sub(r"[^a-z0-9]+", "_", heading.lower()).strip("_")


def alert(incident: Incident, now: datetime, *, external_url: str | None, resend_seconds: float,
          resolved: bool | None = None, cell: str = "") -> dict[str, object]:
    """One postable alert. Labels identify it (so they never change while it fires); annotations carry the text.

    `resolved` defaults to the incident's state; a resolve event passes True. `cell` joins the labels: two cells'
    incidents on a node of the same name are then two alerts, not one.
    """
    annotations = {"summary": prose.headline(incident), "description": prose.text(incident),
                   "incident_url": incident_url(external_url, incident.id),
                   "recommended_action": incident.recommended_action, "state": incident.state}
    for heading, body in prose.sections(incident):
        annotations[annotation_key(heading)] = body
    if incident.next_steps:
        annotations["what_to_check"] = "\n".join(incident.next_steps)
    runbook = (incident.evidence or {}).get("runbook_url")
    if isinstance(runbook, str) and runbook:
        annotations["runbook_url"] = runbook
    if resolved is None:
        resolved = incident.state == "resolved"
    ends = (incident.resolved_at or now) if resolved else now + timedelta(seconds=3 * resend_seconds)
    return {"labels": with_cell(prose.labels(incident), cell), "annotations": annotations,
            "startsAt": rfc3339(incident.opened_at), "endsAt": rfc3339(ends),
            "generatorURL": incident_url(external_url, incident.id)}


def alerts_request(receiver: ReceiverConfig, incidents: Iterable[Incident], now: datetime, *,
                   external_url: str | None, resend_seconds: float, resolved: bool | None = None,
                   cell: str = "") -> OutboundRequest:
    """Several incidents in one POST, as the periodic refresh sends them."""
    body = [alert(i, now, external_url=external_url, resend_seconds=resend_seconds, resolved=resolved, cell=cell)
            for i in incidents]
    return OutboundRequest(url=receiver.url.rstrip("/") + "/api/v2/alerts",
                           headers={"Content-Type": "application/json"}, body=json_body(body))


def render(receiver: ReceiverConfig, incident: Incident, event: str, now: datetime, *,
           external_url: str | None, resend_seconds: float, cell: str = "") -> OutboundRequest:
    check_event("alertmanager", event, EVENTS)
    return alerts_request(receiver, [incident], now, external_url=external_url, resend_seconds=resend_seconds,
                          resolved=event == "resolve", cell=cell)
