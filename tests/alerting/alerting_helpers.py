"""Shared pieces for the alerting tests: a recording HTTP receiver on loopback and incident rows."""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import UTC, datetime
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import httpx
from sqlalchemy.orm import Session, sessionmaker

from sentinel.alerting.notifiers import OutboundRequest
from sentinel.config import ReceiverConfig
from sentinel.db import make_engine, make_sessionmaker, upgrade
from sentinel.incidents.models import Incident


@dataclass
class Recorded:
    method: str
    path: str
    headers: dict[str, str]
    body: bytes

    def json(self) -> Any:
        return json.loads(self.body)


class LoopbackReceiver:
    """Test double for a remote receiver (Slack, PagerDuty, a webhook, Alertmanager's API): a real HTTP
    server on 127.0.0.1 that records every request and answers with scripted statuses (then `default`).
    With `echo`, error answers quote the request body back, as some receivers do."""

    def __init__(self, responses: list[int | tuple[int, dict[str, str]]] | None = None, default: int = 200,
                 echo: bool = False):
        self.responses = list(responses or [])
        self.default = default
        self.echo = echo
        self.requests: list[Recorded] = []
        self._cond = threading.Condition()
        receiver = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
                with receiver._cond:
                    headers = {k.lower(): v for k, v in self.headers.items()}
                    receiver.requests.append(Recorded("POST", self.path, headers, body))
                    status, reply_headers = receiver._next()
                    receiver._cond.notify_all()
                answer = b"ok" if status < 300 else (body if receiver.echo else b'{"error":"scripted failure"}')
                self.send_response(status)
                for name, value in reply_headers.items():
                    self.send_header(name, value)
                self.send_header("Content-Length", str(len(answer)))
                self.end_headers()
                self.wfile.write(answer)

            def log_message(self, *args: Any) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        self._thread = threading.Thread(target=self.server.serve_forever, kwargs={"poll_interval": 0.02}, daemon=True)

    def _next(self) -> tuple[int, dict[str, str]]:
        if not self.responses:
            return self.default, {}
        item = self.responses.pop(0)
        return (item, {}) if isinstance(item, int) else item

    def __enter__(self) -> LoopbackReceiver:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.server.shutdown()
        self.server.server_close()

    def wait_for(self, count: int, timeout: float = 10.0, path: str | None = None) -> list[Recorded]:
        """Block until `count` requests (to `path`, if given) arrived; return them."""
        def matching() -> list[Recorded]:
            return [r for r in self.requests if path is None or r.path == path]

        with self._cond:
            if not self._cond.wait_for(lambda: len(matching()) >= count, timeout):
                raise AssertionError(f"expected {count} requests to {path or 'any path'}, got {len(matching())}")
            return matching()

    def on(self, path: str) -> list[Recorded]:
        with self._cond:
            return [r for r in self.requests if r.path == path]


def incident(**overrides: Any) -> Incident:
    """An incident as the detectors write one, every column set (so it renders without a database too)."""
    now = datetime.now(UTC).replace(microsecond=0)
    values: dict[str, Any] = dict(
        fingerprint="xid:node-a:GPU-1:79", detector="xid", state="open", severity="critical",
        title="XID 79 on node-a GPU 1: fell off the bus", layer="hardware", node="node-a",
        accelerator_uuid="GPU-1", job_id=7, rank=3, seen="XID 79 reported by the driver at 12:00:01",
        comparison="no other accelerator on node-a reported an XID in 24 h", evidence={"xid": 79, "count": 1},
        recommended_action="restart_node",
        actions=[{"at": now.isoformat(), "text": "quarantined GPU-1"},
                 {"at": now.isoformat(), "text": "restarted job 7"}],
        next_steps=["check `nvidia-smi -q` on node-a", "reseat GPU 1 if it recurs"], latched=True, occurrences=1,
        observed_at=now, opened_at=now, detection_latency_seconds=0.4, last_seen_at=now, acknowledged_at=None,
        acknowledged_by="", resolved_at=None, resolved_by="", resolve_reason="")
    values.update(overrides)
    return Incident(**values)


@contextmanager
def database(url: str) -> Iterator[sessionmaker[Session]]:
    """The schema built by the migrations, as in production."""
    upgrade(url)
    engine = make_engine(url)
    try:
        yield make_sessionmaker(engine)
    finally:
        engine.dispose()


def deliver(request: OutboundRequest, rx: LoopbackReceiver) -> Recorded:
    """Post a rendered request to the loopback receiver as the dispatcher would; what it recorded."""
    response = httpx.post(request.url, content=request.body, headers=request.headers, timeout=5)
    assert response.status_code == 200
    return rx.requests[-1]


def receiver(kind: str, url: str, **extra: object) -> ReceiverConfig:
    return ReceiverConfig.model_validate({"name": kind, "kind": kind, "url": url, **extra})
