"""Identical hardware events folded into one with a count, so a storm is one line, not a flood.

A driver in trouble can log the same XID thousands of times a second (NVSentinel #1120: ~800,000
duplicate XID 95 lines, 29 distinct). The first event of a kind on an accelerator is pushed at once, as
always: detection latency does not change. Repeats of it (same accelerator, kind and XID) within
`window_seconds` of the last one are counted instead, and go to the server once per report interval as
a single event with `count` and `last_observed_at`. A quiet `window_seconds` ends the fold: the next
occurrence is pushed at once again. Probe results and `clear` are never folded.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass

from sentinel.telemetry.schemas import HardwareEvent

NEVER_FOLDED = frozenset({"probe", "clear"})
Key = tuple[str | None, str, int | None, str | None]  # accelerator, kind, xid, nic


@dataclass
class _Fold:
    last_at: float  # the latest occurrence, pushed or folded
    pending: HardwareEvent | None = None  # repeats not yet sent: the first of them, with the count so far


class EventFolder:
    def __init__(self, window_seconds: float = 60.0):
        self.window_seconds = window_seconds
        self.folded_total = 0  # events counted into another instead of sent on their own
        self._folds: dict[Key, _Fold] = {}
        self._lock = threading.Lock()

    def offer(self, event: HardwareEvent) -> HardwareEvent | None:
        """The event to push now, or None when it repeats one pushed within the window (it is counted)."""
        if event.kind in NEVER_FOLDED:
            if event.kind == "clear":  # a cleared accelerator starts afresh
                with self._lock:
                    for key in [k for k in self._folds if k[0] == event.accelerator_uuid]:
                        del self._folds[key]
            return event
        key = (event.accelerator_uuid, event.kind, event.xid, event.nic)
        at = event.observed_at
        with self._lock:
            fold = self._folds.get(key)
            if fold is None or at - fold.last_at > self.window_seconds:
                self._folds[key] = _Fold(last_at=at)
                return event
            fold.last_at = max(fold.last_at, at)
            self.folded_total += 1
            if fold.pending is None:
                fold.pending = event.model_copy(update={"count": event.count, "last_observed_at": at})
            else:
                fold.pending = fold.pending.model_copy(update={
                    "count": fold.pending.count + event.count,
                    "last_observed_at": max(fold.pending.last_observed_at or at, at)})
            return None

    def flush(self, now: float) -> list[HardwareEvent]:
        """The repeats counted since the last flush, one event per kind; folds quiet for a window end."""
        out: list[HardwareEvent] = []
        with self._lock:
            for key, fold in list(self._folds.items()):
                if fold.pending is not None:
                    out.append(fold.pending)
                    fold.pending = None
                elif now - fold.last_at > self.window_seconds:
                    del self._folds[key]
        return out

    def pending(self) -> int:
        with self._lock:
            return sum(f.pending.count for f in self._folds.values() if f.pending is not None)
