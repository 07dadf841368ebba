"""What routers may ask for: typed FastAPI dependencies for each part of the server, and the edge's id types.

A router names exactly what it uses (`sessions: Sessions, fleet: FleetView`), never the whole runtime.
The parts are read from the app's composition root (sentinel/runtime.py) at request time; the
dependencies are `async` so FastAPI resolves them on the event loop, without a thread hop.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Annotated, Any

from fastapi import Depends, HTTPException, Path, Query, Request
from sqlalchemy.orm import Session, sessionmaker

from sentinel.alerting.dispatcher import Dispatcher
from sentinel.auth.service import TokenCache
from sentinel.clock import Clock
from sentinel.config import Settings
from sentinel.incidents.lifecycle import Incidents
from sentinel.live.view import LiveView
from sentinel.nodes.commands import CommandQueue
from sentinel.pipeline.report import ReportPipeline
from sentinel.remediation.engine import RemediationEngine


def part(name: str) -> Callable[[Request], Awaitable[Any]]:
    """A dependency that answers the server's part `name` (an attribute of the composition root)."""

    async def get(request: Request) -> Any:
        return getattr(request.app.state.runtime, name)

    get.__name__ = f"server_{name}"
    return get


Sessions = Annotated[sessionmaker[Session], Depends(part("factory"))]
ServerClock = Annotated[Clock, Depends(part("clock"))]
ServerSettings = Annotated[Settings, Depends(part("settings"))]
Live = Annotated[LiveView, Depends(part("live"))]
Pipeline = Annotated[ReportPipeline, Depends(part("pipeline"))]
Commands = Annotated[CommandQueue, Depends(part("commands"))]
Tokens = Annotated[TokenCache, Depends(part("tokens"))]
IncidentLog = Annotated[Incidents, Depends(part("incidents"))]
Outbox = Annotated[Dispatcher, Depends(part("dispatcher"))]
Remediation = Annotated[RemediationEngine, Depends(part("remediation"))]


def not_found(error: LookupError) -> HTTPException:
    return HTTPException(404, str(error.args[0]) if error.args else "not found")


# Row ids at the edge. A number past the id column's range names no row, and the database driver refuses to bind
# it (OverflowError on SQLite, DataError on PostgreSQL): without these bounds it was a 500, now it is a 422.
MAX_ID = 2**31 - 1  # Integer primary keys
MAX_BIG_ID = 2**63 - 1  # BigInteger primary keys (incidents, events, notifications, remediations)
IdPath = Annotated[int, Path(ge=1, le=MAX_ID)]
BigIdPath = Annotated[int, Path(ge=1, le=MAX_BIG_ID)]
# also for incident filters: the columns that reference incidents are Integer
IdQuery = Annotated[int | None, Query(ge=1, le=MAX_ID)]
Offset = Annotated[int, Query(ge=0, le=MAX_BIG_ID)]  # past it, the same overflow
