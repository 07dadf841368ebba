"""Request timing inside a serving process: TTFT, inter-token latency, time per output token, end to end,
queue time, per-stage time (encode / prefill / decode), KV-cache transfers, failures.

As cheap as step timing: a token is a clock read and an add to a dict under a lock; the recorder's sums ride in
the telemetry batch the `Telemetry` thread sends each second. A request that ends with no output token and no
failure said is counted failed "empty" (a failed decode answering 200 with an empty body, vllm-ascend #13165).

    requests = sentinel.sdk.init().serving(replica="r0", stage="decode")
    with requests.request(prompt_tokens=len(prompt)) as req:
        req.admitted()            # left the queue
        for token in engine.generate(prompt):
            req.token()
            yield token
"""

from __future__ import annotations

import re
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

from sentinel.sdk.buckets import bucket

STAGES = ("encode", "prefill", "decode")
REASONS = ("error", "empty", "truncated", "timeout", "cancelled", "rejected", "kv_transfer")
MAX_INFLIGHT = 100_000
MAX_KV_PEERS = 64  # as sentinel/telemetry/serving.py: more peers in an interval count without one
PEER_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._:-]{0,63}")  # a replica's name, as the wire's


class Request:
    """One request in flight; its times are `time.monotonic()` seconds."""

    __slots__ = (
        "_owner",
        "admitted_at",
        "failure",
        "first_token_at",
        "itl",
        "kv",
        "last_token_at",
        "prompt_tokens",
        "stages",
        "started",
        "tokens",
    )

    def __init__(self, owner: Requests, prompt_tokens: int) -> None:
        self._owner = owner
        self.started = owner.clock()
        self.admitted_at: float | None = None
        self.first_token_at: float | None = None
        self.last_token_at: float | None = None
        self.tokens = 0
        self.itl: list[float] = []
        self.stages: dict[str, float] = {}
        self.kv: list[tuple[float, int, bool, str | None]] = []
        self.failure: str | None = None
        self.prompt_tokens = prompt_tokens

    def admitted(self) -> None:
        """The request left the queue and the engine started on it (queue time ends here)."""
        if self.admitted_at is None:
            self.admitted_at = self._owner.clock()

    def token(self, count: int = 1) -> None:
        """`count` output tokens came out now (a streamed chunk may carry several)."""
        now = self._owner.clock()
        if self.first_token_at is None:
            self.first_token_at = now
        elif self.last_token_at is not None and len(self.itl) < 4096:
            self.itl.append((now - self.last_token_at) / max(count, 1))
        self.last_token_at = now
        self.tokens += count
        self._owner._token_at = time.time()

    def stage(self, name: str, seconds: float) -> None:
        """Time this request spent in `name` (encode, prefill or decode), measured by the engine."""
        if name in STAGES and seconds >= 0:
            self.stages[name] = self.stages.get(name, 0.0) + seconds

    def kv_transfer(self, seconds: float, nbytes: int = 0, ok: bool = True, peer: str | None = None) -> None:
        """A KV-cache transfer for this request: seconds, bytes, whether it worked, and `peer`, the replica it came
        from (its prefill replica, "p1"), so an incident can name the side that is slow. A peer whose name is not
        a replica name (letters, digits, `._:-`, at most 64) is not said."""
        if seconds >= 0 and len(self.kv) < 64:
            named = peer if isinstance(peer, str) and PEER_NAME.fullmatch(peer) else None
            self.kv.append((seconds, max(int(nbytes), 0), ok, named))

    def fail(self, reason: str = "error") -> None:
        """The request failed: error, empty, truncated, timeout, cancelled, rejected or kv_transfer."""
        self.failure = reason if reason in REASONS else "error"


class Requests:
    """Per-replica request sums until the telemetry thread takes them (`take`)."""

    def __init__(self, replica: str | None = None, stage: str = "mixed",
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.clock = clock
        self.replica = replica
        self.stage = stage if stage in (*STAGES, "mixed") else "mixed"
        self._lock = threading.Lock()
        self._open: dict[int, Request] = {}
        self._token_at: float | None = None
        self._batch_limit: int | None = None
        self._gauges: dict[str, Any] = {}
        self._reset()

    def _reset(self) -> None:
        self._requests = self._output = self._prompt = self._kv_bytes = self._kv_failures = self._preemptions = 0
        self._failed: dict[str, int] = {}
        self._hist: dict[str, dict[int, int]] = {}
        self._sums: dict[str, float] = {}
        self._joint: dict[str, int] = {}
        self._kv_peers: dict[str, dict[str, float]] = {}  # peer → seconds, count, failures, bytes

    @contextmanager
    def request(self, prompt_tokens: int = 0) -> Iterator[Request]:
        """Time one request from arrival to its last token; an exception out of the block fails it ("error")."""
        req = self.start(prompt_tokens)
        try:
            yield req
        except BaseException:
            if req.failure is None:
                req.fail("error")
            raise
        finally:
            self.finish(req)

    def start(self, prompt_tokens: int = 0) -> Request:
        req = Request(self, prompt_tokens)
        with self._lock:
            if len(self._open) < MAX_INFLIGHT:
                self._open[id(req)] = req
        return req

    def finish(self, req: Request) -> None:
        """The request is over: its latencies are counted."""
        end = self.clock()
        if req.failure is None and req.tokens == 0:
            req.failure = "empty"
        with self._lock:
            self._open.pop(id(req), None)
            self._requests += 1
            self._output += req.tokens
            self._prompt += req.prompt_tokens
            if req.failure is not None:
                self._failed[req.failure] = self._failed.get(req.failure, 0) + 1
            self._count("e2e", end - req.started)
            queued_until = req.admitted_at if req.admitted_at is not None else None
            if queued_until is not None:
                self._count("queue", queued_until - req.started)
            for name, seconds in req.stages.items():
                self._count(name, seconds)
            for seconds, nbytes, ok, peer in req.kv:
                self._count("kv_transfer", seconds)
                self._kv_bytes += nbytes
                self._kv_failures += 0 if ok else 1
                if peer is not None:
                    self._count_peer(peer, seconds, nbytes, ok)
            for gap in req.itl:
                self._count("itl", gap)
            if req.first_token_at is not None:  # a truncated stream's first token was real: its TTFT counts
                ttft = req.first_token_at - req.started
                self._count("ttft", ttft)
                tpot = ((req.last_token_at or req.first_token_at) - req.first_token_at) / (req.tokens - 1) \
                    if req.tokens > 1 else 0.0
                if req.tokens > 1:
                    self._count("tpot", tpot)
                key = f"{bucket(ttft)}:{bucket(tpot)}"
                if req.failure is None and (key in self._joint or len(self._joint) < 1024):
                    self._joint[key] = self._joint.get(key, 0) + 1  # a failed request meets no SLO

    def record(self, *, ttft: float | None, e2e: float, output_tokens: int, queue: float | None = None,
               tpot: float | None = None, failure: str | None = None, stages: dict[str, float] | None = None,
               prompt_tokens: int = 0) -> None:
        """A request the engine timed itself (seconds), counted as `request()` would count it."""
        req = Request(self, prompt_tokens)
        req.started = self.clock() - e2e
        if queue is not None:
            req.admitted_at = req.started + queue
        if ttft is not None and output_tokens > 0:
            req.first_token_at = req.started + ttft
            req.last_token_at = req.first_token_at + (tpot or 0.0) * max(output_tokens - 1, 0)
        req.tokens = output_tokens
        req.failure = failure if failure is None or failure in REASONS else "error"
        for name, seconds in (stages or {}).items():
            req.stage(name, seconds)
        self.finish(req)

    def preempted(self, count: int = 1) -> None:
        with self._lock:
            self._preemptions += count

    def set_state(self, *, running: int | None = None, waiting: int | None = None,
                  kv_cache_usage_ratio: float | None = None, batch_limit: int | None = None) -> None:
        """The engine's gauges, as it last knew them."""
        with self._lock:
            for name, value in (("running", running), ("waiting", waiting),
                                ("kv_cache_usage_ratio", kv_cache_usage_ratio), ("batch_limit", batch_limit)):
                if value is not None:
                    self._gauges[name] = value

    def _count(self, signal: str, seconds: float) -> None:
        hist = self._hist.setdefault(signal, {})
        k = bucket(seconds)
        hist[k] = hist.get(k, 0) + 1
        self._sums[signal] = self._sums.get(signal, 0.0) + max(seconds, 0.0)

    def _count_peer(self, peer: str, seconds: float, nbytes: int, ok: bool) -> None:
        sums = self._kv_peers.get(peer)
        if sums is None:
            if len(self._kv_peers) >= MAX_KV_PEERS:
                return
            sums = self._kv_peers[peer] = {"seconds": 0.0, "count": 0, "failures": 0, "bytes": 0}
        sums["seconds"] += seconds
        sums["count"] += 1
        sums["failures"] += 0 if ok else 1
        sums["bytes"] += nbytes

    def pending(self) -> bool:
        with self._lock:
            return bool(self._requests or self._open or self._gauges or self._preemptions)

    def take(self) -> dict[str, Any]:
        """This interval's sums as `ServingStats` fields (sentinel/telemetry/serving.py), and a fresh interval."""
        now = self.clock()
        with self._lock:
            oldest = min((r.started for r in self._open.values()), default=None)
            streaming = sum(1 for r in self._open.values() if r.first_token_at is not None)
            out: dict[str, Any] = {
                "source": "sdk", "replica": self.replica, "stage": self.stage, "requests": self._requests,
                "failed": self._failed, "output_tokens": self._output, "prompt_tokens": self._prompt,
                "histograms": self._hist, "sums": {k: round(v, 6) for k, v in self._sums.items()},
                "joint": self._joint, "kv_transfer_bytes": self._kv_bytes,
                "kv_transfer_failures": self._kv_failures, "preemptions": self._preemptions,
                "running": self._gauges.get("running", len(self._open)), **{
                    k: v for k, v in self._gauges.items() if k != "running"},
                "oldest_inflight_seconds": None if oldest is None else round(now - oldest, 4),
                "streaming": streaming, "last_token_at": self._token_at}
            if self._kv_peers:  # only where a peer was said: a server that predates it takes the rest
                out["kv_transfer_peers"] = {peer: {**sums, "seconds": round(sums["seconds"], 6)}
                                            for peer, sums in self._kv_peers.items()}
            self._reset()
        return out
