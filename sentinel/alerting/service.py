"""Alerting logic: which receivers hear about an incident (routes, silences) and the outbox rows that
say so. Called inside the transaction that changes the incident; nothing here commits or sends."""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping, Sequence
from datetime import datetime, timedelta
from functools import lru_cache
from typing import Any

from sqlalchemy import or_, select
from sqlalchemy.orm import Session

from sentinel.alerting import notifiers
from sentinel.alerting.models import DeliveryAttempt, Notification, Silence
from sentinel.config import ReceiverConfig, Settings
from sentinel.incidents import render
from sentinel.incidents.findings import SEVERITY_ORDER
from sentinel.incidents.models import Incident

FOLLOW_UPS = ("acknowledge", "resolve")
LABEL_NAME = re.compile(r"[a-zA-Z_][a-zA-Z0-9_]*")
MAX_MATCHERS = 32
MAX_SILENCE = timedelta(days=365)


# --- routing -----------------------------------------------------------------------------------------

def routes(receiver: ReceiverConfig, labels: Mapping[str, str]) -> bool:
    """Severity at least the receiver's minimum, and every `match` entry equal to the label ("a|b": either)."""
    if SEVERITY_ORDER.get(labels.get("severity", ""), 0) < SEVERITY_ORDER[receiver.min_severity]:
        return False
    return all(labels.get(name, "") in wanted.split("|") for name, wanted in receiver.match.items())


def notify(session: Session, incident: Incident, event: str, settings: Settings, now: datetime) -> list[Notification]:
    """Queue the notifications `event` on `incident` owes; returns the rows created (none twice, ever).

    A trigger goes to every receiver whose route matches, muted (`silenced`) while a silence matches.
    Acknowledge and resolve follow only a trigger that was queued, delivered or silenced (a silenced
    trigger's follow-up is silenced too); resolve only where `send_resolved`, acknowledge only where
    the kind has one (not Alertmanager).
    """
    if event not in ("trigger", *FOLLOW_UPS):
        raise ValueError(f"unknown notification event {event!r}")
    if incident.id is None:
        session.flush()
    existing = {n.receiver for n in session.scalars(
        select(Notification).where(Notification.incident_id == incident.id, Notification.event == event))}
    if event == "trigger":
        planned = _plan_trigger(session, incident, settings, now)
    else:
        planned = _plan_follow_up(session, incident, event, settings)
    created = []
    for receiver, state, silence_id in planned:
        if receiver.name in existing:
            continue
        row = Notification(incident_id=incident.id, receiver=receiver.name, kind=receiver.kind, event=event,
                           state=state, silence_id=silence_id, attempts=0, next_attempt_at=now, last_error="",
                           created_at=now)
        session.add(row)
        created.append(row)
    if created:
        session.flush()
    return created


Plan = list[tuple[ReceiverConfig, str, int | None]]


def _plan_trigger(session: Session, incident: Incident, settings: Settings, now: datetime) -> Plan:
    labels = render.labels(incident)
    chosen = [r for r in settings.receivers if routes(r, labels)]
    if not chosen:
        return []
    silence = matching_silence(session, labels, now)
    if silence is not None:
        return [(r, "silenced", silence.id) for r in chosen]
    return [(r, "pending", None) for r in chosen]


def _plan_follow_up(session: Session, incident: Incident, event: str, settings: Settings) -> Plan:
    by_name = {r.name: r for r in settings.receivers}
    triggers = session.scalars(select(Notification).where(
        Notification.incident_id == incident.id, Notification.event == "trigger",
        Notification.state.in_(("pending", "delivered", "silenced"))).order_by(Notification.id))
    plan: Plan = []
    for trigger in triggers:
        receiver = by_name.get(trigger.receiver)
        if receiver is None or not notifiers.sends(receiver.kind, event):
            continue
        if event == "resolve" and not receiver.send_resolved:
            continue
        if trigger.state == "silenced":
            plan.append((receiver, "silenced", trigger.silence_id))
        else:
            plan.append((receiver, "pending", None))
    return plan


# --- silences ------------------------------------------------------------------------------------------

def normalise_matchers(matchers: Sequence[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """Alertmanager-style matchers {name, value, is_regex, is_equal}, checked. ValueError says what is wrong."""
    if not matchers:
        raise ValueError("a silence needs at least one matcher")
    if len(matchers) > MAX_MATCHERS:
        raise ValueError(f"a silence takes at most {MAX_MATCHERS} matchers, got {len(matchers)}")
    out = []
    for i, m in enumerate(matchers):
        name, value = str(m.get("name", "")), str(m.get("value", ""))
        if not LABEL_NAME.fullmatch(name):
            raise ValueError(f"matcher {i}: label name {name!r} must match [a-zA-Z_][a-zA-Z0-9_]*")
        matcher = {"name": name, "value": value, "is_regex": bool(m.get("is_regex", False)),
                   "is_equal": bool(m.get("is_equal", True))}
        if matcher["is_regex"]:
            try:
                _regex(value)
            except re.error as exc:
                raise ValueError(f"matcher {i} ({name}): invalid regular expression {value!r}: {exc}") from exc
        out.append(matcher)
    if all(matcher_matches(m, {}) for m in out):
        # as Alertmanager: a silence that matches an alert without labels would mute everything
        raise ValueError("at least one matcher must not match the empty string, or the silence mutes every alert")
    return out


@lru_cache(maxsize=512)
def _regex(pattern: str) -> re.Pattern[str]:
    return re.compile(pattern)


def matcher_matches(matcher: Mapping[str, Any], labels: Mapping[str, str]) -> bool:
    """An absent label counts as the empty string; regexes match the whole value, as in Alertmanager."""
    actual = labels.get(str(matcher["name"]), "")
    value = str(matcher["value"])
    hit = _regex(value).fullmatch(actual) is not None if matcher.get("is_regex") else actual == value
    return hit if matcher.get("is_equal", True) else not hit


def silence_matches(silence: Silence, labels: Mapping[str, str]) -> bool:
    return bool(silence.matchers) and all(matcher_matches(m, labels) for m in silence.matchers)


def active_silences(session: Session, now: datetime) -> list[Silence]:
    return list(session.scalars(select(Silence).where(Silence.starts_at <= now, Silence.ends_at > now)
                                .order_by(Silence.ends_at.desc(), Silence.id)))


def matching_silence(session: Session, labels: Mapping[str, str], now: datetime) -> Silence | None:
    """The active silence that mutes these labels longest, if any."""
    return first_match(active_silences(session, now), labels)


def first_match(silences: Iterable[Silence], labels: Mapping[str, str]) -> Silence | None:
    return next((s for s in silences if silence_matches(s, labels)), None)


def create_silence(session: Session, *, matchers: Sequence[Mapping[str, Any]], ends_at: datetime, now: datetime,
                   created_by: str, comment: str = "", starts_at: datetime | None = None) -> Silence:
    starts_at = starts_at or now
    if ends_at <= now:
        raise ValueError("ends_at must be in the future")
    if ends_at <= starts_at:
        raise ValueError("ends_at must be after starts_at")
    if ends_at - starts_at > MAX_SILENCE:
        raise ValueError("a silence lasts at most one year")
    silence = Silence(matchers=normalise_matchers(matchers), starts_at=starts_at, ends_at=ends_at,
                      created_by=created_by, comment=comment, created_at=now)
    session.add(silence)
    session.flush()
    return silence


def list_silences(session: Session, *, now: datetime, active_only: bool = True, limit: int = 500) -> list[Silence]:
    query = select(Silence).order_by(Silence.id.desc()).limit(limit)
    if active_only:
        query = query.where(Silence.ends_at > now)
    return list(session.scalars(query))


def expire_silence(session: Session, silence_id: int, now: datetime) -> Silence:
    """End a silence now (idempotent). LookupError for an unknown id."""
    silence = session.get(Silence, silence_id)
    if silence is None:
        raise LookupError(f"no silence {silence_id}")
    if silence.ends_at > now:
        silence.starts_at = min(silence.starts_at, now)
        silence.ends_at = now
    return silence


def unsilence_expired(session: Session, now: datetime) -> list[Notification]:
    """Triggers muted by a silence that has ended go out after all, while their incident is still open.

    A trigger another active silence still matches moves to that silence instead. Returns the rows now pending.
    """
    rows = session.execute(
        select(Notification, Incident)
        .join(Incident, Incident.id == Notification.incident_id)
        .outerjoin(Silence, Silence.id == Notification.silence_id)
        .where(Notification.state == "silenced", Notification.event == "trigger", Incident.state == "open",
               or_(Silence.id.is_(None), Silence.ends_at <= now))
        .order_by(Notification.id)).all()
    if not rows:
        return []
    silences = active_silences(session, now)
    released = []
    for row, incident in rows:
        still = first_match(silences, render.labels(incident))
        if still is not None:
            row.silence_id = still.id
            continue
        row.state = "pending"
        row.next_attempt_at = now
        released.append(row)
    return released


# --- reading the outbox -------------------------------------------------------------------------------

def list_notifications(session: Session, *, incident_id: int | None = None, limit: int = 100) -> list[Notification]:
    query = select(Notification).order_by(Notification.id.desc()).limit(limit)
    if incident_id is not None:
        query = query.where(Notification.incident_id == incident_id)
    return list(session.scalars(query))


def attempts_of(session: Session, notification_ids: Sequence[int]) -> dict[int, list[DeliveryAttempt]]:
    out: dict[int, list[DeliveryAttempt]] = {i: [] for i in notification_ids}
    if notification_ids:
        for attempt in session.scalars(select(DeliveryAttempt).where(
                DeliveryAttempt.notification_id.in_(notification_ids)).order_by(DeliveryAttempt.id)):
            out[attempt.notification_id].append(attempt)
    return out
