"""Silence and notification routes (mounted under /api/v1): operators mute, everyone with a token reads."""

from __future__ import annotations

import logging
from datetime import datetime, timedelta
from typing import Annotated

from fastapi import APIRouter, Depends, HTTPException, Query

from sentinel.alerting import service
from sentinel.alerting.models import Silence
from sentinel.alerting.schemas import DeliveryAttemptOut, NotificationOut, SilenceCreate, SilenceOut
from sentinel.audit.service import record
from sentinel.auth.deps import OPERATE, READ, allow
from sentinel.auth.service import Principal
from sentinel.clock import to_datetime
from sentinel.db import transaction
from sentinel.deps import IdPath, IdQuery, Outbox, ServerClock, Sessions, not_found

log = logging.getLogger("sentinel.alerting")
router = APIRouter(tags=["alerting"])



def _out(silence: Silence, now: datetime) -> SilenceOut:
    return SilenceOut.model_validate(silence).model_copy(
        update={"active": silence.starts_at <= now < silence.ends_at})


@router.get("/silences", response_model=list[SilenceOut], dependencies=[Depends(allow(READ))])
def get_silences(clock: ServerClock, sessions: Sessions,
                 include_expired: Annotated[bool, Query(alias="all")] = False) -> list[SilenceOut]:
    """Active and future silences; `?all=true` adds expired ones."""
    now = to_datetime(clock.time())
    with sessions() as session:
        return [_out(s, now) for s in service.list_silences(session, now=now, active_only=not include_expired)]


@router.get("/silences/{silence_id}", response_model=SilenceOut, dependencies=[Depends(allow(READ))])
def get_silence(silence_id: IdPath, sessions: Sessions, clock: ServerClock) -> SilenceOut:
    with sessions() as session:
        silence = session.get(Silence, silence_id)
        if silence is None:
            raise not_found(LookupError(f"no silence {silence_id}"))
        return _out(silence, to_datetime(clock.time()))


@router.post("/silences", response_model=SilenceOut, status_code=201)
def post_silence(spec: SilenceCreate, clock: ServerClock, sessions: Sessions,
                 who: Annotated[Principal, Depends(allow(OPERATE))]) -> SilenceOut:
    now = to_datetime(clock.time())
    ends_at = spec.ends_at or now + timedelta(seconds=spec.duration_seconds or 0)
    matchers = [m.model_dump() for m in spec.matchers]
    try:
        with transaction(sessions) as session:
            silence = service.create_silence(session, matchers=matchers, ends_at=ends_at, now=now,
                                             created_by=who.actor, comment=spec.comment)
            record(session, actor=who.actor, action="silence.create", subject=f"silence/{silence.id}",
                   reason=spec.comment, detail={"matchers": silence.matchers, "ends_at": ends_at.isoformat()})
            out = _out(silence, now)
    except ValueError as exc:
        raise HTTPException(422, str(exc)) from exc
    log.info("silence created: silence=%d ends_at=%s matchers=%d by=%s", out.id, out.ends_at.isoformat(),
             len(out.matchers), who.actor)
    return out


@router.delete("/silences/{silence_id}", response_model=SilenceOut)
def delete_silence(silence_id: IdPath, clock: ServerClock, sessions: Sessions, outbox: Outbox,
                   who: Annotated[Principal, Depends(allow(OPERATE))]) -> SilenceOut:
    """Expire now. Notifications it held back for still-open incidents go out."""
    now = to_datetime(clock.time())
    try:
        with transaction(sessions) as session:
            silence = service.expire_silence(session, silence_id, now)
            released = service.unsilence_expired(session, now)
            record(session, actor=who.actor, action="silence.expire", subject=f"silence/{silence_id}",
                   detail={"released_notifications": len(released)})
            out = _out(silence, now)
    except LookupError as exc:
        raise not_found(exc) from exc
    log.info("silence expired: silence=%d released=%d by=%s", silence_id, len(released), who.actor)
    if released:
        outbox.wake()
    return out


@router.get("/notifications", response_model=list[NotificationOut], dependencies=[Depends(allow(READ))])
def get_notifications(sessions: Sessions, incident: IdQuery = None,
                      limit: Annotated[int, Query(ge=1, le=1000)] = 100) -> list[NotificationOut]:
    """Newest first, each with its delivery attempts."""
    with sessions() as session:
        rows = service.list_notifications(session, incident_id=incident, limit=limit)
        attempts = service.attempts_of(session, [r.id for r in rows])
        return [NotificationOut.model_validate(r).model_copy(update={
            "delivery_attempts": [DeliveryAttemptOut.model_validate(a) for a in attempts[r.id]]}) for r in rows]
