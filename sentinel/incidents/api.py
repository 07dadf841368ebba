"""Incident routes: list and read for everyone with a token, acknowledge and resolve for operators."""

from __future__ import annotations

from typing import Annotated, Any, Literal

from fastapi import APIRouter, Body, Depends, HTTPException, Query
from sqlalchemy import select
from sqlalchemy.orm import Session, sessionmaker

from sentinel.alerting.models import Notification
from sentinel.alerting.schemas import NotificationOut
from sentinel.audit.service import record
from sentinel.auth.deps import OPERATE, READ, allow
from sentinel.auth.service import Principal
from sentinel.db import transaction
from sentinel.deps import MAX_ID, BigIdPath, IncidentLog, Offset, Sessions, not_found
from sentinel.errors import CONFLICT
from sentinel.incidents import render, service
from sentinel.incidents.lifecycle import Incidents
from sentinel.incidents.schemas import IncidentList, IncidentOut, IncidentUpdate

router = APIRouter(prefix="/incidents", tags=["incidents"])



# `GET /incidents/{id}` answers with the incident and the notifications sent about it (alerting's rows): the
# composite is assembled, and its schema declared, here at the edge.
class IncidentDetail(IncidentOut):
    evidence: dict[str, Any]
    text: str
    notifications: list[NotificationOut] = []


STATES = {"active": ("open", "acknowledged"), "open": ("open",), "acknowledged": ("acknowledged",),
          "resolved": ("resolved",), "all": ("open", "acknowledged", "resolved")}


@router.get("", response_model=IncidentList, dependencies=[Depends(allow(READ))])
def list_incidents(sessions: Sessions, state: Literal["active", "open", "acknowledged", "resolved", "all"] = "active",
                   severity: Literal["info", "warning", "critical"] | None = None,
                   node: Annotated[str | None, Query(max_length=128)] = None,
                   job: Annotated[int | None, Query(ge=1, le=MAX_ID)] = None,
                   detector: Annotated[str | None, Query(max_length=64)] = None,
                   limit: Annotated[int, Query(ge=1, le=1000)] = 100,
                   offset: Offset = 0) -> IncidentList:
    """Newest first. `state=active` (the default) is open and acknowledged ones."""
    with sessions() as session:
        rows, total = service.list_incidents(session, states=STATES[state], severity=severity, node=node,
                                             job_id=job, detector=detector, limit=limit, offset=offset)
        return IncidentList(incidents=[IncidentOut.model_validate(r) for r in rows], total=total)


@router.get("/{incident_id}", response_model=IncidentDetail, dependencies=[Depends(allow(READ))])
def get_incident(incident_id: BigIdPath, sessions: Sessions) -> IncidentDetail:
    """Everything: the evidence window, the comparison, what Sentinel did, what to check next, and the
    notifications sent about it."""
    with sessions() as session:
        try:
            incident = service.get_incident(session, incident_id)
        except service.IncidentNotFound as exc:
            raise not_found(exc) from exc
        notes = session.scalars(select(Notification).where(Notification.incident_id == incident_id)
                                .order_by(Notification.id))
        base = IncidentOut.model_validate(incident).model_dump()
        return IncidentDetail(**base, evidence=incident.evidence, text=render.text(incident),
                              notifications=[NotificationOut.model_validate(n) for n in notes])


def _change(sessions: sessionmaker[Session], incidents: Incidents, incident_id: int, who: Principal, what: str,
            note: str) -> IncidentOut:
    try:
        if what == "ack":
            out = incidents.acknowledge(incident_id, actor=who.actor, note=note)
        else:
            out = incidents.resolve(incident_id, actor=who.actor, reason=note or "resolved by an operator")
    except service.IncidentNotFound as exc:
        raise not_found(exc) from exc
    except service.IncidentStateError as exc:
        raise HTTPException(409, str(exc)) from exc
    with transaction(sessions) as session:
        record(session, actor=who.actor, action=f"incident.{what}", subject=f"incident/{incident_id}", reason=note)
    return out


@router.post("/{incident_id}/ack", response_model=IncidentOut, responses=CONFLICT)
def acknowledge(incident_id: BigIdPath, sessions: Sessions, incidents: IncidentLog,
                who: Annotated[Principal, Depends(allow(OPERATE))],
                body: Annotated[IncidentUpdate | None, Body()] = None) -> IncidentOut:
    """Someone is on it: stops re-escalation (PagerDuty acknowledge). Acknowledging twice is a no-op."""
    return _change(sessions, incidents, incident_id, who, "ack", (body or IncidentUpdate()).note)


@router.post("/{incident_id}/resolve", response_model=IncidentOut, responses=CONFLICT)
def resolve(incident_id: BigIdPath, sessions: Sessions, incidents: IncidentLog,
            who: Annotated[Principal, Depends(allow(OPERATE))],
            body: Annotated[IncidentUpdate | None, Body()] = None) -> IncidentOut:
    """Close it by hand; receivers that were paged get a resolve. Resolving twice is a no-op."""
    return _change(sessions, incidents, incident_id, who, "resolve", (body or IncidentUpdate()).note)
