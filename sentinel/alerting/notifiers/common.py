"""Pieces every notifier shares: the request it returns, time and JSON formats, links, clipping."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

DEFAULT_EXTERNAL_URL = "http://127.0.0.1:9480"
EVENTS = ("trigger", "acknowledge", "resolve")


@dataclass(frozen=True)
class OutboundRequest:
    """One HTTP POST, fully rendered. Not in repr: a Slack URL and a PagerDuty body carry secrets."""

    url: str = field(repr=False)
    headers: dict[str, str] = field(repr=False)
    body: bytes = field(repr=False)


def rfc3339(moment: datetime) -> str:
    """`2025-01-02T03:04:05.678Z`: what Alertmanager, PagerDuty and most receivers parse."""
    return moment.astimezone(UTC).isoformat(timespec="milliseconds").replace("+00:00", "Z")


def json_body(payload: Any) -> bytes:
    return json.dumps(payload, ensure_ascii=False, separators=(",", ":"), default=_jsonable).encode()


def _jsonable(value: Any) -> Any:
    if isinstance(value, datetime):
        return rfc3339(value)
    raise TypeError(f"{type(value).__name__} is not JSON serialisable")


def base_url(external_url: str | None) -> str:
    return (external_url or DEFAULT_EXTERNAL_URL).rstrip("/")


def incident_url(external_url: str | None, incident_id: int) -> str:
    return f"{base_url(external_url)}/api/v1/incidents/{incident_id}"


def with_cell(labels: dict[str, str], cell: str) -> dict[str, str]:
    """The labels plus `cell` when this server belongs to one (docs/cells.md); unchanged otherwise."""
    return {**labels, "cell": cell} if cell else labels


def clip(text: str, limit: int, marker: str = "…") -> str:
    """Cut to at most `limit` characters, at a line or word end when one is near, and say it was cut."""
    if len(text) <= limit:
        return text
    room = max(limit - len(marker), 0)
    cut = text[:room]
    for sep in ("\n", " "):
        at = cut.rfind(sep)
        if at >= room * 0.8:
            cut = cut[:at]
            break
    return cut.rstrip() + marker


def check_event(kind: str, event: str, events: tuple[str, ...]) -> None:
    if event not in events:
        raise ValueError(f"{kind} receivers take {', '.join(events)} events, not {event!r}")
