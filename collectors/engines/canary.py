"""The active canary: a real completion of a few tokens sent to a serving replica and read to its end.

Metrics cannot see the faults a user sees first: a failed decode that answers HTTP 200 with an empty body
(vllm-ascend PR #13165), a worker frozen mid-stream that passes health checks reading only the first chunk
(Dynamo PR #13675). So the agent asks each engine target, at a bounded rate, for `max_tokens` tokens on its
OpenAI-compatible `/v1/completions` (vLLM, SGLang and Dynamo's frontend all serve it), streamed, and checks
the answer: a 200, at least one token of text, a `finish_reason` and the closing `[DONE]`, with no gap longer
than `stall_seconds` between chunks. The result rides in the target's next `ServingStats.canary`; the
bad_completion detector reads it.

Bounded: one probe in flight per target, one every `every_seconds`; after a failure one confirming probe
goes at once, so a fault is seen twice within seconds and a lone blip is told apart. A probe runs on its own
thread: a hung replica never delays the agent's report.
"""

from __future__ import annotations

import http.client
import json
import logging
import threading
import time
import urllib.parse
from collections.abc import Callable

from sentinel.telemetry.serving import CanaryResult

log = logging.getLogger("sentinel.agent.engines")

PROMPT = "Sentinel canary. Count on: one, two, three,"
MAX_LINE_BYTES = 1 << 20  # one SSE event; a completion chunk is hundreds of bytes


class Canary:
    def __init__(self, url: str, *, every_seconds: float = 15.0, max_tokens: int = 8,
                 first_token_seconds: float = 10.0, stall_seconds: float = 3.0, model: str | None = None,
                 prompt: str | list[int] = PROMPT, clock: Callable[[], float] = time.time) -> None:
        parts = urllib.parse.urlsplit(url)
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise ValueError(f"canary: {url!r} is not an http(s) URL")
        self.scheme, self.host, self.port = parts.scheme, parts.hostname, parts.port
        self.base = f"{parts.scheme}://{parts.netloc}"
        self.every_seconds, self.max_tokens = every_seconds, max_tokens
        self.first_token_seconds, self.stall_seconds = first_token_seconds, stall_seconds
        self.model = model
        self.prompt = prompt  # token ids for an engine started without its tokenizer
        self.clock = clock
        self._lock = threading.Lock()
        self._running = False
        self._started_at: float | None = None
        self._confirm = False  # a first failure: the next probe goes at once
        self._last_ok = True
        self._result: CanaryResult | None = None
        # until the engine first answers at all (any HTTP status), a refused connection is a replica still
        # starting (vLLM loads for a minute before it listens), not a failure: not reported
        self._answered = False

    # -- the agent's side ---------------------------------------------------------------------------
    def tick(self) -> CanaryResult | None:
        """Start a probe if one is due; the result finished since the last tick, if any."""
        now = self.clock()
        with self._lock:
            due = not self._running and (self._started_at is None or self._confirm
                                         or now - self._started_at >= self.every_seconds)
            if due:
                self._running, self._started_at, self._confirm = True, now, False
            result, self._result = self._result, None
        if due:
            threading.Thread(target=self._run, name="sentinel-canary", daemon=True).start()
        return result

    def _run(self) -> None:
        try:
            result = self.probe()
        except Exception as exc:  # a probe must never take the agent down
            result = CanaryResult(at=self.clock(), ok=False, reason="error", detail=f"canary crashed: {exc}"[:300])
        with self._lock:
            self._running = False
            if not self._answered and result.status is None and not result.ok:
                log.info("canary: %s does not listen yet (starting): %s", self.base, result.detail)
                return
            self._answered, self._result = True, result
            self._confirm, self._last_ok = not result.ok and self._last_ok, result.ok
        if not result.ok:
            log.warning("canary failed: url=%s reason=%s status=%s tokens=%d detail=%s", self.base, result.reason,
                        result.status, result.tokens, result.detail)

    # -- one probe ----------------------------------------------------------------------------------
    def probe(self) -> CanaryResult:
        """One completion, synchronously: what came back, judged."""
        start = time.monotonic()

        def done(ok: bool, reason: str | None = None, **fields: object) -> CanaryResult:
            return CanaryResult(at=self.clock(), ok=ok, reason=reason,  # type: ignore[arg-type]
                                seconds=round(time.monotonic() - start, 4), **fields)  # type: ignore[arg-type]

        conn = self._connection(self.first_token_seconds)
        try:
            model = self.model or self._model(conn)
            if model is None:
                return done(False, "error", detail="GET /v1/models named no model")
            body = json.dumps({"model": model, "prompt": self.prompt, "max_tokens": self.max_tokens, "temperature": 0,
                               "stream": True, "stream_options": {"include_usage": True}})
            conn.request("POST", "/v1/completions", body=body, headers={"Content-Type": "application/json"})
            response = conn.getresponse()
            if response.status != 200:
                text = response.read(300).decode(errors="replace").strip()
                return done(False, "error", status=response.status, detail=f"HTTP {response.status}: {text}")
            return self._read(response, conn, start, done)
        except (OSError, http.client.HTTPException, ValueError) as exc:
            reason = "timeout" if isinstance(exc, TimeoutError) else "error"
            return done(False, reason, detail=f"{type(exc).__name__}: {exc}"[:300])
        finally:
            conn.close()

    def _read(self, response: http.client.HTTPResponse, conn: http.client.HTTPConnection, start: float,
              done: Callable[..., CanaryResult]) -> CanaryResult:
        texts = chunks = 0
        usage: int | None = None
        finish: str | None = None
        first: float | None = None
        while True:
            try:
                raw = response.readline(MAX_LINE_BYTES)
            except http.client.IncompleteRead:  # a chunked body cut before its last chunk
                raw = b""
            except TimeoutError:
                what = "no first token" if first is None else f"stream stopped after {texts} token(s)"
                limit = self.first_token_seconds if first is None else self.stall_seconds
                return done(False, "timeout", status=200, tokens=texts, ttft_seconds=first,
                            detail=f"{what}: nothing for {limit:g} s")
            if not raw:  # the body ended without [DONE]
                if texts == 0:
                    return done(False, "empty", status=200, tokens=0, detail=f"200 and no token ({chunks} chunk(s))")
                return done(False, "truncated", status=200, tokens=texts, ttft_seconds=first,
                            detail=f"the stream ended after {texts} token(s) without [DONE]")
            line = raw.strip()
            if not line.startswith(b"data:"):
                continue
            data = line[5:].strip()
            if data == b"[DONE]":
                break
            chunks += 1
            event = json.loads(data)
            for choice in event.get("choices") or []:
                if choice.get("text"):
                    texts += 1
                    if first is None:
                        first = round(time.monotonic() - start, 4)
                        if conn.sock is not None:  # from now on a gap between chunks is a stall
                            conn.sock.settimeout(self.stall_seconds)
                finish = choice.get("finish_reason") or finish
            if isinstance(event.get("usage"), dict):
                usage = int(event["usage"].get("completion_tokens") or 0)
        tokens = usage if usage is not None else texts
        if texts == 0:
            return done(False, "empty", status=200, tokens=tokens, detail=f"200 and no text ({chunks} chunk(s), "
                                                                            f"{tokens} token(s) counted)")
        if finish is None:
            return done(False, "truncated", status=200, tokens=tokens, ttft_seconds=first,
                        detail=f"{texts} token(s) and no finish_reason")
        return done(True, status=200, tokens=tokens, ttft_seconds=first, detail=f"finish_reason {finish}")

    def _connection(self, timeout: float) -> http.client.HTTPConnection:
        kind = http.client.HTTPSConnection if self.scheme == "https" else http.client.HTTPConnection
        return kind(self.host, self.port, timeout=timeout)

    def _model(self, conn: http.client.HTTPConnection) -> str | None:
        """The first model the replica serves, remembered once known."""
        conn.request("GET", "/v1/models")
        response = conn.getresponse()
        body = response.read(1 << 20)
        if response.status != 200:
            raise ValueError(f"GET /v1/models answered {response.status}")
        models = json.loads(body).get("data") or []
        self.model = str(models[0]["id"]) if models and isinstance(models[0], dict) and "id" in models[0] else None
        return self.model
