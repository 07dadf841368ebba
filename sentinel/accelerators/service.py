from __future__ import annotations

from datetime import datetime

from sqlalchemy import func, select
from sqlalchemy.orm import Session

from sentinel.accelerators.models import HEALTH_STATES, Accelerator
from sentinel.audit.service import record
from sentinel.db import utcnow
from sentinel.events.models import Event
from sentinel.events.service import record_event
from sentinel.nodes.models import Node


def list_accelerators(session: Session, *, node: str | None = None, health: str | None = None,
                      limit: int = 1000, offset: int = 0) -> list[tuple[Accelerator, str]]:
    query = (select(Accelerator, Node.name).join(Node, Node.id == Accelerator.node_id)
             .order_by(Node.name, Accelerator.index).limit(limit).offset(offset))
    if node is not None:
        query = query.where(Node.name == node)
    if health is not None:
        query = query.where(Accelerator.health == health)
    return [(acc, name) for acc, name in session.execute(query)]


def count_by_health(session: Session) -> dict[str, int]:
    counts = dict.fromkeys(HEALTH_STATES, 0)
    query = select(Accelerator.health, func.count()).where(Accelerator.present.is_(True)).group_by(Accelerator.health)
    for health, count in session.execute(query):
        counts[health] = count
    return counts


HARDWARE_FAULTS = ("xid", "ecc", "offline", "remap")


def fault_rates(session: Session, now: datetime) -> list[tuple[str, int, float]]:
    """(node, hardware faults, accelerator-days observed) per node, for failures per 1,000 accelerator-days."""
    query = (select(Node.name, func.count(Event.id)).join(Event, Event.node_id == Node.id)
             .where(Event.kind.in_(HARDWARE_FAULTS), Event.severity == "critical").group_by(Node.name))
    faults: dict[str, int] = {name: count for name, count in session.execute(query)}
    days: dict[str, float] = {}
    for name, registered in session.execute(select(Node.name, Accelerator.registered_at)
                                            .join(Node, Node.id == Accelerator.node_id)):
        days[name] = days.get(name, 0.0) + max(0.0, (now - registered).total_seconds()) / 86400.0
    return [(name, int(faults.get(name, 0)), days.get(name, 0.0)) for name in sorted(set(days) | set(faults))]


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
