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
import logging
import math
import threading
import time
from dataclasses import dataclass, field
from typing import Any

from sentinel.serving.forward import Forwarder, QuietServer

log = logging.getLogger("sentinel.serving.router")

GAP_WEIGHT = 0.1  # of each new gap in the smoothed one: a replica's step time follows its batch within ~10 tokens
RUSH_QUIET_SECONDS = 1.0  # a replica silent this long with requests in flight takes none past its limit


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
        handler = type("RouterHandler", (Forwarder,), {"router": self})
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
