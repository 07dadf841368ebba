"""The router's HTTP side: a client's request forwarded to a replica, tried again, resumed or failed as
sentinel/serving/router.py says, with the stream relayed event by event; and the small http.server pieces the
router and the project's demo engine share."""

from __future__ import annotations

import http.client
import json
import logging
import sys
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from sentinel.serving.router import Backend, Router

log = logging.getLogger("sentinel.serving.router")

HOP = frozenset({"connection", "keep-alive", "transfer-encoding", "content-length", "te", "trailer", "upgrade"})
MAX_BODY_BYTES = 4 << 20


class QuietServer(ThreadingHTTPServer):
    """A client that hangs up between requests is no error worth a traceback on stderr."""

    daemon_threads = True

    def handle_error(self, request: Any, client_address: Any) -> None:
        error = sys.exc_info()[1]
        if isinstance(error, ConnectionError | TimeoutError):
            log.debug("connection from %s ended: %s", client_address, error)
        else:
            log.exception("request from %s failed", client_address)


def send_json(handler: BaseHTTPRequestHandler, status: int, body: dict[str, Any]) -> None:
    """A whole JSON answer on an http.server handler (the router's, the demo engine's)."""
    data = json.dumps(body).encode()
    handler.send_response(status)
    handler.send_header("content-type", "application/json")
    handler.send_header("content-length", str(len(data)))
    handler.end_headers()
    handler.wfile.write(data)

class Broken(Exception):
    """The replica failed a request; `sent` says whether the client has had bytes of the answer."""

    def __init__(self, why: str, sent: bool):
        super().__init__(why)
        self.sent = sent


class Forwarder(BaseHTTPRequestHandler):
    """One client connection: its requests forwarded to the router's replicas (see sentinel/serving/router.py)."""

    router: Router
    protocol_version = "HTTP/1.1"

    def log_message(self, *args: object) -> None:
        pass

    def _answer(self, status: int, body: dict[str, Any]) -> None:
        send_json(self, status, body)

    def do_GET(self) -> None:
        if self.path == "/sentinel/router":
            self._answer(200, self.router.snapshot())
        else:
            self._forward(b"")

    def do_POST(self) -> None:
        size = int(self.headers.get("content-length") or 0)
        if size > MAX_BODY_BYTES:
            self._answer(413, {"error": f"request body over {MAX_BODY_BYTES} bytes"})
            return
        self._forward(self.rfile.read(size))

    def _forward(self, body: bytes) -> None:
        router = self.router
        router.count("requests")
        try:
            request = json.loads(body) if body else {}
        except ValueError:
            request = {}
        streamed = bool(isinstance(request, dict) and request.get("stream"))
        state = {"sent_headers": False, "text": "", "tokens": 0}
        avoid: set[str] = set()
        for attempt in range(router.attempts):
            backend = router.acquire(avoid)
            if backend is None:
                router.count("rejected")
                if not state["sent_headers"]:
                    self._answer(503, {"error": "no replica ready within the queue time"})
                return
            avoid.add(backend.name)
            try:
                payload = body if attempt == 0 or not state["tokens"] else self._resume(request, state)
                self._one(backend, payload, streamed, state, attempt == router.attempts - 1)
                router.count("ok")
                router.release(backend, ok=True)
                return
            except OSError:  # writing to the client failed (a replica's errors come as Broken): it left
                router.count("cancelled")
                router.release(backend, ok=True)
                self.close_connection = True
                return
            except Broken as broken:
                log.warning("request failed on a replica: replica=%s path=%s sent=%s error=%s", backend.name,
                            self.path, broken.sent, broken)
                resumable = streamed and self.path == "/v1/completions" and isinstance(request.get("prompt"), str)
                last = (broken.sent and not resumable) or attempt == router.attempts - 1
                router.count("failed" if last else "resumed" if broken.sent else "retried")  # counted, then released:
                router.release(backend, ok=False)  # a drain that waits on it sees the count
                if last:
                    break
        if not state["sent_headers"]:
            self._answer(502, {"error": "every replica tried failed this request"})
        self.close_connection = True

    @staticmethod
    def _resume(request: dict[str, Any], state: dict[str, Any]) -> bytes:
        again = dict(request)
        again["prompt"] = str(request.get("prompt", "")) + state["text"]
        again["max_tokens"] = max(1, int(request.get("max_tokens", 16)) - state["tokens"])
        return json.dumps(again).encode()

    def _one(self, backend: Backend, payload: bytes, streamed: bool, state: dict[str, Any], last: bool) -> None:
        router = self.router
        conn = http.client.HTTPConnection(backend.host, backend.port, timeout=router.connect_seconds)
        try:
            try:
                conn.request(self.command, self.path, body=payload or None,
                             headers={"content-type": self.headers.get("content-type", "application/json")})
                if conn.sock is not None:
                    conn.sock.settimeout(router.read_seconds)
                response = conn.getresponse()
            except (OSError, http.client.HTTPException) as exc:
                raise Broken(f"{type(exc).__name__}: {exc}", state["sent_headers"]) from exc
            if response.status >= 500:
                raise Broken(f"HTTP {response.status}: {response.read(200)!r}", state["sent_headers"])
            if not streamed:
                try:
                    data = response.read()
                except (OSError, http.client.HTTPException) as exc:
                    raise Broken(f"answer cut: {exc}", False) from exc
                backend.last_byte_at = time.monotonic()
                self.send_response(response.status)
                for k, v in response.getheaders():
                    if k.lower() not in HOP:
                        self.send_header(k, v)
                self.send_header("content-length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)
                return
            self._relay(backend, response, state, last)
        finally:
            conn.close()

    def _relay(self, backend: Backend, response: http.client.HTTPResponse, state: dict[str, Any],
               last: bool) -> None:
        """Forward a stream event by event, keeping the text so far (for a resume). Until its first token of
        text the events are held: a stream that ends with none (an empty 200, vllm-ascend #13165) is tried on
        another replica, unless this is the last try. A resumed stream's events follow the ones sent."""
        held: list[bytes] = []
        speaking = state["tokens"] > 0  # a resume: the client has its stream already
        token_at: float | None = None  # this replica's previous token of the stream
        while True:
            try:
                line = response.readline(1 << 20)
            except (OSError, http.client.HTTPException) as exc:
                raise Broken(f"stream cut: {type(exc).__name__}: {exc}", state["sent_headers"]) from exc
            if not line:
                raise Broken("stream ended without [DONE]", state["sent_headers"])
            backend.last_byte_at = time.monotonic()
            data = line.strip()
            done = data == b"data: [DONE]"
            if data.startswith(b"data:") and not done and self._note(data, state):
                speaking = True
                if token_at is not None:
                    self.router.token(backend, backend.last_byte_at - token_at)
                token_at = backend.last_byte_at
            if not speaking and not done:
                held.append(line)
                continue
            if done and not speaking and not last:
                raise Broken("an empty answer: [DONE] and no token of text", False)
            if not state["sent_headers"]:
                self.send_response(response.status)
                self.send_header("content-type", response.getheader("content-type", "text/event-stream"))
                self.send_header("transfer-encoding", "chunked")
                self.end_headers()
                state["sent_headers"] = True
            for event in (*held, line):
                self._chunk(event)
            held = []
            if done:
                self.wfile.write(b"0\r\n\r\n")
                self.wfile.flush()
                self.close_connection = True  # one stream per connection, as the engines do
                return

    @staticmethod
    def _note(data: bytes, state: dict[str, Any]) -> bool:
        """The text of one event, kept for a resume; True when it carried some."""
        try:
            event = json.loads(data[5:])
        except ValueError:
            return False
        spoke = False
        for choice in event.get("choices") or [] if isinstance(event, dict) else []:
            if isinstance(choice, dict) and choice.get("text"):
                state["text"] += choice["text"]
                state["tokens"] += 1
                spoke = True
        return spoke

    def _chunk(self, data: bytes) -> None:
        try:
            self.wfile.write(f"{len(data):x}\r\n".encode() + data + b"\r\n")
            self.wfile.flush()
        except OSError as exc:  # the client went away: nothing more to do for it
            raise ConnectionAbortedError("client gone") from exc  # an OSError: _forward counts it cancelled
