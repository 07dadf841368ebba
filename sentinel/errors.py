"""Bad input gets a precise 4xx: malformed JSON 400, wrong shape 422, too large 413. Never a 500.

`install` also documents those answers in the OpenAPI schema, once for every operation, so that a client (or a
fuzzer) finds every status the server really returns: the shape of the body is `ErrorOut` for all of them.
"""

from __future__ import annotations

import logging
import re
from collections.abc import Sequence
from typing import Any

from fastapi import FastAPI, HTTPException, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from pydantic import BaseModel, ValidationError
from sqlalchemy.exc import DBAPIError
from starlette.types import ASGIApp, Message, Receive, Scope, Send

log = logging.getLogger("sentinel.http")


class Problem(BaseModel):
    field: str
    problem: str
    type: str


class ProblemDetail(BaseModel):
    message: str
    problems: list[Problem]


class ErrorOut(BaseModel):
    """Every 4xx body: a sentence, or for a body or parameter that does not validate, one problem per field."""

    detail: str | ProblemDetail


def error(description: str) -> dict[str, Any]:
    """An OpenAPI response whose body is `ErrorOut`; for `responses=` on a route."""
    return {"description": description, "model": ErrorOut}


NOT_FOUND: dict[int | str, dict[str, Any]] = {404: error("The object named does not exist")}
CONFLICT: dict[int | str, dict[str, Any]] = {409: error("The object is in a state that does not allow this")}


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


# PostgreSQL's deadlock and serialization failures: the database undid this transaction, whole, so that
# another could go on; sent again it succeeds. A 503 with Retry-After is what clients already retry.
RETRYABLE_SQLSTATES = {"40P01": "a deadlock", "40001": "a serialization failure"}


async def _database_conflict(request: Request, exc: Exception) -> JSONResponse:
    assert isinstance(exc, DBAPIError)
    what = RETRYABLE_SQLSTATES.get(str(getattr(exc.orig, "sqlstate", "") or ""))
    if what is None:
        return await _unhandled(request, exc)
    log.warning("database undid a request: %s %s (%s with another write); nothing of it was kept, the client "
                "is asked to send it again", request.method, request.url.path, what)
    return JSONResponse({"detail": f"the database undid this request ({what} with another write) and kept nothing "
                                   "of it: send it again"}, status_code=503, headers={"retry-after": "1"})


def install(app: FastAPI) -> None:
    app.add_exception_handler(RequestValidationError, _request_validation)
    app.add_exception_handler(DBAPIError, _database_conflict)
    app.add_exception_handler(Exception, _unhandled)
    app.add_middleware(RefuseNul)
    build_schema = app.openapi

    def openapi() -> dict[str, Any]:
        if app.openapi_schema is None:
            document_errors(build_schema())
        return build_schema()

    app.openapi = openapi  # type: ignore[method-assign]


AUTHENTICATED = ("/api/v1/", "/metrics")  # every route there takes a bearer token (auth/deps.py)
AUTH_ERRORS = {"401": "No bearer token, or an unknown, revoked or expired one",
               "403": "The token's role may not do this",
               "429": "Too many requests for this token; retry after the Retry-After header's seconds"}
BODY_ERRORS = {"400": "The body is not valid JSON, or Content-Length is not a number",
               "413": "The body is over the server's size limit",
               "422": "The body or a parameter does not match the schema; `detail.problems` names each field"}
PARAMETER_ERRORS = {"422": BODY_ERRORS["422"]}
PATH_ERRORS = {"404": "The object named in the path does not exist"}


def document_errors(schema: dict[str, Any]) -> None:
    """Add the statuses the edge itself answers (auth, body limits, validation, unknown path objects) to every
    operation, with `ErrorOut` as the body; FastAPI's own 422 shape is replaced, the handler above answers another."""
    components = schema.setdefault("components", {}).setdefault("schemas", {})
    error_schema = ErrorOut.model_json_schema(ref_template="#/components/schemas/{model}")
    components.update(error_schema.pop("$defs", {}))
    components["ErrorOut"] = error_schema
    content = {"application/json": {"schema": {"$ref": "#/components/schemas/ErrorOut"}}}
    for path, operations in schema.get("paths", {}).items():
        for operation in operations.values():
            parameters = operation.get("parameters", [])
            added: dict[str, str] = {}
            if path.startswith(AUTHENTICATED):
                added |= AUTH_ERRORS
            if parameters:
                added |= PARAMETER_ERRORS
            if any(p.get("in") == "path" for p in parameters):
                added |= PATH_ERRORS
            if "requestBody" in operation:
                added |= BODY_ERRORS
            responses = operation.setdefault("responses", {})
            for status, description in added.items():
                declared = responses.get(status)
                if declared is None or status == "422":
                    responses[status] = {"description": description, "content": content}
    for unused in ("HTTPValidationError", "ValidationError"):
        components.pop(unused, None)


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


NUL_MESSAGE = "text may not contain NUL (U+0000) characters"
# A JSON string's escaped NUL: `\u0000` after an even number of backslashes (`\\u0000` is a backslash and "u0000").
_JSON_NUL = re.compile(rb"(?<!\\)(?:\\\\)*\\u0000")


class RefuseNul:
    """Pure ASGI middleware: 422 for a NUL character anywhere in the request's path, query or body.

    PostgreSQL text cannot hold NUL: without this a NUL in any name, filter or comment was a 500 from the
    database driver (SQLite stored it). One check at the edge covers every route, present and future."""

    def __init__(self, app: ASGIApp):
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        if "\x00" in scope.get("path", "") or b"%00" in scope.get("query_string", b""):
            body = JSONResponse({"detail": f"{NUL_MESSAGE}: in the URL"}, status_code=422).body
            await send({"type": "http.response.start", "status": 422,
                        "headers": [(b"content-type", b"application/json"),
                                    (b"content-length", str(len(body)).encode())]})
            await send({"type": "http.response.body", "body": body})
            return
        content_type = dict(scope.get("headers", [])).get(b"content-type", b"")
        form = content_type.startswith(b"application/x-www-form-urlencoded")
        tail = b""

        def has_nul(data: bytes) -> bool:
            return b"\x00" in data or (b"\\u0000" in data and _JSON_NUL.search(data) is not None) or (
                form and b"%00" in data)

        async def checking_receive() -> Message:
            # The body streams: the seam with the previous chunk is checked too, for an escape split across two.
            nonlocal tail
            message = await receive()
            chunk = message.get("body", b"") if message["type"] == "http.request" else b""
            if chunk:
                if has_nul(chunk) or (tail and has_nul(tail + chunk[:16])):
                    raise HTTPException(422, f"{NUL_MESSAGE}: in the body")
                tail = chunk[-16:]
            return message

        await self.app(scope, checking_receive, send)
