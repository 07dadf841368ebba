"""The FastAPI application: routers, edge validation, health checks and /metrics."""

from __future__ import annotations

import gc
import logging
import sys
from collections.abc import AsyncIterator, Callable
from contextlib import AbstractAsyncContextManager, asynccontextmanager

from fastapi import APIRouter, Depends, FastAPI, Request, Response
from fastapi.responses import JSONResponse, PlainTextResponse
from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, generate_latest
from sqlalchemy import text
from starlette.types import ASGIApp, Receive, Scope, Send

from sentinel import __version__, errors
from sentinel.accelerators.api import fleet_router
from sentinel.accelerators.api import router as accelerators_router
from sentinel.alerting.api import router as alerting_router
from sentinel.audit.api import router as audit_router
from sentinel.audit.middleware import AuditCalls
from sentinel.auth.api import router as tokens_router
from sentinel.auth.deps import READ, allow
from sentinel.checkpoints.api import router as checkpoints_router
from sentinel.clock import Clock
from sentinel.config import Settings
from sentinel.diagnosis.api import router as diagnosis_router
from sentinel.events.api import router as events_router
from sentinel.ha.failover import ROLE_HEADER
from sentinel.incidents.api import router as incidents_router
from sentinel.jobs.api import router as jobs_router
from sentinel.metrics import Sources, build_registry
from sentinel.network.api import router as network_router
from sentinel.nodes.api import router as nodes_router
from sentinel.nodes.api import serve_report
from sentinel.policy.api import router as policy_router
from sentinel.remediation.api import router as remediation_router
from sentinel.runtime import Runtime
from sentinel.scheduler import build_scheduler
from sentinel.serving.api import router as serving_router
from sentinel.ui.api import router as ui_router

log = logging.getLogger("sentinel.server")


class StandbyGuard:
    """Pure ASGI: on a standby, API writes get 503 with `X-Sentinel-Role: standby` and Retry-After, so agents,
    launchers and the CLI move on to the next server in their list. Reads, health and /metrics pass."""

    def __init__(self, app: ASGIApp, runtime: Runtime):
        self.app = app
        self.runtime = runtime

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if (scope["type"] == "http" and scope["method"] not in READ_METHODS
                and scope["path"].startswith("/api/") and not self.runtime.leading):
            body = JSONResponse({"detail": "this server is a standby: it serves reads; send writes to the leader "
                                           "(another server in your list)"}, status_code=503).body
            await send({"type": "http.response.start", "status": 503, "headers": [
                (b"content-type", b"application/json"), (b"content-length", str(len(body)).encode()),
                (b"retry-after", b"1"), (ROLE_HEADER.encode(), b"standby")]})
            await send({"type": "http.response.body", "body": body})
            return
        await self.app(scope, receive, send)


READ_METHODS = frozenset({"GET", "HEAD", "OPTIONS"})


class SentinelAPI(FastAPI):
    """The app, with the fleet's report path (`POST /api/v1/nodes/{node}/reports`) answered ahead of the
    middleware stack (nodes/api.py: serve_report): at fleet scale the stack cost more than the report. What
    that path does not take (a standby, an unusual request) goes through the stack as every other call."""

    runtime: Runtime
    max_body_bytes: int

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http" and scope["method"] == "POST":
            scope["app"] = self
            if await serve_report(self.runtime, self.max_body_bytes, scope, receive, send):
                return
        await super().__call__(scope, receive, send)
# The collector's generation thresholds (CPython's default is (700, 10, 10)). A report's parsed objects live
# across its group commit, so with ~32 in flight the youngest generation passed 700 every few reports: each
# collection promoted the in-flight reports, and the full collections they fed paused the loop for ~40 ms
# (~0.2 ms of CPU a report in all, docs/scaling.md). Reports freed by reference counting, as they all are,
# never reach 50,000 net allocations; reference cycles are rare here and still collected.
GC_THRESHOLDS = (50_000, 20, 100)
# How long a thread may hold the GIL while another waits for it (CPython's default: 5 ms). The periodic
# detectors walk every accelerator (~0.5 s of CPU every 10 s at 100,000) on the scheduler's thread. Meanwhile
# the ingest writer releases the GIL on each SQLite step or PostgreSQL round trip and then waited up to 5 ms to
# get it back, hundreds of times a batch: commits took 0.1-0.7 s during each sweep, and that was the p99 at
# 12,500 nodes (docs/scaling.md, "Tail latency"). With 1 ms the sweep takes longer and the reports do not wait.
SWITCH_INTERVAL_SECONDS = 0.001


def create_app(settings: Settings, clock: Clock | None = None, *, migrate: bool = True,
               run_scheduler: bool = True) -> FastAPI:
    runtime = Runtime.build(settings, clock)
    registry = build_registry(Sources(
        sessions=runtime.factory, clock=runtime.clock, live=runtime.live, ingest=runtime.ingest,
        incidents=runtime.incidents, dispatcher=runtime.dispatcher, remediation=runtime.remediation,
        tokens=runtime.tokens, plugin_errors=runtime.plugin_errors, leading=lambda: runtime.leading))
    app = SentinelAPI(title="Sentinel", version=__version__, lifespan=_lifespan(runtime, migrate, run_scheduler),
                      description="Cluster observability and fault tolerance for accelerator clusters.")
    app.runtime, app.max_body_bytes = runtime, settings.max_body_bytes
    app.state.runtime = runtime
    app.state.registry = registry
    errors.install(app)
    app.add_middleware(errors.BodyLimit, max_bytes=settings.max_body_bytes)
    app.add_middleware(AuditCalls)  # an audit entry for every state-changing call (audit/middleware.py)
    app.add_middleware(StandbyGuard, runtime=runtime)
    api = APIRouter(prefix="/api/v1")
    for router in (nodes_router, accelerators_router, fleet_router, jobs_router, events_router, audit_router,
                   tokens_router, incidents_router, alerting_router, remediation_router, checkpoints_router,
                   policy_router, network_router, diagnosis_router, serving_router):
        api.include_router(router)
    app.include_router(api)
    app.include_router(ui_router)  # the status page: /ui
    _health_routes(app, runtime, settings, registry)
    return app


def _lifespan(runtime: Runtime, migrate: bool, run_scheduler: bool
              ) -> Callable[[FastAPI], AbstractAsyncContextManager[None]]:
    @asynccontextmanager
    async def lifespan(_app: FastAPI) -> AsyncIterator[None]:
        runtime.start(migrate=migrate)
        # Everything built so far lives as long as the process: keep it out of the collector's way.
        # Without this, full collections under ingest load pause the server for ~100 ms (the p99).
        gc.freeze()
        thresholds, switch = gc.get_threshold(), sys.getswitchinterval()
        gc.set_threshold(*GC_THRESHOLDS)
        sys.setswitchinterval(SWITCH_INTERVAL_SECONDS)
        scheduler = (build_scheduler(runtime.periodic(), leading=lambda: runtime.leading,
                                     errors=runtime.plugin_errors) if run_scheduler else None)
        if scheduler is not None:
            scheduler.start()
        log.info("server ready: role=%s database=%s nodes=%d", runtime.role,
                 runtime.engine.url.render_as_string(hide_password=True), len(runtime.fleet.all()))
        try:
            yield
        finally:
            if scheduler is not None:
                scheduler.shutdown(wait=False)
            runtime.stop()
            gc.set_threshold(*thresholds)
            sys.setswitchinterval(switch)

    return lifespan


def _health_routes(app: FastAPI, runtime: Runtime, settings: Settings, registry: CollectorRegistry) -> None:
    """/healthz, /readyz (no token) and /metrics (a viewer token unless `metrics_require_token` is off)."""

    @app.get("/healthz", tags=["health"])
    def healthz() -> dict[str, str]:
        """Liveness of the process itself; no token needed."""
        return {"status": "ok", "version": __version__, "role": runtime.role}

    @app.get("/readyz", tags=["health"],
             responses={503: {"description": "starting, or the database does not answer"}})
    def readyz() -> JSONResponse:
        """Ready when migrations ran and the database answers; a standby is ready too (it serves reads)."""
        if not runtime.ready:
            return JSONResponse({"status": "starting"}, status_code=503)
        try:
            with runtime.engine.connect() as conn:
                conn.execute(text("SELECT 1"))
        except Exception as exc:
            return JSONResponse({"status": "database unreachable", "error": str(exc)[:200]}, status_code=503)
        return JSONResponse({"status": "ready", "role": runtime.role})

    def metrics_auth(request: Request) -> None:
        if settings.metrics_require_token:
            allow(READ)(request)

    @app.get("/metrics", tags=["health"], dependencies=[Depends(metrics_auth)], response_class=PlainTextResponse,
             responses={200: {"description": "Prometheus text exposition",
                              "content": {CONTENT_TYPE_LATEST: {"schema": {"type": "string"}}}}})
    def metrics() -> Response:
        return Response(generate_latest(registry), media_type=CONTENT_TYPE_LATEST)
