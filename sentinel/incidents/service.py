"""Incident rows: open or update from a finding, acknowledge, resolve, list. Takes a session, never commits."""

from __future__ import annotations

from datetime import datetime
from typing import Any

from sqlalchemy import func, select
from sqlalchemy.orm import Session

from sentinel.incidents.findings import SEVERITY_ORDER, Finding
from sentinel.incidents.models import Incident

ACTIVE = ("open", "acknowledged")


class IncidentNotFound(LookupError):
    pass


class IncidentStateError(ValueError):
    """The change asked for does not fit the incident's state (e.g. acknowledging a resolved one)."""


def action(at: datetime, text: str) -> dict[str, Any]:
    return {"at": at.isoformat(), "text": text}


def find_active(session: Session, fingerprint: str) -> Incident | None:
    return session.scalars(select(Incident).where(Incident.fingerprint == fingerprint,
                                                  Incident.state.in_(ACTIVE))
                           .order_by(Incident.id.desc())).first()


def open_incident(session: Session, finding: Finding, now: datetime) -> Incident:
    observed = datetime.fromtimestamp(finding.observed_at, now.tzinfo) if finding.observed_at else now
    latency = (now - observed).total_seconds() if finding.observed_at else None
    incident = Incident(
        fingerprint=finding.fingerprint, detector=finding.detector, state="open", severity=finding.severity,
        title=finding.title[:512], layer=finding.layer, node=finding.subject.node,
        accelerator_uuid=finding.subject.accelerator, job_id=finding.subject.job_id, rank=finding.subject.rank,
        seen=finding.seen, comparison=finding.comparison, evidence=finding.evidence,
        recommended_action=finding.action, next_steps=list(finding.next_steps), latched=finding.latched,
        occurrences=finding.occurrences, observed_at=min(observed, now), opened_at=now,
        detection_latency_seconds=max(0.0, latency) if latency is not None else None, last_seen_at=now,
        actions=[action(now, f"opened by the {finding.detector} detector"
                        + (f" {latency:.3f}s after the agent observed it" if latency is not None else ""))])
    session.add(incident)
    session.flush()
    return incident


def update_incident(session: Session, incident: Incident, finding: Finding, now: datetime, *, repeat: bool) -> bool:
    """Refresh an active incident with the latest finding; True when its severity rose."""
    incident.last_seen_at = now
    incident.seen, incident.comparison, incident.evidence = finding.seen, finding.comparison, finding.evidence
    incident.title = finding.title[:512]
    if repeat:
        incident.occurrences += finding.occurrences
    raised = SEVERITY_ORDER.get(finding.severity, 0) > SEVERITY_ORDER.get(incident.severity, 0)
    if raised:
        incident.actions = [*incident.actions, action(now, f"severity raised from {incident.severity} to "
                                                           f"{finding.severity}")]
        incident.severity = finding.severity
    return raised


def get_incident(session: Session, incident_id: int) -> Incident:
    incident = session.get(Incident, incident_id)
    if incident is None:
        raise IncidentNotFound(f"incident {incident_id} does not exist")
    return incident


def acknowledge(session: Session, incident_id: int, *, actor: str, note: str, now: datetime) -> Incident:
    incident = get_incident(session, incident_id)
    if incident.state == "resolved":
        raise IncidentStateError(f"incident {incident_id} is already resolved")
    if incident.state == "acknowledged":
        return incident
    incident.state, incident.acknowledged_at, incident.acknowledged_by = "acknowledged", now, actor
    incident.actions = [*incident.actions, action(now, f"acknowledged by {actor}" + (f": {note}" if note else ""))]
    return incident


def resolve(session: Session, incident_id: int, *, actor: str, reason: str, now: datetime) -> Incident:
    incident = get_incident(session, incident_id)
    if incident.state == "resolved":
        return incident
    incident.state, incident.resolved_at, incident.resolved_by = "resolved", now, actor
    incident.resolve_reason = reason[:512]
    incident.actions = [*incident.actions, action(now, f"resolved by {actor}" + (f": {reason}" if reason else ""))]
    return incident


def add_action(incident: Incident, now: datetime, text: str) -> None:
    incident.actions = [*incident.actions, action(now, text)]


def list_incidents(session: Session, *, states: tuple[str, ...], severity: str | None = None,
                   node: str | None = None, job_id: int | None = None, detector: str | None = None,
                   limit: int = 100, offset: int = 0) -> tuple[list[Incident], int]:
    query = select(Incident).where(Incident.state.in_(states))
    if severity is not None:
        query = query.where(Incident.severity == severity)
    if node is not None:
        query = query.where(Incident.node == node)
    if job_id is not None:
        query = query.where(Incident.job_id == job_id)
    if detector is not None:
        query = query.where(Incident.detector == detector)
    total = session.scalar(select(func.count()).select_from(query.subquery())) or 0
    rows = session.scalars(query.order_by(Incident.id.desc()).limit(limit).offset(offset))
    return list(rows), int(total)


def active_incidents(session: Session) -> list[Incident]:
    return list(session.scalars(select(Incident).where(Incident.state.in_(ACTIVE))))
