"""The checkpoint catalog on the central server, as the SDK sees it (standard library HTTP only).

Under `sentinel launch` the server and a token come from SENTINEL_SERVER and SENTINEL_TOKEN. SENTINEL_SERVER
may list several servers (comma-separated: a leader and its standbys). Calls are retried with backoff on
connection errors and 5xx, moving to the next server each time (a standby answers writes with 503); a 4xx
is the server saying no and is raised at once.
"""

from __future__ import annotations

import json
import logging
import os
import time
import urllib.error
import urllib.request
from typing import Any

log = logging.getLogger("sentinel.sdk.checkpoint")


class CatalogError(RuntimeError):
    def __init__(self, status: int, detail: str):
        super().__init__(f"checkpoint catalog answered {status}: {detail}")
        self.status = status


class Catalog:
    def __init__(self, server: str, token: str | None, job_id: int, *, timeout_seconds: float = 10.0,
                 attempts: int = 6):
        self.servers = [s.strip().rstrip("/") for s in server.split(",") if s.strip()]
        self._current = 0
        self.token = token
        self.job_id = job_id
        self.timeout_seconds = timeout_seconds
        self.attempts = attempts

    @classmethod
    def from_env(cls, job_id: int | None) -> Catalog | None:
        server = os.environ.get("SENTINEL_SERVER")
        if not server or job_id is None:
            return None
        return cls(server, os.environ.get("SENTINEL_TOKEN"), job_id)

    def _call(self, method: str, path: str, body: Any = None) -> Any:
        data = json.dumps(body, allow_nan=False).encode() if body is not None else None
        headers = {"content-type": "application/json"}
        if self.token:
            headers["authorization"] = f"Bearer {self.token}"
        delay = 0.2
        for attempt in range(1, self.attempts + 1):
            url = f"{self.servers[self._current]}/api/v1/jobs/{self.job_id}{path}"
            request = urllib.request.Request(url, data=data, method=method, headers=headers)
            try:
                with urllib.request.urlopen(request, timeout=self.timeout_seconds) as response:
                    raw = response.read()
                    return json.loads(raw) if raw else None
            except urllib.error.HTTPError as exc:
                detail = exc.read().decode(errors="replace")[:500]
                if (exc.code < 500 and exc.code != 429) or attempt == self.attempts:
                    raise CatalogError(exc.code, detail) from exc
                error: Exception = exc
                if exc.code == 429:  # the token's rate limit: wait as long as the server says
                    delay = max(delay, float(exc.headers.get("retry-after") or 0))
            except OSError as exc:
                if attempt == self.attempts:
                    raise
                error = exc
            log.warning("checkpoint catalog call failed, retrying: %s %s attempt=%d error=%s", method, path,
                        attempt, error)
            self._current = (self._current + 1) % len(self.servers)
            time.sleep(delay)
            delay *= 2
        raise AssertionError("unreachable")

    def register_shard(self, step: int, rank: int, shard: dict[str, Any]) -> dict[str, Any]:
        return dict(self._call("PUT", f"/checkpoints/{step}/shards/{rank}", shard))

    def recovery_plan(self) -> dict[str, Any]:
        return dict(self._call("GET", "/recovery-plan"))

    def report_invalid(self, step: int, rank: int, reason: str) -> None:
        self._call("POST", f"/checkpoints/{step}/shards/{rank}/invalid", {"reason": reason[:1000]})
