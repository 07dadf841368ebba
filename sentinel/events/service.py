from __future__ import annotations

from datetime import datetime
from typing import Any

from sqlalchemy import select
from sqlalchemy.orm import Session

from sentinel.db import utcnow
from sentinel.events.models import Event

# The severity an event the agent reports is stored with, by kind (hardware faults are critical).
EVENT_SEVERITY = {"xid": "critical", "ecc": "critical", "offline": "critical", "remap": "critical",
                  "hang": "warning", "slow": "warning", "thermal": "warning", "power": "warning",
                  "clear": "info", "probe": "info", "link_down": "critical", "link_up": "info", "other": "info"}


def record_event(session: Session, *, kind: str, message: str, severity: str = "info",
                 node_id: int | None = None, accelerator_uuid: str | None = None, job_id: int | None = None,
                 data: dict[str, Any] | None = None, observed_at: datetime | None = None) -> Event:
    now = utcnow()
    event = Event(kind=kind, severity=severity, node_id=node_id, accelerator_uuid=accelerator_uuid,
                  job_id=job_id, message=message, data=data or {}, observed_at=observed_at or now,
                  recorded_at=now)
    session.add(event)
    return event


def list_events(session: Session, *, node_id: int | None = None, kind: str | None = None,
                accelerator_uuid: str | None = None, limit: int = 100) -> list[Event]:
    query = select(Event).order_by(Event.id.desc()).limit(limit)
    if node_id is not None:
        query = query.where(Event.node_id == node_id)
    if kind is not None:
        query = query.where(Event.kind == kind)
    if accelerator_uuid is not None:
        query = query.where(Event.accelerator_uuid == accelerator_uuid)
    return list(session.scalars(query))
