"""Recent hardware faults per accelerator and per node, in memory: the lemon detector counts them and
every hardware incident compares with them ("this accelerator's third fault this week")."""

from __future__ import annotations

import threading
from collections import deque
from dataclasses import dataclass
from datetime import timedelta

from sqlalchemy import select
from sqlalchemy.orm import Session

from sentinel.clock import to_datetime
from sentinel.events.models import Event
from sentinel.nodes.models import Node

FAULT_KINDS = ("xid", "ecc", "offline", "remap", "thermal", "power")


@dataclass(frozen=True)
class Fault:
    at: float
    node: str
    accelerator: str | None
    kind: str
    xid: int | None
    severity: str
    job: int | None = None  # the job running on the accelerator then (kept in memory only)


class FaultHistory:
    def __init__(self, window_seconds: float = 7 * 86400.0, max_faults: int = 200_000):
        self.window_seconds = window_seconds
        self._faults: deque[Fault] = deque(maxlen=max_faults)
        self._lock = threading.Lock()

    def load(self, session: Session, now: float) -> None:
        since = to_datetime(now) - timedelta(seconds=self.window_seconds)
        rows = session.execute(
            select(Event.observed_at, Node.name, Event.accelerator_uuid, Event.kind, Event.data, Event.severity)
            .join(Node, Node.id == Event.node_id)
            .where(Event.kind.in_(FAULT_KINDS), Event.observed_at >= since)
            .order_by(Event.observed_at))
        with self._lock:
            self._faults.clear()
            for at, node, uuid, kind, data, severity in rows:
                xid = data.get("xid") if isinstance(data, dict) else None
                self._faults.append(Fault(at.timestamp(), node, uuid, kind, xid, severity))

    def add(self, fault: Fault) -> None:
        with self._lock:
            self._faults.append(fault)

    def recent(self, now: float, *, window_seconds: float | None = None, node: str | None = None,
               accelerator: str | None = None) -> list[Fault]:
        """Faults newer than the window (default: the whole history window), oldest first."""
        cutoff = now - (window_seconds if window_seconds is not None else self.window_seconds)
        with self._lock:
            while self._faults and self._faults[0].at < now - self.window_seconds:
                self._faults.popleft()
            return [f for f in self._faults if f.at >= cutoff
                    and (node is None or f.node == node)
                    and (accelerator is None or f.accelerator == accelerator)]
