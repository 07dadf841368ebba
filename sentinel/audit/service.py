from __future__ import annotations

from typing import Any

from sqlalchemy import select
from sqlalchemy.orm import Session

from sentinel.audit.context import note_audited
from sentinel.audit.models import AuditEntry


def record(session: Session, *, actor: str, action: str, subject: str, reason: str = "",
           detail: dict[str, Any] | None = None) -> AuditEntry:
    entry = AuditEntry(actor=actor, action=action, subject=subject, reason=reason, detail=detail or {})
    session.add(entry)
    note_audited()  # the request's own entry: the audit middleware need not write one
    return entry


def list_entries(session: Session, *, subject: str | None = None, actor: str | None = None,
                 action: str | None = None, limit: int = 100) -> list[AuditEntry]:
    query = select(AuditEntry).order_by(AuditEntry.id.desc()).limit(limit)
    if subject is not None:
        query = query.where(AuditEntry.subject == subject)
    if actor is not None:
        query = query.where(AuditEntry.actor == actor)
    if action is not None:
        query = query.where(AuditEntry.action == action)
    return list(session.scalars(query))
