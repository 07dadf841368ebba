"""Small helpers every router uses."""

from __future__ import annotations

from fastapi import HTTPException, Request

from sentinel.runtime import Runtime


def runtime(request: Request) -> Runtime:
    rt: Runtime = request.app.state.runtime
    return rt


def not_found(error: LookupError) -> HTTPException:
    return HTTPException(404, str(error.args[0]) if error.args else "not found")
