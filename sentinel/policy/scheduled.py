"""The periodic job that writes the policy decisions made on read paths (a job's detail, a metrics scrape):
those sessions never commit, so the decisions wait here and the leader writes them in its own transaction."""

from __future__ import annotations

import threading
from collections import deque
from datetime import datetime, timedelta

from sqlalchemy import delete
from sqlalchemy.orm import Session, sessionmaker

from sentinel.db import transaction
from sentinel.policy.models import PolicyDecision
from sentinel.policy.service import Decision, record_decision

FLUSH_SECONDS = 10.0
PRUNE_SECONDS = 3600.0


class PendingDecisions:
    """Decisions not yet written, oldest first; past `limit` the oldest are dropped (a standby never flushes)."""

    def __init__(self, limit: int = 10_000):
        self._rows: deque[Decision] = deque(maxlen=limit)
        self._lock = threading.Lock()

    def add(self, decision: Decision) -> None:
        with self._lock:
            self._rows.append(decision)

    def take(self) -> list[Decision]:
        with self._lock:
            rows = list(self._rows)
            self._rows.clear()
            return rows

    def put_back(self, rows: list[Decision]) -> None:
        with self._lock:
            self._rows.extendleft(reversed(rows))

    def __len__(self) -> int:
        with self._lock:
            return len(self._rows)


def flush_decisions(factory: sessionmaker[Session], pending: PendingDecisions) -> int:
    """Write what is pending, in one transaction; on failure it stays pending for the next run (and raises,
    for the scheduler to log and count)."""
    rows = pending.take()
    if not rows:
        return 0
    try:
        with transaction(factory) as session:
            for row in rows:
                record_decision(session, row)
    except Exception:
        pending.put_back(rows)
        raise
    return len(rows)


def prune_decisions(factory: sessionmaker[Session], now: datetime, retention_days: float) -> int:
    """Delete the decisions recorded more than `retention_days` before `now`; how many went."""
    with transaction(factory) as session:
        result = session.execute(delete(PolicyDecision).where(
            PolicyDecision.at < now - timedelta(days=retention_days)))
    return int(getattr(result, "rowcount", 0) or 0)
