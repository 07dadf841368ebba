"""A serving engine's fault-tolerance status, read on the node: `GET /fault_tolerance/status`.

vLLM started with `--enable-fault-tolerance` (data-parallel, external load balancer: one API server per DP
rank) no longer exits when an engine core fails: the core aborts its requests, says `unhealthy` (or `dead`)
and waits, `engine_recovery_timeout_sec` (120 s by default), for an outside orchestrator to `POST
/fault_tolerance/apply {"instruction": "retry"}`; SGLang's framework (PR #40078) says `paused` and takes
`retry` or `scale_down`. The answer, in vLLM 0.32 (vllm/v1/engine/core_client.py `get_status`):

    {"schema_version": 1, "total_engines": 1,
     "engines": [{"id": 0, "status": "unhealthy", "fault_info": "RuntimeError", "ft_error": "..."}]}

Read once per report interval, with a 1 s timeout, and validated into a small `FaultToleranceStatus`: an
engine that does not expose the API answers 404 (asked again after `absent_seconds`, said once); a bad,
oversized or non-JSON answer is skipped with one log line per new failure. Never raises. The server's
engine_fault detector reads it (sentinel/detection/detectors/engine_fault.py).
"""

from __future__ import annotations

import json
import logging
import time
import urllib.parse
from collections.abc import Callable
from typing import Any

from pydantic import ValidationError

from collectors.engines.scrape import fetch
from sentinel.telemetry.serving import ENGINE_STATES, EngineRankState, FaultToleranceStatus

log = logging.getLogger("sentinel.agent.engines")

# vLLM 0.32 serves the router without a prefix; the later scale-down work (vLLM PR #46370) names it under /v1
PATHS = ("/fault_tolerance/status", "/v1/fault_tolerance/status")
MAX_BODY_BYTES = 64 * 1024  # one entry per DP rank: a few hundred bytes each
MAX_ENGINES = 64
ABSENT_SECONDS = 600.0
STATES = {"paused": "paused", "unhealthy": "unhealthy", "dead": "dead", "healthy": "healthy"}


def parse_status(body: str, at: float) -> FaultToleranceStatus:
    """The engine's answer as Sentinel's summary; ValueError (or ValidationError) for one that is not."""
    doc = json.loads(body)
    if not isinstance(doc, dict) or not isinstance(doc.get("engines"), list):
        raise ValueError("expected a JSON object with an 'engines' list")
    version = doc.get("schema_version", 1)
    if version != 1:
        raise ValueError(f"schema_version {version!r}, this agent reads 1")
    engines = doc["engines"]
    if len(engines) > MAX_ENGINES:
        raise ValueError(f"{len(engines)} engines, over {MAX_ENGINES}")
    return FaultToleranceStatus(at=at, engines=[_engine(e, i) for i, e in enumerate(engines)])


def _engine(entry: Any, index: int) -> EngineRankState:
    if not isinstance(entry, dict):
        raise ValueError(f"engines[{index}] is not an object")
    rank = entry.get("id", entry.get("rank", index))
    if not isinstance(rank, int) or isinstance(rank, bool):
        raise ValueError(f"engines[{index}].id {rank!r} is not a whole number")
    state = str(entry.get("status", "")).lower()
    return EngineRankState(rank=rank, state=STATES.get(state, "unknown"),  # type: ignore[arg-type]
                           fault=str(entry.get("fault_info") or "")[:200], error=str(entry.get("ft_error") or "")[:300])


class FaultToleranceReader:
    """Reads one replica's status; `read()` per interval gives the summary, or None (not exposed, no answer)."""

    def __init__(self, url: str, *, timeout_seconds: float = 1.0, absent_seconds: float = ABSENT_SECONDS,
                 clock: Callable[[], float] = time.time) -> None:
        parts = urllib.parse.urlsplit(url)
        if parts.scheme not in ("http", "https") or not parts.netloc:
            raise ValueError(f"fault tolerance: {url!r} is not an http(s) URL")
        self.base = f"{parts.scheme}://{parts.netloc}"
        self.timeout_seconds, self.absent_seconds, self.clock = timeout_seconds, absent_seconds, clock
        self.path: str | None = None  # the path that answered, once one did
        self.absent_until = 0.0
        self.last_error: str | None = None

    def read(self) -> FaultToleranceStatus | None:
        now = self.clock()
        if now < self.absent_until:
            return None
        for path in (self.path,) if self.path else PATHS:
            body, error = fetch(self.base + path, self.timeout_seconds, max_bytes=MAX_BODY_BYTES,
                                accept="application/json")
            if error == "HTTP 404":
                continue
            if error is not None:
                self._fail(f"{self.base}{path}: {error}")
                return None
            try:
                status = parse_status(body or "", now)
            except (ValueError, ValidationError, RecursionError) as exc:
                self._fail(f"{self.base}{path}: bad answer: {str(exc).splitlines()[0][:200]}")
                return None
            if self.path is None:
                log.info("engine fault-tolerance status: %s%s answers (%d engine core(s))", self.base, path,
                         len(status.engines))
            self.path, self.last_error = path, None
            return status
        if self.last_error != "absent":
            log.info("engine fault-tolerance status: %s does not expose it (404); asking again in %.0f s", self.base,
                     self.absent_seconds)
        self.path, self.last_error, self.absent_until = None, "absent", now + self.absent_seconds
        return None

    def _fail(self, error: str) -> None:
        if error != self.last_error:  # once per new failure, not once per interval
            log.warning("engine fault-tolerance status skipped: %s", error)
        self.last_error = error


__all__ = ["ENGINE_STATES", "FaultToleranceReader", "parse_status"]
