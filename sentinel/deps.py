"""Small helpers every router uses."""

from __future__ import annotations

from typing import Annotated

from fastapi import HTTPException, Path, Query, Request

from sentinel.runtime import Runtime


def runtime(request: Request) -> Runtime:
    rt: Runtime = request.app.state.runtime
    return rt


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
