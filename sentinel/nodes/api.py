"""Node routes: registration and reports from agents, views and cordons for people."""

from __future__ import annotations

import asyncio
import logging
import re
from collections.abc import Mapping
from dataclasses import replace
from typing import Annotated, Any, Literal

from fastapi import APIRouter, Body, Depends, HTTPException, Query, Request
from fastapi.responses import JSONResponse
from pydantic import ValidationError
from sqlalchemy.orm import Session, sessionmaker
from starlette.concurrency import run_in_threadpool
from starlette.types import Receive, Scope, Send

from sentinel.accelerators.schemas import AcceleratorOut
from sentinel.audit.service import record
from sentinel.auth.deps import AGENT, OPERATE, READ, allow, authenticate_secret, bearer_value, check_node, check_role
from sentinel.auth.service import Principal, TokenCache, bind_token_to_node
from sentinel.db import transaction
from sentinel.deps import Commands, Live, Offset, Pipeline, Sessions, Tokens, not_found
from sentinel.errors import CONFLICT, NUL_MESSAGE, validation_problem
from sentinel.live.view import LiveView
from sentinel.nodes import service
from sentinel.nodes.schemas import CordonRequest, InjectRequest, NodeDetail, NodeOut, RegistrationOut
from sentinel.pipeline.ingest import IngestError
from sentinel.pipeline.report import ReportPipeline
from sentinel.telemetry.schemas import NodeCommand, NodeRegistration, NodeReport, ReportAck

log = logging.getLogger("sentinel.nodes")
router = APIRouter(prefix="/nodes", tags=["nodes"])



def _detail(view: LiveView, node: object, accelerators: list[object]) -> NodeDetail:
    detail = NodeDetail.model_validate(node)
    accs = [view.samples.with_latest(AcceleratorOut.model_validate(a).model_copy(update={"node": detail.name}))
            for a in accelerators]
    live = view.fleet.get(detail.name)
    update: dict[str, object] = {"accelerators": accs}
    if live is not None:
        update |= {"state": live.state, "last_seq": max(live.last_seq, detail.last_seq)}
    return detail.model_copy(update=update)


@router.post("/register", response_model=RegistrationOut)
def register(reg: NodeRegistration, sessions: Sessions, pipeline: Pipeline, tokens: Tokens,
             who: Annotated[Principal, Depends(allow(AGENT))]) -> RegistrationOut:
    """An agent token registers only nodes matching its binding; an unbound one is bound to this node."""
    unbound = who.node is None
    try:
        with transaction(sessions) as session:
            who = _bind_on_first_use(session, who, reg.name)
            check_node(who, reg.name)
            node, accelerators, live = pipeline.register(session, reg)
            detail = _detail(pipeline.live, node, list(accelerators))
    except service.AcceleratorConflict as exc:
        raise HTTPException(422, str(exc)) from exc
    finally:
        if unbound:  # after the commit: the cached principal predates its binding
            tokens.forget(who.token_id)
    log.info("node registered: node=%s accelerators=%d sources=%s by=%s", reg.name, len(reg.accelerators),
             ",".join(reg.sources), who.actor)
    return RegistrationOut(node=detail, last_seq=live.last_seq)


def _bind_on_first_use(session: Session, who: Principal, node: str) -> Principal:
    """Trust on first use: an agent token created without a node is bound, for good, to the first node it
    registers (audited). A racing registration through another server may win: the answer says who did."""
    if who.role != "agent" or who.node is not None:
        return who
    bound = bind_token_to_node(session, token_id=who.token_id, node=node)
    if bound == node:
        record(session, actor=who.actor, action="token.bind", subject=f"token/{who.name}",
               detail={"id": who.token_id, "node": node})
        log.info("token bound on first use: token=%d name=%s node=%s", who.token_id, who.name, node)
    return replace(who, node=bound)


REPORT_BODY = {"requestBody": {"required": True, "content": {"application/json": {
    "schema": NodeReport.model_json_schema(ref_template="#/components/schemas/{model}")}}}}


_allow_agent = allow(AGENT)


async def _allow_agent_async(request: Request) -> Principal:
    """`allow(AGENT)` on the event loop: only the token's database read (once per cache period per agent)
    goes to a worker thread. For the documented route; the served one authenticates in `_report_principal`."""
    return await _report_principal(request.app.state.runtime, request.headers.get("authorization", ""),
                                   request.url.path)


async def _report_principal(runtime: Any, authorization: str, path: str) -> Principal:
    secret = bearer_value(authorization)
    tokens: TokenCache = runtime.tokens
    if secret is not None and not tokens.is_fresh(secret):
        await _refresh(tokens, secret)
    principal = authenticate_secret(runtime, secret, path)
    check_role(principal, AGENT, "POST", path)
    return principal


# One database read per token and cache period, however many of its reports arrive meanwhile: with one token
# for a whole fleet, every report in flight when its cache entry aged read the token again (32 at once here).
_refreshing: dict[tuple[int, str], tuple[asyncio.AbstractEventLoop, asyncio.Future[Any]]] = {}


async def _refresh(tokens: TokenCache, secret: str) -> None:
    loop = asyncio.get_running_loop()
    key = (id(tokens), secret)
    found = _refreshing.get(key)
    if found is None or found[0] is not loop:
        future = asyncio.ensure_future(run_in_threadpool(tokens.refresh, secret))
        found = _refreshing[key] = (loop, future)

        def done(finished: asyncio.Future[Any]) -> None:
            if _refreshing.get(key, (None, None))[1] is finished:
                del _refreshing[key]
            if not finished.cancelled():
                finished.exception()  # retrieved: each waiter raises it, none is warned about

        future.add_done_callback(done)
    await asyncio.shield(found[1])


@router.post("/{node}/reports", response_model=ReportAck, openapi_extra=REPORT_BODY, responses=CONFLICT)
async def post_report(node: str, request: Request, who: Annotated[Principal, Depends(_allow_agent_async)]) -> ReportAck:
    """Idempotent on (node, seq): a replay is acknowledged as `duplicate` and not counted twice. Not audited
    per report: the ingest receipt on (node, seq) is its record (audit/middleware.py). Served by
    `serve_report` (below, ahead of the app's middleware stack); this route documents it in OpenAPI and
    answers what that path passes on."""
    check_node(who, node)
    return await ingest_report(request.app.state.runtime.pipeline, node, await request.body())


async def ingest_report(pipeline: ReportPipeline, node: str, body: bytes) -> ReportAck:
    """Validate, store and acknowledge one report; HTTPException for one refused."""
    try:
        report = NodeReport.model_validate_json(body)
    except ValidationError as exc:
        pipeline.ingest.reject("invalid", 400, "")
        raise validation_problem(exc) from exc
    try:
        outcome = await pipeline.receive(report, node)
    except IngestError as exc:
        raise HTTPException(exc.status, exc.message) from exc
    except Exception as exc:
        log.exception("report not stored: node=%s seq=%d", report.node, report.seq)
        raise HTTPException(503, "the report could not be stored; retry later") from exc
    return pipeline.ack(outcome, report, node)


# -- the served report path: pure ASGI, ahead of the middleware stack ---------------------------------------
# At ~1,000+ reports/s FastAPI's stack (errors, telemetry, body limits, standby guard, audit, NUL check,
# routing across every router) cost more than the report itself (docs/scaling.md, "Where the limit is").
# `report_route_node` picks the common case; anything unusual (a standby, no or a bad Content-Length, a NUL
# in the URL, a trailing slash) goes through the stack, whose middlewares answer it as before. Reports are
# not audited row by row there either (audit/middleware.py: HIGH_VOLUME); their record is the receipt.
REPORTS_PREFIX, REPORTS_SUFFIX = "/api/v1/nodes/", "/reports"
JSON_HEADERS = [(b"content-type", b"application/json")]
# errors.RefuseNul's test: a raw NUL, a JSON-escaped one (`\\u0000` after an even number of backslashes), or
# `%00` in a form-encoded body.
_JSON_NUL = re.compile(rb"(?<!\\)(?:\\\\)*\\u0000")


def has_nul(data: bytes, form: bool) -> bool:
    return b"\x00" in data or (b"\\u0000" in data and _JSON_NUL.search(data) is not None) or (
        form and b"%00" in data)


def report_route_node(scope: Scope) -> str | None:
    """The `{node}` of a `POST /api/v1/nodes/{node}/reports` that `serve_report` may answer, else None."""
    if scope["type"] != "http" or scope["method"] != "POST":
        return None
    path: str = scope["path"]
    if not (path.startswith(REPORTS_PREFIX) and path.endswith(REPORTS_SUFFIX)):
        return None
    node = path[len(REPORTS_PREFIX):-len(REPORTS_SUFFIX)]
    if not node or "/" in node or "\x00" in node or b"%00" in scope.get("query_string", b""):
        return None
    return node


def _headers(scope: Scope, max_bytes: int) -> tuple[str, bool] | None:
    """(Authorization, form-encoded) when the declared length is a number within `max_bytes`, else None."""
    authorization, length, form = "", None, False
    for name, value in scope["headers"]:
        if name == b"authorization":
            authorization = value.decode("latin-1")
        elif name == b"content-length":
            length = value
        elif name == b"content-type":
            form = value.startswith(b"application/x-www-form-urlencoded")
    if length is None or not length.isdigit() or int(length) > max_bytes:
        return None
    return authorization, form


async def serve_report(runtime: Any, max_bytes: int, scope: Scope, receive: Receive, send: Send) -> bool:
    """Answer a report with the route's checks and answers; False (nothing read) to leave it to the stack."""
    node = report_route_node(scope)
    found = None if node is None else _headers(scope, max_bytes)
    if node is None or found is None or not runtime.leading:
        return False
    authorization, form = found
    try:
        who = await _report_principal(runtime, authorization, scope["path"])
        check_node(who, node)
        body = await _read_body(receive, max_bytes, form)
        if body is None:  # the client went away
            return True
        ack = await ingest_report(runtime.pipeline, node, body)
    except HTTPException as exc:
        await _answer(send, exc.status_code, bytes(JSONResponse({"detail": exc.detail}).body), exc.headers)
        return True
    except Exception:
        log.exception("unhandled error: POST %s", scope["path"])
        await _answer(send, 500, bytes(JSONResponse({"detail": "internal error; the server logged it"}).body))
        return True
    await _answer(send, 200, ack.model_dump_json().encode())
    return True


async def _read_body(receive: Receive, max_bytes: int, form: bool) -> bytes | None:
    """The body, refused as errors.BodyLimit and errors.RefuseNul would (413, 422); None on a disconnect."""
    chunks: list[bytes] = []
    seen = 0
    while True:
        message = await receive()
        if message["type"] != "http.request":
            return None
        chunk = message.get("body", b"")
        if chunk:
            seen += len(chunk)
            if seen > max_bytes:
                raise HTTPException(413, f"body is over the {max_bytes}-byte limit")
            chunks.append(chunk)
        if not message.get("more_body", False):
            break
    body = chunks[0] if len(chunks) == 1 else b"".join(chunks)
    if has_nul(body, form):
        raise HTTPException(422, f"{NUL_MESSAGE}: in the body")
    return body


async def _answer(send: Send, status: int, body: bytes, headers: Mapping[str, str] | None = None) -> None:
    extra = [(k.lower().encode("latin-1"), v.encode("latin-1")) for k, v in (headers or {}).items()]
    await send({"type": "http.response.start", "status": status,
                "headers": [*JSON_HEADERS, (b"content-length", str(len(body)).encode()), *extra]})
    await send({"type": "http.response.body", "body": body})


@router.get("", response_model=list[NodeOut], dependencies=[Depends(allow(READ))])
def get_nodes(sessions: Sessions, live: Live, state: Literal["active", "cordoned", "draining", "down"] | None = None,
              limit: Annotated[int, Query(ge=1, le=20_000)] = 1000,
              offset: Offset = 0) -> list[NodeOut]:
    with sessions() as session:
        rows = service.list_nodes(session, limit=limit, offset=offset)
    out = []
    for row in rows:
        item = NodeOut.model_validate(row)
        found = live.fleet.get(item.name)
        if found is not None:
            item = item.model_copy(update={"state": found.state, "last_seq": max(found.last_seq, item.last_seq)})
        if state is None or item.state == state:
            out.append(item)
    return out


@router.get("/{node}", response_model=NodeDetail, dependencies=[Depends(allow(READ))])
def get_node(node: str, sessions: Sessions, live: Live) -> NodeDetail:
    with sessions() as session:
        try:
            row = service.get_node(session, node)
        except service.NodeNotFound as exc:
            raise not_found(exc) from exc
        return _detail(live, row, list(service.node_accelerators(session, row.id)))


def _set_admin_state(sessions: sessionmaker[Session], live: LiveView, node: str, admin_state: str, reason: str,
                     who: Principal) -> NodeDetail:
    with transaction(sessions) as session:
        try:
            row = service.get_node(session, node)
        except service.NodeNotFound as exc:
            raise not_found(exc) from exc
        service.set_admin_state(session, row, admin_state=admin_state, reason=reason, actor=who.actor)
        session.flush()
        live.fleet.apply(row)
        detail = _detail(live, row, list(service.node_accelerators(session, row.id)))
    log.info("node %s: node=%s by=%s reason=%r", admin_state, node, who.actor, reason)
    return detail


@router.post("/{node}/cordon", response_model=NodeDetail)
def cordon(node: str, sessions: Sessions, live: Live, who: Annotated[Principal, Depends(allow(OPERATE))],
           body: Annotated[CordonRequest | None, Body()] = None) -> NodeDetail:
    return _set_admin_state(sessions, live, node, "cordoned", (body or CordonRequest()).reason, who)


@router.post("/{node}/uncordon", response_model=NodeDetail)
def uncordon(node: str, sessions: Sessions, live: Live, who: Annotated[Principal, Depends(allow(OPERATE))],
             body: Annotated[CordonRequest | None, Body()] = None) -> NodeDetail:
    return _set_admin_state(sessions, live, node, "active", (body or CordonRequest()).reason, who)


@router.post("/{node}/inject", response_model=NodeCommand, status_code=202, responses=CONFLICT)
def inject(node: str, spec: InjectRequest, sessions: Sessions, live: Live, commands: Commands,
           who: Annotated[Principal, Depends(allow(OPERATE))]) -> NodeCommand:
    """A fault drill on a simulated accelerator; the agent picks it up at once (long-poll)."""
    found = live.fleet.get(node)
    if found is None:
        raise HTTPException(404, f"node {node!r} is not registered")
    if not any(s.startswith("sim") for s in found.sources):
        raise HTTPException(409, f"node {node!r} has no simulated accelerators; drills run on `sim` sources only")
    with transaction(sessions) as session:
        record(session, actor=who.actor, action="node.inject", subject=f"node/{node}",
               detail=spec.model_dump())
    command = commands.push(node, kind="inject", accelerator_index=spec.accelerator_index, fault=spec.fault,
                               argument=spec.argument)
    log.info("fault drill queued: node=%s accelerator=%d fault=%s by=%s", node, spec.accelerator_index,
             spec.fault, who.actor)
    return command


@router.get("/{node}/commands", response_model=list[NodeCommand])
async def commands(node: str, live: Live, queue: Commands, who: Annotated[Principal, Depends(allow(AGENT))],
                   wait: Annotated[float, Query(ge=0, le=60)] = 0) -> list[NodeCommand]:
    check_node(who, node)
    if live.fleet.get(node) is None:
        raise HTTPException(404, f"node {node!r} is not registered")
    if wait <= 0:
        return queue.take(node)
    return await queue.wait(node, wait)
