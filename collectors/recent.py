"""Which faults are recent on each accelerator, for gauges that return to 0 (dcgm-exporter #500/#502).

The XID and ECC counters only ever rise, as counters should. What an SRE also needs is "is this
accelerator in trouble now": `sentinel_accelerator_fault_recent{kind,xid}` is 1 while a fault of that
kind was seen within `window_seconds` and has not cleared since, and 0 once it clears — after a quiet
window, on a `clear` event from the source, or when the server says the accelerator was released or
recovered (the report ack's `cleared`). `offline` does not age: it holds until the source sees the
accelerator again (a `clear`) or the server releases it. The accelerator's health gauge follows.
"""

from __future__ import annotations

import threading

from sentinel.telemetry.schemas import HardwareEvent

NOT_FAULTS = frozenset({"probe", "clear"})
Label = tuple[str, str]  # (kind, xid or "")
CLEARED = float("-inf")


class RecentFaults:
    def __init__(self, window_seconds: float = 300.0):
        self.window_seconds = window_seconds
        self._seen: dict[str, dict[Label, float]] = {}  # uuid → fault → when last seen (CLEARED: cleared since)
        self._lock = threading.Lock()

    def seen(self, event: HardwareEvent) -> None:
        uuid = event.accelerator_uuid
        if uuid is None or event.kind == "probe":
            return
        if event.kind == "clear":
            self.clear(uuid)
            return
        label = (event.kind, "" if event.xid is None else str(event.xid))
        at = event.last_observed_at or event.observed_at
        with self._lock:
            faults = self._seen.setdefault(uuid, {})
            faults[label] = max(faults.get(label, CLEARED), at)

    def clear(self, uuid: str) -> None:
        """Released, recovered or seen healthy again: every fault of `uuid` is no longer recent."""
        with self._lock:
            for label in self._seen.get(uuid, {}):
                self._seen[uuid][label] = CLEARED

    def snapshot(self, now: float) -> dict[str, dict[Label, bool]]:
        """uuid → each fault ever seen there → whether it is recent now (False: the gauge reads 0)."""
        with self._lock:
            return {uuid: {label: at != CLEARED and (label[0] == "offline" or now - at <= self.window_seconds)
                           for label, at in faults.items()}
                    for uuid, faults in self._seen.items()}

    def health(self, uuid: str, now: float) -> str:
        return health_of(self.snapshot(now).get(uuid, {}))


def health_of(faults: dict[Label, bool]) -> str:
    """An accelerator's health from its faults' recency (one entry of `RecentFaults.snapshot`)."""
    recent = [kind for (kind, _), on in faults.items() if on]
    if "offline" in recent:
        return "offline"
    return "degraded" if recent else "healthy"
