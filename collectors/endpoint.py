"""The agent's HTTP endpoint: `/metrics`, `/healthz`, and `POST /v1/telemetry` for the SDK of local tasks.

Each SDK keeps one keep-alive connection open; the process behind a connection is found once, with its
first batch, and every batch on it is checked against it (collectors/sdk_gate.py).
"""

from __future__ import annotations

import contextlib
import json
import socket
import threading
from collections.abc import Callable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from collectors.sdk_gate import BatchRefused, Sender
from sentinel.telemetry.schemas import SdkBatch

MAX_SDK_BODY_BYTES = 8 * 2**20
JSON = "application/json"

Identify = Callable[[tuple[str, int], tuple[str, int], int], Sender]
Accept = Callable[[SdkBatch, Sender], None]


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"  # keep-alive: each SDK keeps one connection open
    metrics: Callable[[], tuple[bytes, str]]
    identify: Identify
    accept: Accept
    sender: Sender | None = None  # per connection: one handler instance serves one connection

    def do_GET(self) -> None:
        if self.path.split("?")[0] == "/metrics":
            self._send(200, *self.metrics())
        elif self.path == "/healthz":
            self._send(200, b'{"status":"ok"}', JSON)
        else:
            self._send(404, b'{"detail":"not found"}', JSON)

    def do_POST(self) -> None:
        if self.path.split("?")[0] != "/v1/telemetry":
            self._send(404, b'{"detail":"not found"}', JSON)
            return
        length = int(self.headers.get("content-length") or 0)
        if length > MAX_SDK_BODY_BYTES:
            self._send(413, b'{"detail":"telemetry batch too large"}', JSON)
            return
        try:
            batch = SdkBatch.model_validate_json(self.rfile.read(length))
        except ValueError as exc:
            self._send(422, json.dumps({"detail": str(exc)[:2000]}).encode(), JSON)
            return
        if self.sender is None:
            self.sender = self.identify(self.client_address[:2], self.connection.getsockname()[:2], batch.pid)
        try:
            self.accept(batch, self.sender)
        except BatchRefused as refused:  # the connection closes with it: the next one is identified afresh
            self._send(403, json.dumps({"detail": refused.detail}).encode(), JSON)
            return
        self._send(204, b"", JSON)

    def _send(self, status: int, body: bytes, content_type: str) -> None:
        self.send_response(status)
        self.send_header("content-type", content_type)
        self.send_header("content-length", str(len(body)))
        if status >= 400:  # the request body may be unread: do not reuse this connection
            self.send_header("connection", "close")
            self.close_connection = True
        # the head and the body in one write (end_headers() would send the head alone, then the body): each
        # write on loopback is a syscall that also runs the reader's side of TCP, so it is most of a batch's cost
        self._headers_buffer.append(b"\r\n" + body)  # type: ignore[attr-defined]  # http.server's own buffer
        self.flush_headers()

    def log_message(self, format: str, *args: Any) -> None:
        return


class _Server(ThreadingHTTPServer):
    """Its accept loop wakes for connections only, not every half second (the socketserver default, so that
    shutdown() is noticed): shutdown() wakes it itself, with a connection of its own."""

    daemon_threads = True
    poll_seconds = 60.0

    def shutdown(self) -> None:
        done = threading.Event()

        address = (str(self.server_address[0]), int(self.server_address[1]))

        def nudge() -> None:
            while not done.wait(0.05):
                with contextlib.suppress(OSError):
                    socket.create_connection(address, timeout=0.5).close()

        threading.Thread(target=nudge, name="sentinel-agent-http-stop", daemon=True).start()
        try:
            super().shutdown()
        finally:
            done.set()


def serve(host: str, port: int, *, metrics: Callable[[], tuple[bytes, str]], identify: Identify,
          accept: Accept) -> ThreadingHTTPServer:
    """Start serving on a daemon thread; `metrics` gives the exposition body and its content type."""
    handler = type("AgentHandler", (_Handler,), {"metrics": staticmethod(metrics), "identify": staticmethod(identify),
                                                 "accept": staticmethod(accept)})
    server = _Server((host, port), handler)
    threading.Thread(target=server.serve_forever, args=(server.poll_seconds,), name="sentinel-agent-http",
                     daemon=True).start()
    return server
