"""PagerDuty Events API v2: one event per notification, `dedup_key` = the incident's fingerprint.

The dedup key makes a re-sent trigger (at-least-once delivery) land on the same PagerDuty alert,
and lets acknowledge and resolve find it. Only a trigger carries `payload`; the routing key is the
receiver's secret and is never logged.
"""

from __future__ import annotations

from datetime import datetime
from typing import Any

from sentinel.alerting.notifiers.common import (
    EVENTS,
    OutboundRequest,
    base_url,
    check_event,
    clip,
    incident_url,
    json_body,
    rfc3339,
    with_cell,
)
from sentinel.config import ReceiverConfig
from sentinel.incidents import render as prose
from sentinel.incidents.models import Incident

SUMMARY_MAX = 1024
DEDUP_KEY_MAX = 255
SEVERITY = {"critical": "critical", "warning": "warning", "info": "info"}


def source(incident: Incident) -> str:
    """The affected system: the node if known, else the accelerator, else the job, else the fleet."""
    if incident.node:
        return incident.node
    if incident.accelerator_uuid:
        return incident.accelerator_uuid
    if incident.job_id is not None:
        return f"job-{incident.job_id}"
    return "sentinel-fleet"


def trigger_payload(incident: Incident, cell: str = "") -> dict[str, Any]:
    details: dict[str, Any] = {heading: body for heading, body in prose.sections(incident)}
    details |= {"labels": with_cell(prose.labels(incident), cell), "recommended_action": incident.recommended_action,
                "evidence": incident.evidence or {}}
    out: dict[str, Any] = {"summary": clip(prose.headline(incident), SUMMARY_MAX), "source": source(incident),
                           "severity": SEVERITY.get(incident.severity, "error"),
                           "timestamp": rfc3339(incident.opened_at),
                           "component": incident.accelerator_uuid or incident.layer,
                           "class": incident.detector, "custom_details": details}
    if incident.job_id is not None:
        out["group"] = f"job-{incident.job_id}"
    elif incident.node:
        out["group"] = incident.node
    return out


def dedup_key(incident: Incident, cell: str = "") -> str:
    """The fingerprint, behind the cell where there is one: cells may reuse node names; PagerDuty must not merge
    two cells' incidents into one."""
    return (f"{cell}/{incident.fingerprint}" if cell else incident.fingerprint)[:DEDUP_KEY_MAX]


def event_body(receiver: ReceiverConfig, incident: Incident, event: str, external_url: str | None,
               cell: str = "") -> dict[str, Any]:
    body: dict[str, Any] = {"routing_key": receiver.resolved_secret(), "event_action": event,
                            "dedup_key": dedup_key(incident, cell)}
    if event == "trigger":
        body["payload"] = trigger_payload(incident, cell)
        body["links"] = [{"href": incident_url(external_url, incident.id), "text": f"Sentinel incident #{incident.id}"}]
        body["client"] = "Sentinel"
        body["client_url"] = base_url(external_url)
    return body


def render(receiver: ReceiverConfig, incident: Incident, event: str, now: datetime, *,
           external_url: str | None, resend_seconds: float, cell: str = "") -> OutboundRequest:
    check_event("pagerduty", event, EVENTS)
    return OutboundRequest(url=receiver.url, headers={"Content-Type": "application/json"},
                           body=json_body(event_body(receiver, incident, event, external_url, cell)))
