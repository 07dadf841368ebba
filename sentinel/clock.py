"""The clock is injected everywhere time matters, so tests can move it by hand."""

from __future__ import annotations

import time
from datetime import UTC, datetime
from typing import Protocol


class Clock(Protocol):
    def time(self) -> float:
        """Seconds since the epoch."""
        ...


class SystemClock:
    def time(self) -> float:
        return time.time()


def to_datetime(seconds: float) -> datetime:
    return datetime.fromtimestamp(seconds, UTC)
