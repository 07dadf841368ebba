"""The agent's HTTP endpoint: `/metrics`, `/healthz`, and `POST /v1/telemetry` for the SDK of local tasks.

Each SDK keeps one keep-alive connection open; the process behind a connection is found once, with its
first batch, and every batch on it is checked against it (collectors/sdk_gate.py).

A small HTTP/1.1 reader of its own, not http.server's: each task posts a batch every second, and
http.server parsed each request's headers through the email package and wrote a Server and Date line
built afresh, about as much CPU as validating and summing the batch. Here a request is a request line, its
headers split once (content-length, connection, expect and transfer-encoding are read, the rest skipped),
its body, and one write for the answer.
"""

from __future__ import annotations

import contextlib
import email.utils
import io
import json
import logging
import socket
import socketserver
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from http import HTTPStatus
from http.server import ThreadingHTTPServer

from collectors.sdk_gate import BatchRefused, Sender
from sentinel.telemetry.schemas import SdkBatch

log = logging.getLogger("sentinel.agent.http")

MAX_SDK_BODY_BYTES = 8 * 2**20
MAX_LINE_BYTES = 65536
MAX_HEADERS = 100
JSON = "application/json"

Identify = Callable[[tuple[str, int], tuple[str, int], int], Sender]
Accept = Callable[[SdkBatch, Sender], None]


class BadRequest(Exception):
    """The request cannot be read: answered with `status`, and the connection closed."""

    def __init__(self, status: int, detail: str):
        super().__init__(detail)
        self.status, self.detail = status, detail


@dataclass
class Request:
    method: bytes
    path: str
    content_length: int | None
    keep_alive: bool
    expect_continue: bool
    chunked: bool


def read_request(rfile: io.BufferedIOBase) -> Request | None:
    """The next request's line and headers from `rfile`; None when the client closed the connection between
    requests. Raises BadRequest for what is not HTTP/1.x."""
    readline = rfile.readline
    line = readline(MAX_LINE_BYTES + 1)
    for _ in range(4):  # RFC 9112 2.2: empty lines before a request line are ignored
        if line not in (b"\r\n", b"\n"):
            break
        line = readline(MAX_LINE_BYTES + 1)
    if not line:
        return None
    if len(line) > MAX_LINE_BYTES:
        raise BadRequest(HTTPStatus.REQUEST_URI_TOO_LONG, "request line too long")
    words = line.split()
    if len(words) != 3 or not words[2].startswith(b"HTTP/"):
        raise BadRequest(HTTPStatus.BAD_REQUEST, f"bad request line {line[:200]!r}")
    method, target, version = words
    if version not in (b"HTTP/1.1", b"HTTP/1.0"):
        raise BadRequest(HTTPStatus.HTTP_VERSION_NOT_SUPPORTED, f"HTTP version {version[5:].decode('latin-1')!r}")
    length: int | None = None
    connection = expect = encoding = b""
    for _ in range(MAX_HEADERS + 1):
        header = readline(MAX_LINE_BYTES + 1)
        if header in (b"\r\n", b"\n", b""):
            break
        if len(header) > MAX_LINE_BYTES:
            raise BadRequest(HTTPStatus.REQUEST_HEADER_FIELDS_TOO_LARGE, "header line too long")
        name, colon, value = header.partition(b":")
        if not colon:
            raise BadRequest(HTTPStatus.BAD_REQUEST, f"bad header line {header[:200]!r}")
        name = name.strip().lower()
        if name == b"content-length":
            if length is not None or not value.strip().isdigit():
                raise BadRequest(HTTPStatus.BAD_REQUEST, "bad content-length")
            length = int(value)
        elif name == b"connection":
            connection = value.strip().lower()
        elif name == b"expect":
            expect = value.strip().lower()
        elif name == b"transfer-encoding":
            encoding = value.strip().lower()
    else:
        raise BadRequest(HTTPStatus.REQUEST_HEADER_FIELDS_TOO_LARGE, f"more than {MAX_HEADERS} headers")
    http11 = version == b"HTTP/1.1"
    keep_alive = connection != b"close" if http11 else connection == b"keep-alive"
    path = target.decode("latin-1").split("?", 1)[0]
    return Request(method, path, length, keep_alive, http11 and expect == b"100-continue", bool(encoding))


class _DateLine:
    """The Date header line, formatted once a second."""

    def __init__(self) -> None:
        self._second = -1
        self._line = b""

    def __call__(self) -> bytes:
        now = int(time.time())
        if now != self._second:
            self._line = f"date: {email.utils.formatdate(now, usegmt=True)}\r\n".encode()
            self._second = now
        return self._line


_date_line = _DateLine()
_NO_CONTENT_HEAD = b"HTTP/1.1 204 No Content\r\nserver: sentinel-agent\r\n"


class _Handler(socketserver.StreamRequestHandler):
    """One connection: its requests, one after the other, until either side closes it."""

    rbufsize = 256 * 1024  # a batch of many steps arrives in one read
    metrics: Callable[[], tuple[bytes, str]]
    identify: Identify
    accept: Accept

    def handle(self) -> None:
        sender: Sender | None = None  # per connection: found with its first batch
        with contextlib.suppress(ConnectionError, TimeoutError):
            while True:
                try:
                    request = read_request(self.rfile)
                except BadRequest as bad:
                    self._send(bad.status, json.dumps({"detail": bad.detail}).encode(), JSON, keep_alive=False)
                    return
                if request is None:
                    return
                if request.method == b"POST" and request.path == "/v1/telemetry":
                    keep, sender = self._telemetry(request, sender)
                elif request.method == b"GET" and request.path in ("/metrics", "/healthz"):
                    keep = self._get(request)
                elif request.method in (b"GET", b"POST"):
                    keep = self._send(404, b'{"detail":"not found"}', JSON, keep_alive=False)
                else:
                    keep = self._send(501, b'{"detail":"method not supported"}', JSON, keep_alive=False)
                if not keep:
                    return

    def _get(self, request: Request) -> bool:
        if request.content_length:  # a GET with a body: not read, so the connection cannot be reused
            return self._send(400, b'{"detail":"a GET has no body"}', JSON, keep_alive=False)
        if request.path == "/healthz":
            return self._send(200, b'{"status":"ok"}', JSON, keep_alive=request.keep_alive)
        try:
            body, content_type = self.metrics()
        except Exception:
            log.exception("rendering /metrics failed")
            return self._send(500, b'{"detail":"metrics failed"}', JSON, keep_alive=False)
        return self._send(200, body, content_type, keep_alive=request.keep_alive)

    def _telemetry(self, request: Request, sender: Sender | None) -> tuple[bool, Sender | None]:
        if request.chunked:
            return self._send(411, b'{"detail":"a batch needs a content-length"}', JSON, keep_alive=False), sender
        length = request.content_length or 0
        if length > MAX_SDK_BODY_BYTES:
            return self._send(413, b'{"detail":"telemetry batch too large"}', JSON, keep_alive=False), sender
        if request.expect_continue:
            self.wfile.write(b"HTTP/1.1 100 Continue\r\n\r\n")
        body = self.rfile.read(length)
        if len(body) < length:
            return False, sender  # the client went away mid-body
        try:
            batch = SdkBatch.model_validate_json(body)
        except ValueError as exc:
            return self._send(422, json.dumps({"detail": str(exc)[:2000]}).encode(), JSON, keep_alive=False), sender
        if sender is None:
            sender = self.identify(self.client_address[:2], self.connection.getsockname()[:2], batch.pid)
        try:
            self.accept(batch, sender)
        except BatchRefused as refused:  # the connection closes with it: the next one is identified afresh
            return self._send(403, json.dumps({"detail": refused.detail}).encode(), JSON, keep_alive=False), sender
        head = _NO_CONTENT_HEAD + _date_line()
        self.wfile.write(head + (b"\r\n" if request.keep_alive else b"connection: close\r\n\r\n"))
        return request.keep_alive, sender

    def _send(self, status: int, body: bytes, content_type: str, *, keep_alive: bool) -> bool:
        """The head and the body in one write: each write on loopback is a syscall that also runs the reader's
        side of TCP. A status of 400 or more closes the connection (its request body may be unread).
        Returns whether the connection stays open."""
        keep_alive = keep_alive and status < 400
        head = (f"HTTP/1.1 {status} {HTTPStatus(status).phrase}\r\nserver: sentinel-agent\r\n"
                f"content-type: {content_type}\r\ncontent-length: {len(body)}\r\n").encode("latin-1")
        close = b"" if keep_alive else b"connection: close\r\n"
        self.wfile.write(head + close + _date_line() + b"\r\n" + body)
        return keep_alive


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
