"""Slack incoming webhook: Block Kit blocks plus a `text` fallback for notifications and old clients.

Limits kept (Block Kit reference): header plain_text ≤ 150 chars, section text ≤ 3000, section
fields ≤ 10 of ≤ 2000 each, ≤ 50 blocks per message. `&`, `<` and `>` are escaped in mrkdwn, and
text is cut before escaping, so a cut never splits an entity.
"""

from __future__ import annotations

from datetime import datetime
from typing import Any

from sentinel.alerting.notifiers.common import EVENTS, OutboundRequest, check_event, clip, incident_url, json_body
from sentinel.config import ReceiverConfig
from sentinel.incidents import render as prose
from sentinel.incidents.models import Incident

HEADER_MAX = 150
TEXT_MAX = 3000
FIELD_MAX = 2000
BLOCKS_MAX = 50
ICONS = {"critical": ":rotating_light:", "warning": ":warning:", "info": ":information_source:"}


def escape(text: str) -> str:
    return text.replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")


def mrkdwn(text: str, limit: int = TEXT_MAX) -> str:
    """Escaped mrkdwn of at most `limit` characters."""
    room = limit
    while True:
        out = escape(clip(text, room))
        if len(out) <= limit:
            return out
        room -= len(out) - limit


def header(text: str) -> dict[str, Any]:
    return {"type": "header", "text": {"type": "plain_text", "text": clip(text, HEADER_MAX), "emoji": True}}


def section(heading: str, body: str) -> dict[str, Any]:
    title = f"*{escape(heading)}*\n"
    return {"type": "section", "text": {"type": "mrkdwn", "text": title + mrkdwn(body, TEXT_MAX - len(title))}}


def field(name: str, value: str) -> dict[str, str]:
    title = f"*{name}*\n"
    return {"type": "mrkdwn", "text": title + mrkdwn(value, FIELD_MAX - len(title))}


def context(incident: Incident, external_url: str | None, cell: str = "") -> dict[str, Any]:
    link = f"<{incident_url(external_url, incident.id)}|incident #{incident.id}>"
    line = f"fingerprint `{mrkdwn(incident.fingerprint, 300)}` · detector {escape(incident.detector)} · {link}"
    if cell:
        line = f"cell {escape(cell)} · {line}"
    return {"type": "context", "elements": [{"type": "mrkdwn", "text": line}]}


def trigger_blocks(incident: Incident, external_url: str | None) -> list[dict[str, Any]]:
    icon = ICONS.get(incident.severity, "")
    facts = {"Severity": incident.severity.upper(), "Subject": prose.subject(incident),
             "Layer": prose.LAYER_NAMES.get(incident.layer, incident.layer), "State": incident.state}
    blocks = [header(f"{icon} {prose.headline(incident)}".strip()),
              {"type": "section", "fields": [field(k, v) for k, v in facts.items()]}]
    blocks.extend(section(heading, body) for heading, body in prose.sections(incident))
    return blocks


def resolve_blocks(incident: Incident) -> list[dict[str, Any]]:
    blocks = [header(f":white_check_mark: Resolved: #{incident.id} {incident.title}")]
    who = incident.resolved_by or "Sentinel"
    line = f"Resolved by {who}" + (f": {incident.resolve_reason}" if incident.resolve_reason else "")
    blocks.append({"type": "section", "text": {"type": "mrkdwn", "text": mrkdwn(line)}})
    return blocks


def acknowledge_text(incident: Incident) -> str:
    return f"#{incident.id} {incident.title} acknowledged by {incident.acknowledged_by or 'someone'}"


def payload(incident: Incident, event: str, external_url: str | None, cell: str = "") -> dict[str, Any]:
    if event == "trigger":
        fallback = f"{prose.headline(incident)} — {prose.subject(incident)}"
        blocks = trigger_blocks(incident, external_url)
    elif event == "resolve":
        fallback = f"Resolved: #{incident.id} {incident.title}"
        blocks = resolve_blocks(incident)
    else:
        fallback = acknowledge_text(incident)
        blocks = [{"type": "section", "text": {"type": "mrkdwn", "text": ":eyes: " + mrkdwn(fallback)}}]
    blocks = [*blocks[:BLOCKS_MAX - 1], context(incident, external_url, cell)]
    return {"text": mrkdwn(fallback), "blocks": blocks}


def render(receiver: ReceiverConfig, incident: Incident, event: str, now: datetime, *,
           external_url: str | None, resend_seconds: float, cell: str = "") -> OutboundRequest:
    check_event("slack", event, EVENTS)
    return OutboundRequest(url=receiver.url, headers={"Content-Type": "application/json"},
                           body=json_body(payload(incident, event, external_url, cell)))
