"""Accelerator health: healthy → suspect → quarantined → healthy, and counts by health. Takes a session, never
commits. Which node an accelerator sits in is the nodes domain's (nodes/service.py)."""

from __future__ import annotations

from sqlalchemy import func, select
from sqlalchemy.orm import Session

from sentinel.accelerators.models import HEALTH_STATES, Accelerator
from sentinel.audit.service import record
from sentinel.db import utcnow
from sentinel.events.service import record_event


def count_by_health(session: Session) -> dict[str, int]:
    counts = dict.fromkeys(HEALTH_STATES, 0)
    query = select(Accelerator.health, func.count()).where(Accelerator.present.is_(True)).group_by(Accelerator.health)
    for health, count in session.execute(query):
        counts[health] = count
    return counts


def out_of_service(session: Session, uuids: list[str]) -> dict[str, str]:
    """Of `uuids`, those not healthy: uuid → health (quarantined, suspect)."""
    if not uuids:
        return {}
    return {uuid: health for uuid, health in session.execute(
        select(Accelerator.uuid, Accelerator.health).where(Accelerator.uuid.in_(uuids),
                                                           Accelerator.health != "healthy"))}


class AcceleratorNotFound(LookupError):
    pass


def get_accelerator(session: Session, uuid: str) -> Accelerator:
    acc = session.scalar(select(Accelerator).where(Accelerator.uuid == uuid))
    if acc is None:
        raise AcceleratorNotFound(f"accelerator {uuid!r} is not registered")
    return acc


def set_health(session: Session, acc: Accelerator, *, health: str, reason: str, actor: str,
               incident_id: int | None = None) -> bool:
    """healthy → suspect → quarantined → healthy, each change with its reason, incident, event and audit
    entry. Returns False when it already was in that state (the call is idempotent)."""
    if health not in HEALTH_STATES:
        raise ValueError(f"health must be one of {', '.join(HEALTH_STATES)}")
    if acc.health == health:
        return False
    previous = acc.health
    acc.health, acc.health_reason = health, reason[:512]
    acc.health_incident_id, acc.health_changed_at = incident_id, utcnow()
    record(session, actor=actor, action=f"accelerator.{health}", subject=f"accelerator/{acc.uuid}", reason=reason,
           detail={"from": previous, "to": health, "incident": incident_id})
    record_event(session, kind=f"accelerator_{health}", severity="warning" if health != "healthy" else "info",
                 node_id=acc.node_id, accelerator_uuid=acc.uuid,
                 message=f"accelerator {acc.uuid} {previous} → {health} by {actor}: {reason}",
                 data={"from": previous, "to": health, "incident": incident_id})
    return True
