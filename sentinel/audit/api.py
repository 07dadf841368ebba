"""Reading the audit log: who changed what, newest first."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Depends, Query

from sentinel.audit.schemas import AuditOut
from sentinel.audit.service import list_entries
from sentinel.auth.deps import OPERATE, allow
from sentinel.deps import Sessions

router = APIRouter(prefix="/audit", tags=["audit"])


@router.get("", response_model=list[AuditOut], dependencies=[Depends(allow(OPERATE))])
def get_audit(sessions: Sessions, subject: str | None = None, actor: str | None = None,
              action: str | None = None, limit: Annotated[int, Query(ge=1, le=10_000)] = 100) -> list[AuditOut]:
    with sessions() as session:
        rows = list_entries(session, subject=subject, actor=actor, action=action, limit=limit)
        return [AuditOut.model_validate(row) for row in rows]
