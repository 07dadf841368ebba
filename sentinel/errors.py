"""Bad input gets a precise 4xx: malformed JSON 400, wrong shape 422, too large 413. Never a 500."""

from __future__ import annotations

import logging
from collections.abc import Sequence
from typing import Any

from fastapi import FastAPI, HTTPException, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from pydantic import ValidationError
from starlette.types import ASGIApp, Message, Receive, Scope, Send

log = logging.getLogger("sentinel.http")


def _problems(errors: Sequence[Any]) -> tuple[int, list[dict[str, Any]]]:
    problems = []
    status = 422
    for err in errors:
        if err.get("type") == "json_invalid":
            status = 400
        loc = [str(p) for p in err.get("loc", ()) if p != "body"]
        problems.append({"field": ".".join(loc) or "(body)", "problem": err.get("msg", "invalid"),
                         "type": err.get("type", "")})
    return status, problems


def validation_problem(exc: ValidationError) -> HTTPException:
    status, problems = _problems(exc.errors(include_url=False, include_input=False))
    message = "body is not valid JSON" if status == 400 else "body does not match the schema"
    return HTTPException(status, {"message": message, "problems": problems})


async def _request_validation(_request: Request, exc: Exception) -> JSONResponse:
    assert isinstance(exc, RequestValidationError)
    status, problems = _problems(exc.errors())
    message = "body is not valid JSON" if status == 400 else "request does not match the schema"
    return JSONResponse({"detail": {"message": message, "problems": problems}}, status_code=status)


async def _unhandled(request: Request, exc: Exception) -> JSONResponse:
    log.exception("unhandled error: %s %s", request.method, request.url.path, exc_info=exc)
    return JSONResponse({"detail": "internal error; the server logged it"}, status_code=500)


def install(app: FastAPI) -> None:
    app.add_exception_handler(RequestValidationError, _request_validation)
    app.add_exception_handler(Exception, _unhandled)


class BodyLimit:
    """Pure ASGI middleware: refuse bodies over `max_bytes` with 413, by header or while streaming."""

    def __init__(self, app: ASGIApp, max_bytes: int):
        self.app = app
        self.max_bytes = max_bytes

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        declared = dict(scope.get("headers", [])).get(b"content-length")
        if declared is not None:
            try:
                too_big = int(declared) > self.max_bytes
            except ValueError:
                await self._refuse(send, 400, "Content-Length is not a number")
                return
            if too_big:
                await self._refuse(send, 413, f"body is over the {self.max_bytes}-byte limit")
                return
        seen = 0

        async def counting_receive() -> Message:
            # Chunked bodies declare no length: count while reading. FastAPI re-raises HTTPException as is.
            nonlocal seen
            message = await receive()
            if message["type"] == "http.request":
                seen += len(message.get("body", b""))
                if seen > self.max_bytes:
                    raise HTTPException(413, f"body is over the {self.max_bytes}-byte limit")
            return message

        await self.app(scope, counting_receive, send)

    @staticmethod
    async def _refuse(send: Send, status: int, message: str) -> None:
        body = JSONResponse({"detail": message}, status_code=status).body
        await send({"type": "http.response.start", "status": status,
                    "headers": [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode()),
                                (b"connection", b"close")]})
        await send({"type": "http.response.body", "body": body})
