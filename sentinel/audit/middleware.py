"""Every state-changing call under /api/v1 leaves an audit entry, also when its handler does not write one.

Handlers that know what they changed call `audit.service.record` (action `node.cordon`, subject `node/x`);
for any other authenticated POST/PUT/PATCH/DELETE, and for every one that failed, this middleware writes
`http.<method>` with the path as subject and the status in `detail`, after the response was sent.

Not audited row by row, on purpose: node reports (`POST /nodes/{node}/reports`, ~1,000/s at fleet scale;
their record is the ingest receipt on (node, seq)), checkpoint shard registration (`PUT …/shards/{rank}`;
its record is the shard row, and the step's commit is audited) and a router's queue (`PUT …/serving/router`, a
gauge said at each change). Unauthenticated (401) and rate-limited (429)
calls are counted, not audited: a flood of them must not become a flood of rows.
"""

from __future__ import annotations

import logging
import re
from typing import Any

from starlette.concurrency import run_in_threadpool
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from sentinel.audit.context import CallNote, current_call
from sentinel.audit.models import AuditEntry
from sentinel.db import transaction

log = logging.getLogger("sentinel.audit")

STATE_CHANGING = frozenset({"POST", "PUT", "PATCH", "DELETE"})
HIGH_VOLUME = re.compile(r"^/api/v1/(nodes/[^/]+/reports|jobs/[^/]+/checkpoints/[^/]+/shards/[^/]+"
                         r"|jobs/[^/]+/serving/router)/?$")
NOT_AUDITED_STATUS = frozenset({401, 429})


def needs_entry(method: str, path: str) -> bool:
    return method in STATE_CHANGING and path.startswith("/api/v1/") and not HIGH_VOLUME.match(path)


class AuditCalls:
    """Pure ASGI middleware (no body buffering, no extra task): notes who called, writes what is missing."""

    def __init__(self, app: ASGIApp):
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or not needs_entry(scope["method"], scope["path"]):
            await self.app(scope, receive, send)
            return
        note = CallNote()
        token = current_call.set(note)
        status: int | None = None

        async def noting_send(message: Message) -> None:
            nonlocal status
            if message["type"] == "http.response.start":
                status = int(message["status"])
            await send(message)

        try:
            await self.app(scope, receive, noting_send)
        finally:
            current_call.reset(token)
            final = 500 if status is None else status
            if note.actor is not None and final not in NOT_AUDITED_STATUS and (not note.audited or final >= 400):
                await run_in_threadpool(self._write, scope, note.actor, final)

    @staticmethod
    def _write(scope: Scope, actor: str, status: int) -> None:
        method, path = scope["method"], scope["path"]
        detail: dict[str, Any] = {"method": method, "path": path, "status": status}
        try:
            with transaction(scope["app"].state.runtime.factory) as session:
                session.add(AuditEntry(actor=actor, action=f"http.{method.lower()}", subject=path[:256],
                                       detail=detail))
        except Exception:  # the call itself is done; a lost audit row is logged, never a failed request
            log.exception("audit entry not written: actor=%s %s %s status=%d", actor, method, path, status)
