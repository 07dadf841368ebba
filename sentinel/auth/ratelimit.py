"""Per-token request rate limits: a token bucket per token id, on the injected clock.

A bucket holds up to `burst` requests and refills at `rate` per second; a request takes one. Time comes
from the caller (`now`, seconds), so tests move it by hand.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass


@dataclass
class _Bucket:
    level: float
    at: float


class RateLimited(Exception):
    def __init__(self, retry_after_seconds: float):
        super().__init__(f"retry after {retry_after_seconds:.3f}s")
        self.retry_after_seconds = retry_after_seconds


class RateLimiter:
    def __init__(self) -> None:
        self._buckets: dict[int, _Bucket] = {}
        self._lock = threading.Lock()
        self.rejected_by_role: dict[str, int] = {}

    def take(self, token_id: int, *, role: str, now: float, rate: float, burst: float) -> None:
        """Take one request from the token's bucket, or raise RateLimited. `rate` 0 means unlimited."""
        if rate <= 0:
            return
        burst = max(burst, rate, 1.0)
        with self._lock:
            bucket = self._buckets.get(token_id)
            if bucket is None:
                bucket = self._buckets[token_id] = _Bucket(level=burst, at=now)
            bucket.level = min(burst, bucket.level + max(0.0, now - bucket.at) * rate)
            bucket.at = max(bucket.at, now)
            if bucket.level >= 1.0:
                bucket.level -= 1.0
                return
            self.rejected_by_role[role] = self.rejected_by_role.get(role, 0) + 1
            raise RateLimited((1.0 - bucket.level) / rate)

    def snapshot(self) -> dict[str, int]:
        with self._lock:
            return dict(self.rejected_by_role)
