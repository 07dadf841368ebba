"""What the server knows about each node between database writes.

Liveness is tracked here, not in SQL: a report updates memory only, and `dirty` nodes are flushed
in batches. State changes (down, up, cordon) are written at once by the edge that makes them.
"""

from __future__ import annotations

import threading
from collections import deque
from dataclasses import dataclass, field
from datetime import timedelta

from sqlalchemy import func, select
from sqlalchemy.orm import Session

from sentinel.accelerators.models import Accelerator
from sentinel.nodes.models import Node
from sentinel.telemetry.models import ReportReceipt

# Seqs a node's replays are recognised by without a query. Small on purpose: a node keeps this many ints
# for as long as the server runs (4096 was ~300 KB a node: 3.6 GB for 12,500 nodes after 11 hours);
# an older replay costs one receipt lookup (pipeline/ingest.py).
RECENT_SEQS = 64
RECEIPT_LOOKBACK_SECONDS = 120.0  # ≫ the 5 s liveness flush that writes node.last_seq


@dataclass
class NodeLive:
    id: int
    name: str
    state: str
    admin_state: str
    interval_seconds: float
    last_seq: int
    last_seen: float
    accelerators: set[str] = field(default_factory=set)
    sources: list[str] = field(default_factory=list)
    recent: set[int] = field(default_factory=set)
    recent_order: deque[int] = field(default_factory=deque)
    pending: set[int] = field(default_factory=set)
    dirty: bool = False
    cleared: set[str] = field(default_factory=set)  # released accelerators the agent is to hear of
    leaving: bool = False  # its newest report said its agent was stopping on purpose

    def remember(self, seq: int) -> None:
        """Keep the last few thousand accepted seqs so a replay is recognised without a query."""
        self.recent.add(seq)
        self.recent_order.append(seq)
        while len(self.recent_order) > RECENT_SEQS:
            self.recent.discard(self.recent_order.popleft())
        self.last_seq = max(self.last_seq, seq)


class Fleet:
    """Nodes by name, guarded by one lock shared by ingest, liveness and the API."""

    def __init__(self) -> None:
        self.lock = threading.RLock()
        self._nodes: dict[str, NodeLive] = {}

    def load(self, session: Session, now: float) -> None:
        """Fill from the database. Nodes get a fresh grace period: the server's own downtime is not theirs."""
        accelerators: dict[int, set[str]] = {}
        for node_id, uuid in session.execute(
            select(Accelerator.node_id, Accelerator.uuid).where(Accelerator.present.is_(True))
        ):
            accelerators.setdefault(node_id, set()).add(uuid)
        # Receipts are written with each report, node.last_seq only in batches (every few seconds): trust the
        # receipts of the last minutes before the newest one. A day of them is 10⁸ rows at 12,500 nodes, and a
        # standby taking the lead must not scan them all; the flush lags far less than the lookback.
        newest = session.scalar(select(func.max(ReportReceipt.received_at)))
        query = select(ReportReceipt.node_id, func.max(ReportReceipt.seq)).group_by(ReportReceipt.node_id)
        if newest is not None:
            query = query.where(ReportReceipt.received_at >= newest - timedelta(seconds=RECEIPT_LOOKBACK_SECONDS))
        stored: dict[int, int] = {node_id: seq for node_id, seq in session.execute(query)}
        # Plain columns, not ORM objects: a standby taking the lead reads 12,500 nodes here (3× faster).
        rows = session.execute(select(Node.id, Node.name, Node.state, Node.admin_state, Node.interval_seconds,
                                      Node.last_seq, Node.sources))
        with self.lock:
            self._nodes.clear()
            for node_id, name, state, admin_state, interval, last_seq, sources in rows:
                self._nodes[name] = NodeLive(id=node_id, name=name, state=state, admin_state=admin_state,
                                             interval_seconds=interval, last_seen=now, sources=list(sources),
                                             last_seq=max(last_seq, stored.get(node_id) or 0),
                                             accelerators=accelerators.get(node_id, set()))

    def apply(self, node: Node, accelerators: set[str] | None = None, *, last_seen: float | None = None) -> NodeLive:
        """Mirror a committed row into memory, keeping what only memory knows."""
        with self.lock:
            live = self._nodes.get(node.name)
            if live is None:
                seen = last_seen if last_seen is not None else 0.0
                live = NodeLive(id=node.id, name=node.name, state=node.state, admin_state=node.admin_state,
                                interval_seconds=node.interval_seconds, last_seq=node.last_seq, last_seen=seen)
                self._nodes[node.name] = live
            live.state, live.admin_state = node.state, node.admin_state
            live.interval_seconds = node.interval_seconds
            live.last_seq = max(live.last_seq, node.last_seq)
            live.sources = list(node.sources)
            if last_seen is not None:
                live.last_seen = max(live.last_seen, last_seen)
            if accelerators is not None:
                live.accelerators = set(accelerators)
            return live

    def get(self, name: str) -> NodeLive | None:
        with self.lock:
            return self._nodes.get(name)

    def by_id(self, node_id: int) -> NodeLive | None:
        with self.lock:
            return next((n for n in self._nodes.values() if n.id == node_id), None)

    def all(self) -> list[NodeLive]:
        with self.lock:
            return list(self._nodes.values())

    def mark_cleared(self, uuid: str) -> None:
        """`uuid` was released or recovered: its node's agent hears so with its next ack."""
        with self.lock:
            for live in self._nodes.values():
                if uuid in live.accelerators:
                    live.cleared.add(uuid)

    def take_cleared(self, name: str) -> list[str]:
        with self.lock:
            live = self._nodes.get(name)
            if live is None or not live.cleared:
                return []
            out, live.cleared = sorted(live.cleared), set()
            return out

    def count_by_state(self) -> dict[str, int]:
        counts = {"active": 0, "cordoned": 0, "draining": 0, "down": 0}
        with self.lock:
            for live in self._nodes.values():
                counts[live.state] = counts.get(live.state, 0) + 1
        return counts

    def overdue(self, now: float, missed_intervals: int) -> list[NodeLive]:
        """Nodes that have missed `missed_intervals` of their own reporting intervals."""
        with self.lock:
            return [n for n in self._nodes.values()
                    if n.state != "down" and now - n.last_seen > missed_intervals * n.interval_seconds]

    def take_dirty(self) -> list[tuple[int, int, float]]:
        """(node id, last seq, last seen) of nodes whose liveness changed since the last flush."""
        with self.lock:
            out = [(n.id, n.last_seq, n.last_seen) for n in self._nodes.values() if n.dirty]
            for n in self._nodes.values():
                n.dirty = False
            return out
