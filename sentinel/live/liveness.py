"""Periodic liveness work: mark silent nodes down, flush last-seen/last-seq in one batch,
prune old receipts. Each function owns its transaction (it is an edge, like a request)."""

from __future__ import annotations

import logging
from collections.abc import Callable
from concurrent.futures import Future
from datetime import timedelta

from sqlalchemy import delete, update
from sqlalchemy.orm import Session, sessionmaker

from sentinel.clock import Clock, to_datetime
from sentinel.db import transaction
from sentinel.live.fleet import Fleet, NodeLive
from sentinel.nodes.models import Node
from sentinel.nodes.service import mark_down
from sentinel.telemetry.models import ReportReceipt

log = logging.getLogger("sentinel.liveness")
Submit = Callable[[Callable[[Session], None]], Future[None]]


def check_liveness(submit: Submit, fleet: Fleet, clock: Clock, missed_intervals: int) -> list[str]:
    """Mark nodes down that missed `missed_intervals` of their intervals; returns their names.

    In memory first, each node judged on its own silence at that moment (a list of thousands takes time, and
    a node in it may report meanwhile), then in SQL in one write through the ingest writer (`submit`,
    pipeline/writer.py): a report that arrives after the mark finds the node down, and its "reporting
    again" write commits after this one."""
    now = clock.time()
    downed: list[tuple[NodeLive, str]] = []
    for live in fleet.overdue(now, missed_intervals):
        with fleet.lock:
            silent = clock.time() - live.last_seen
            if live.state == "down" or silent <= missed_intervals * live.interval_seconds:
                continue  # it reported since the list was made
            live.state = "down"
        reason = f"no report for {silent:.1f}s ({missed_intervals} intervals of {live.interval_seconds:g}s)"
        if live.leaving:  # said goodbye: a stop on purpose, not a fault (the heartbeat detector pages nothing)
            reason = f"its agent stopped on purpose (its last report, seq {live.last_seq}, said so); " + reason
        downed.append((live, reason))
    if not downed:
        return []
    marked: list[str] = []

    def write(session: Session) -> None:
        marked.clear()  # a batch retried one write at a time runs this again
        for live, reason in downed:
            if mark_down(session, live.id, reason=reason, severity="info" if live.leaving else "critical"):
                marked.append(live.name)

    submit(write).result(timeout=60)
    for live, reason in downed:
        if live.name in marked:
            log.log(logging.INFO if live.leaving else logging.WARNING, "node down: node=%s last_seq=%d %s",
                    live.name, live.last_seq, reason)
    return marked


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
