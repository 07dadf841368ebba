"""The server's own read-only status page, for people without Grafana.

Browsers cannot send a bearer header, so `POST /ui/login` checks a token like `auth/deps.py` does and
keeps it in an HttpOnly, SameSite=Strict cookie scoped to `/ui`; `GET /ui` also takes a bearer header
(curl). Tokens are never accepted in the URL: URLs end up in logs and browser history.
"""

from __future__ import annotations

import logging
from urllib.parse import parse_qs

from fastapi import APIRouter, Request
from fastapi.responses import HTMLResponse, RedirectResponse, Response
from sqlalchemy.orm import Session
from starlette.concurrency import run_in_threadpool

from sentinel import __version__
from sentinel.accelerators.service import count_by_health
from sentinel.auth.deps import READ, bearer_secret
from sentinel.auth.service import Principal
from sentinel.clock import to_datetime
from sentinel.incidents import render as incident_text
from sentinel.incidents.models import Incident
from sentinel.incidents.service import list_incidents
from sentinel.jobs.api import job_metrics
from sentinel.jobs.service import current_placement, list_jobs
from sentinel.nodes.service import list_accelerators, list_nodes
from sentinel.remediation.models import BreakerState
from sentinel.runtime import Runtime
from sentinel.ui.render import AcceleratorCell, IncidentView, JobRow, NodeRow, StatusView, login_page, status_page

log = logging.getLogger("sentinel.ui")
router = APIRouter()

COOKIE = "sentinel_session"
SESSION_SECONDS = 12 * 3600
MAX_NODES = 1000
MAX_ACCELERATORS_PER_NODE = 64
MAX_INCIDENTS = 50
MAX_JOBS = 50
MAX_TOKEN_CHARS = 512
ACTIVE_STATES = ("open", "acknowledged")
# No script at all: the page refreshes with <meta http-equiv="refresh">, so an escaping slip cannot run code.
HEADERS = {
    "Content-Security-Policy": ("default-src 'none'; style-src 'unsafe-inline'; form-action 'self'; "
                                "frame-ancestors 'none'; base-uri 'none'"),
    "X-Content-Type-Options": "nosniff",
    "Referrer-Policy": "no-referrer",
    "Cache-Control": "no-store",
}


def _base(request: Request) -> str:
    return str(request.scope.get("root_path", "")).rstrip("/")


def _html(body: str, status: int = 200) -> HTMLResponse:
    return HTMLResponse(body, status_code=status, headers=HEADERS)


def _lookup(rt: Runtime, secret: str) -> Principal | None:
    """The principal behind a token, as `auth/deps.py` finds it; anything far longer than a token is unknown."""
    return rt.tokens.lookup(secret) if len(secret) <= MAX_TOKEN_CHARS else None


def _refuse(principal: Principal | None) -> tuple[int, str] | None:
    """(status, message) when `principal` may not read; None when it may."""
    if principal is None:
        return 401, "That token is unknown, revoked or expired."
    if principal.role not in READ:
        return 403, (f"Role {principal.role!r} may not read the status page; "
                     "use a viewer, operator, launcher or admin token.")
    return None


@router.get("/ui", response_class=HTMLResponse, include_in_schema=False)
def get_status_page(request: Request) -> Response:
    """The fleet grid, open incidents, job signals and the breaker; a login form without a valid session."""
    base = _base(request)
    from_header = bearer_secret(request)
    secret = from_header or request.cookies.get(COOKIE)
    if not secret:
        return _html(login_page(base))
    rt: Runtime = request.app.state.runtime
    principal = _lookup(rt, secret)
    refused = _refuse(principal)
    if refused is not None:
        status, message = refused
        response = _html(login_page(base, message if from_header else f"Your session ended. {message}"), status)
        if not from_header:
            response.delete_cookie(COOKIE, path=f"{base}/ui")
        return response
    assert principal is not None
    return _html(status_page(gather(rt, principal), base))


@router.post("/ui/login", response_class=HTMLResponse, include_in_schema=False)
async def login(request: Request) -> Response:
    """Check the form's token and keep it in a cookie; the browser then follows the redirect to /ui."""
    base = _base(request)
    form = parse_qs((await request.body()).decode("utf-8", "replace"), max_num_fields=8)
    token = (form.get("token") or [""])[0].strip()
    if not token:
        return _html(login_page(base, "Paste a token to sign in."), 400)
    rt: Runtime = request.app.state.runtime
    principal = await run_in_threadpool(_lookup, rt, token)
    refused = _refuse(principal)
    client = request.client.host if request.client else "-"
    if refused is not None:
        log.warning("status page sign-in refused: status=%d client=%s", refused[0], client)
        return _html(login_page(base, refused[1]), refused[0])
    assert principal is not None
    log.info("status page sign-in: actor=%s client=%s", principal.actor, client)
    response = RedirectResponse(f"{base}/ui", status_code=303, headers=HEADERS)
    # the token is one that matched a stored token, so it is made of cookie-safe characters only
    response.set_cookie(COOKIE, token, max_age=SESSION_SECONDS, path=f"{base}/ui", httponly=True,
                        samesite="strict", secure=request.url.scheme == "https")
    return response


@router.post("/ui/logout", include_in_schema=False)
def logout(request: Request) -> Response:
    base = _base(request)
    response = RedirectResponse(f"{base}/ui", status_code=303, headers=HEADERS)
    response.delete_cookie(COOKIE, path=f"{base}/ui", httponly=True, samesite="strict",
                           secure=request.url.scheme == "https")
    return response


def gather(rt: Runtime, principal: Principal) -> StatusView:
    """One read-only session; fleet state from memory where the server has it (like nodes/api.py)."""
    now = rt.clock.time()
    notes: list[str] = []
    with rt.factory() as session:
        nodes = _nodes(rt, session, now)
        node_counts = rt.fleet.count_by_state()
        nodes_total = sum(node_counts.values())
        if nodes_total > len(nodes):
            notes.append(f"Showing the first {len(nodes)} of {nodes_total} nodes by name.")
        incidents, incidents_total = list_incidents(session, states=ACTIVE_STATES, limit=MAX_INCIDENTS)
        incident_views = [_incident(i, now) for i in incidents]
        jobs = [JobRow(id=j.id, name=j.name, kind=j.kind, state=j.state, world_size=j.world_size,
                       metrics=job_metrics(rt, j.id, j.created_at, current_placement(session, j.id)))
                for j in list_jobs(session, limit=MAX_JOBS)]
        breaker_open = rt.remediation.breaker.open
        row = session.get(BreakerState, 1) if breaker_open else None
        return StatusView(actor=principal.actor, generated_at=to_datetime(now), version=__version__, nodes=nodes,
                          nodes_total=nodes_total, node_counts=node_counts, health_counts=count_by_health(session),
                          incidents=incident_views, incidents_total=incidents_total, jobs=jobs,
                          breaker_open=breaker_open, breaker_reason=row.reason if row is not None else "",
                          notes=notes)


def _nodes(rt: Runtime, session: Session, now: float) -> list[NodeRow]:
    rows = list_nodes(session, limit=MAX_NODES)
    shown = {row.name for row in rows}
    cells: dict[str, list[AcceleratorCell]] = {}
    for acc, node in list_accelerators(session, limit=MAX_NODES * MAX_ACCELERATORS_PER_NODE):
        if node not in shown:
            continue
        latest = rt.samples.latest(acc.uuid)
        sample = latest[1] if latest is not None else None
        cells.setdefault(node, []).append(AcceleratorCell(
            index=acc.index, uuid=acc.uuid, model=acc.model, health=acc.health, health_reason=acc.health_reason,
            present=acc.present, memory_total_bytes=acc.memory_total_bytes,
            utilization_ratio=sample.utilization_ratio if sample else None,
            temperature_celsius=sample.temperature_celsius if sample else None,
            memory_used_bytes=sample.memory_used_bytes if sample else None,
            sample_age_seconds=now - latest[0] if latest is not None else None))
    out = []
    for row in rows:
        live = rt.fleet.get(row.name)
        seen: float | None
        if live is not None:
            state, seen = live.state, now - live.last_seen
        else:
            state, seen = row.state, (now - row.last_seen_at.timestamp()) if row.last_seen_at else None
        out.append(NodeRow(name=row.name, state=state, labels={str(k): str(v) for k, v in (row.labels or {}).items()},
                           last_seen_age_seconds=seen, accelerators=cells.get(row.name, [])))
    return out


def _incident(incident: Incident, now: float) -> IncidentView:
    return IncidentView(id=incident.id, severity=incident.severity, state=incident.state, title=incident.title,
                        subject=incident_text.subject(incident), age_seconds=now - incident.opened_at.timestamp(),
                        occurrences=incident.occurrences, sections=incident_text.sections(incident))
