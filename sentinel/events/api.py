from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Depends, HTTPException, Query

from sentinel.auth.deps import READ, allow
from sentinel.deps import Live, Sessions
from sentinel.errors import NOT_FOUND
from sentinel.events.schemas import EventOut
from sentinel.events.service import list_events

router = APIRouter(prefix="/events", tags=["events"])


@router.get("", response_model=list[EventOut], dependencies=[Depends(allow(READ))], responses=NOT_FOUND)
def get_events(live: Live, sessions: Sessions, node: str | None = None, kind: str | None = None,
               accelerator: str | None = None, limit: Annotated[int, Query(ge=1, le=1000)] = 100) -> list[EventOut]:
    node_id = None
    if node is not None:
        found = live.fleet.get(node)
        if found is None:
            raise HTTPException(404, f"node {node!r} is not registered")
        node_id = found.id
    with sessions() as session:
        rows = list_events(session, node_id=node_id, kind=kind, accelerator_uuid=accelerator, limit=limit)
        return [EventOut.model_validate(e) for e in rows]
