"""The serving router: one address in front of a job's replicas, so a replica can be drained, replaced and cut
over without its clients noticing, and every request in flight at a fault is accounted for.

`sentinel launch --serve HOST:PORT` runs it in the launcher (sentinel/launcher/replicas.py adds and drains the
replicas). It forwards `/v1/*` to the ready replica with the fewest requests in flight, up to `limit` each
(the batching controller's admission limit, for replicas that cannot take one themselves; excess requests
wait, at most `queue_seconds`). Those that wait are the router's queue (`waiting`): an engine whose admission
the router holds reports none of them, so the launcher reports it for the job (sentinel/launcher/router_queue.py)
and the batching controller adds it to the engines' own queues.

With the job's SLO (`slo`: TTFT and TPOT targets), a request that has waited half its TTFT target is admitted
past the limit (`rushed`) to a replica whose tokens come fast enough that one more request keeps them within
the TPOT target (the gap between two tokens of a stream there, smoothed, taken to grow in proportion to the
requests in flight), at most `burst` × the limit. The batching controller decides on reports, seconds apart:
a burst that fills the limit and drains between two of its turns is over before it is seen, and only the
router sees the wait as it happens. What happens to a
request whose replica fails:
- nothing sent to the client yet (refused, reset, HTTP 5xx such as vLLM's EngineDeadError, or a whole answer
  not yet complete): sent again to another replica, counted `retried`;
- a stream that ends without a token of text (an empty 200): sent again to another replica, `retried`, unless
  it was the last try (then the client gets it as it came);
- a stream that broke mid-answer, for a completion with a text prompt: resumed on another replica with the
  prompt and the text so far, `max_tokens` less what came (`resumed`); the client sees one stream;
- otherwise it fails (`failed`), and the client sees its stream end without `[DONE]`.
"""

from __future__ import annotations

import http.client
import json
import logging
import math
import sys
import threading
import time
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

log = logging.getLogger("sentinel.serving.router")

GAP_WEIGHT = 0.1  # of each new gap in the smoothed one: a replica's step time follows its batch within ~10 tokens
RUSH_QUIET_SECONDS = 1.0  # a replica silent this long with requests in flight takes none past its limit
HOP = frozenset({"connection", "keep-alive", "transfer-encoding", "content-length", "te", "trailer", "upgrade"})
MAX_BODY_BYTES = 4 << 20


@dataclass
class Backend:
    name: str
    host: str
    port: int
    ready: bool = False
    draining: bool = False
    in_flight: int = 0
    served: int = 0
    failed: int = 0  # requests that failed here, whatever became of them next (retried, resumed or failed)
    last_byte_at: float = 0.0  # monotonic: when an answer's bytes last came from it
    limit: int | None = None  # requests in flight at once; None where the replica limits itself
    gap: float | None = None  # seconds between two tokens of a stream here, smoothed: the TPOT it gives now
    added_at: float = field(default_factory=time.monotonic)


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


class Router:
    def __init__(self, host: str = "127.0.0.1", port: int = 0, *, limit: int | None = None,
                 queue_seconds: float = 30.0, attempts: int = 3, connect_seconds: float = 2.0,
                 read_seconds: float = 30.0, slo: tuple[float, float] | None = None, burst: float = 2.0) -> None:
        self.limit = limit
        self.slo, self.burst = slo, burst  # (TTFT, TPOT) targets in seconds: admission past the limit (above)
        self.queue_seconds, self.attempts = queue_seconds, attempts
        self.connect_seconds, self.read_seconds = connect_seconds, read_seconds
        self.backends: dict[str, Backend] = {}
        self.counts = {"requests": 0, "ok": 0, "retried": 0, "resumed": 0, "failed": 0, "rejected": 0,
                       "cancelled": 0, "rushed": 0}
        self.waiting = 0  # requests held because every ready replica is at its limit (not those with none ready)
        self.cond = threading.Condition()
        handler = type("RouterHandler", (_Handler,), {"router": self})
        self.httpd = QuietServer((host, port), handler)
        self.address = f"http://{host}:{self.httpd.server_address[1]}"
        threading.Thread(target=self.httpd.serve_forever, name="sentinel-router", daemon=True).start()

    def close(self) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()

    # -- the replicas ---------------------------------------------------------------------------------
    def add(self, name: str, port: int, host: str = "127.0.0.1") -> Backend:
        """A replica, routed to once `wait_ready` has seen it answer."""
        with self.cond:
            backend = self.backends[name] = Backend(name, host, port, limit=self.limit)
            return backend

    def wait_ready(self, backend: Backend, timeout: float, alive: Any = lambda: True) -> bool:
        """Poll the replica's `GET /v1/models` until it answers 200 (or `alive()` says its process is gone)."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline and alive():
            conn = http.client.HTTPConnection(backend.host, backend.port, timeout=1.0)
            try:
                conn.request("GET", "/v1/models")
                if conn.getresponse().status == 200:
                    with self.cond:
                        backend.ready = True
                        self.cond.notify_all()
                    return True
            except (OSError, http.client.HTTPException):
                pass
            finally:
                conn.close()
            time.sleep(0.05)
        return False

    def drain(self, name: str) -> Backend | None:
        """Route nothing new to `name`; its requests in flight go on."""
        with self.cond:
            backend = self.backends.get(name)
            if backend is not None:
                backend.draining = True
            return backend

    def wait_drained(self, backend: Backend, timeout: float, stalled_seconds: float | None = None) -> bool:
        """Until its requests in flight are done (True), `timeout`, or, with `stalled_seconds`, until no byte of
        theirs has come for that long (frozen: waiting longer saves nothing)."""
        deadline = time.monotonic() + timeout
        with self.cond:
            while backend.in_flight and time.monotonic() < deadline:
                if stalled_seconds is not None and time.monotonic() - backend.last_byte_at > stalled_seconds:
                    break
                self.cond.wait(min(0.1, max(0.0, deadline - time.monotonic())))
            return backend.in_flight == 0

    def remove(self, backend: Backend) -> None:
        with self.cond:
            if self.backends.get(backend.name) is backend:
                del self.backends[backend.name]

    def set_limit(self, limit: int | None, names: set[str] | None = None) -> None:
        """The admission limit of the replicas `names` (all of them, and those added later, by default)."""
        with self.cond:
            if names is None:
                self.limit = limit
            for b in self.backends.values():
                if names is None or b.name in names:
                    b.limit = limit
            self.cond.notify_all()

    def snapshot(self) -> dict[str, Any]:
        with self.cond:
            return {"counts": dict(self.counts), "limit": self.limit, "waiting": self.waiting, "replicas": {
                b.name: {"ready": b.ready, "draining": b.draining, "in_flight": b.in_flight, "served": b.served,
                         "failed": b.failed, "port": b.port, "limit": b.limit, "gap": b.gap}
                for b in self.backends.values()}}

    # -- routing --------------------------------------------------------------------------------------
    def acquire(self, avoid: set[str]) -> Backend | None:
        """The ready replica with the fewest in flight and room under the limit; waits for one. While it waits
        with ready replicas all at their limit, the request counts in `waiting`; with an SLO, once it has waited
        half the TTFT target it may go past the limit (`_rush_room`)."""
        start = time.monotonic()
        deadline = start + self.queue_seconds
        rush_at = start + self.slo[0] / 2 if self.slo else math.inf
        held = False
        with self.cond:
            try:
                while True:
                    usable = [b for b in self.backends.values() if b.ready and not b.draining]
                    fresh = [b for b in usable if b.name not in avoid] or usable
                    room = [b for b in fresh if b.limit is None or b.in_flight < b.limit]
                    now = time.monotonic()
                    rushed = not room and now >= rush_at
                    if rushed:
                        room = [b for b in fresh if self._rush_room(b)]
                    if room:
                        chosen = min(room, key=lambda b: (b.in_flight, b.added_at))
                        chosen.in_flight += 1
                        if rushed:
                            self.counts["rushed"] += 1
                        return chosen
                    left = deadline - now
                    if left <= 0:
                        return None
                    if held != bool(fresh):  # held by the limit, or (no replica ready) not
                        held = bool(fresh)
                        self.waiting += 1 if held else -1
                    self.cond.wait(min(left, 0.5, rush_at - now if now < rush_at else 0.5))
            finally:
                if held:
                    self.waiting -= 1

    def _rush_room(self, b: Backend) -> bool:
        """Whether `b` takes one request past its limit: its tokens' gap, grown in proportion to one more in
        flight, stays within the TPOT target, and it is under `burst` × its limit. No gap measured, or no byte
        from it for RUSH_QUIET_SECONDS (frozen, or busy with a long prefill: its gap is old news): no."""
        if self.slo is None or b.limit is None or b.gap is None or not b.in_flight:
            return False
        if time.monotonic() - b.last_byte_at > RUSH_QUIET_SECONDS:
            return False
        return b.in_flight < math.ceil(self.burst * b.limit) and b.gap * (b.in_flight + 1) / b.in_flight <= self.slo[1]

    def token(self, backend: Backend, gap: float) -> None:
        """A stream on `backend` got a token `gap` seconds after its previous one."""
        with self.cond:
            backend.gap = gap if backend.gap is None else backend.gap + GAP_WEIGHT * (gap - backend.gap)

    def release(self, backend: Backend, ok: bool) -> None:
        with self.cond:
            backend.in_flight -= 1
            if ok:
                backend.served += 1
            else:
                backend.failed += 1
            self.cond.notify_all()

    def count(self, what: str) -> None:
        with self.cond:
            self.counts[what] += 1


class _Handler(BaseHTTPRequestHandler):
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
