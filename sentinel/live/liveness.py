"""Periodic liveness work: mark silent nodes down, flush last-seen/last-seq in one batch,
prune old receipts. Each function owns its transaction (it is an edge, like a request)."""

from __future__ import annotations

import logging
from datetime import timedelta

from sqlalchemy import delete, update
from sqlalchemy.orm import Session, sessionmaker

from sentinel.clock import Clock, to_datetime
from sentinel.db import transaction
from sentinel.live.fleet import Fleet
from sentinel.nodes.models import Node
from sentinel.nodes.service import mark_down
from sentinel.telemetry.models import ReportReceipt

log = logging.getLogger("sentinel.liveness")


def check_liveness(factory: sessionmaker[Session], fleet: Fleet, clock: Clock, missed_intervals: int) -> list[str]:
    """Mark nodes down that missed `missed_intervals` of their intervals; returns their names."""
    now = clock.time()
    downed: list[str] = []
    for live in fleet.overdue(now, missed_intervals):
        silent = now - live.last_seen
        reason = f"no report for {silent:.1f}s ({missed_intervals} intervals of {live.interval_seconds:g}s)"
        if live.leaving:  # said goodbye: a stop on purpose, not a fault (the heartbeat detector pages nothing)
            reason = f"its agent stopped on purpose (its last report, seq {live.last_seq}, said so); " + reason
        with transaction(factory) as session:
            node = mark_down(session, live.id, reason=reason, severity="info" if live.leaving else "critical")
        with fleet.lock:
            # A report may have arrived meanwhile; memory wins only if the node is still silent.
            if now - live.last_seen > missed_intervals * live.interval_seconds:
                live.state = "down"
        if node is not None:
            downed.append(live.name)
            log.log(logging.INFO if live.leaving else logging.WARNING, "node down: node=%s last_seq=%d %s",
                    live.name, live.last_seq, reason)
    return downed


def flush_liveness(factory: sessionmaker[Session], fleet: Fleet) -> int:
    """Write last-seen and last-seq of every node that reported since the last flush, in one transaction."""
    dirty = fleet.take_dirty()
    if not dirty:
        return 0
    with transaction(factory) as session:
        session.execute(update(Node), [{"id": node_id, "last_seq": seq, "last_seen_at": to_datetime(seen)}
                                       for node_id, seq, seen in dirty])
    return len(dirty)


def prune_receipts(factory: sessionmaker[Session], clock: Clock, retention_seconds: float) -> int:
    cutoff = to_datetime(clock.time()) - timedelta(seconds=retention_seconds)
    with transaction(factory) as session:
        result = session.execute(delete(ReportReceipt).where(ReportReceipt.received_at < cutoff))
    return int(getattr(result, "rowcount", 0) or 0)
