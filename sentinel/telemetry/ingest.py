"""Accepting node reports: validate against what the node registered, deduplicate on (node, seq),
store the receipt and events durably (group commit), then update the in-memory view.
"""

from __future__ import annotations

import asyncio
import logging
import threading
from collections.abc import Callable
from dataclasses import dataclass

from sqlalchemy import insert, select, update
from sqlalchemy.orm import Session, sessionmaker

from sentinel.clock import Clock, to_datetime
from sentinel.events.models import Event
from sentinel.nodes.live import Fleet, NodeLive
from sentinel.nodes.models import Node
from sentinel.telemetry.models import ReportReceipt
from sentinel.telemetry.samples import SampleStore
from sentinel.telemetry.schemas import NodeReport
from sentinel.telemetry.writer import GroupCommitWriter

log = logging.getLogger("sentinel.ingest")

EVENT_SEVERITY = {"xid": "critical", "ecc": "critical", "offline": "critical", "remap": "critical",
                  "hang": "warning", "slow": "warning", "thermal": "warning", "power": "warning",
                  "clear": "info", "other": "info"}


class IngestError(Exception):
    """A report that cannot be accepted; `status` is the HTTP status the edge answers with."""

    def __init__(self, status: int, message: str):
        super().__init__(message)
        self.status = status
        self.message = message


@dataclass(frozen=True)
class Outcome:
    duplicate: bool
    live: NodeLive


Listener = Callable[[NodeLive, NodeReport], None]


class Ingest:
    def __init__(self, *, factory: sessionmaker[Session], fleet: Fleet, samples: SampleStore, clock: Clock,
                 writer: GroupCommitWriter):
        self._factory = factory
        self.fleet = fleet
        self.samples = samples
        self.clock = clock
        self.writer = writer
        self.listeners: list[Listener] = []
        self.accepted_total = 0
        self.duplicates_total = 0
        self.rejected_total: dict[str, int] = {}
        self._count_lock = threading.Lock()

    def reject(self, reason: str, status: int, message: str) -> IngestError:
        with self._count_lock:
            self.rejected_total[reason] = self.rejected_total.get(reason, 0) + 1
        return IngestError(status, message)

    async def accept(self, report: NodeReport, path_node: str) -> Outcome:
        if report.node != path_node:
            raise self.reject("node_mismatch", 422,
                              f"report names node {report.node!r} but was posted to node {path_node!r}")
        live = self.fleet.get(report.node)
        if live is None:
            raise self.reject("unknown_node", 404,
                              f"node {report.node!r} is not registered; POST /api/v1/nodes/register first")
        self._check_accelerators(live, report)
        now = self.clock.time()
        coming_back = False
        with self.fleet.lock:
            seq = report.seq
            if seq in live.pending or seq in live.recent:
                known = True
            elif seq <= live.last_seq:
                known = None  # older than memory holds: ask the database
            else:
                known = False
                live.pending.add(seq)
                live.last_seen = max(live.last_seen, now)
                live.dirty = True
                coming_back = live.state == "down"
        if known is None:
            known = await asyncio.to_thread(self._receipt_exists, live.id, report.seq)
            if not known:
                raise self.reject("out_of_order", 409,
                                  f"seq {report.seq} of node {live.name!r} is below its last seq {live.last_seq} "
                                  "and was never received; sequence numbers must only grow")
        if known:
            return await self._duplicate(live, report.seq)
        try:
            await asyncio.wrap_future(self.writer.submit(self._write(live, report, now, coming_back)))
        finally:
            with self.fleet.lock:
                live.pending.discard(report.seq)
        self._applied(live, report, now, coming_back)
        return Outcome(duplicate=False, live=live)

    async def _duplicate(self, live: NodeLive, seq: int) -> Outcome:
        # A replay of a report still being written waits for it, so its ack means "kept".
        for _ in range(200):
            with self.fleet.lock:
                if seq not in live.pending:
                    break
            await asyncio.sleep(0.05)
        with self._count_lock:
            self.duplicates_total += 1
        return Outcome(duplicate=True, live=live)

    def _check_accelerators(self, live: NodeLive, report: NodeReport) -> None:
        known = live.accelerators
        for sample in report.accelerators:
            if sample.uuid not in known:
                raise self.reject("unknown_accelerator", 422,
                                  f"accelerator {sample.uuid!r} is not registered on node {live.name!r}; "
                                  "re-register the node with it")
        for event in report.events:
            if event.accelerator_uuid is not None and event.accelerator_uuid not in known:
                raise self.reject("unknown_accelerator", 422,
                                  f"event names accelerator {event.accelerator_uuid!r}, "
                                  f"which is not registered on node {live.name!r}")

    def _receipt_exists(self, node_id: int, seq: int) -> bool:
        with self._factory() as session:
            found = session.scalar(select(ReportReceipt.seq).where(ReportReceipt.node_id == node_id,
                                                                   ReportReceipt.seq == seq))
            return found is not None

    def _write(self, live: NodeLive, report: NodeReport, now: float, coming_back: bool) -> Callable[[Session], None]:
        received = to_datetime(now)
        receipt = {"node_id": live.id, "seq": report.seq, "received_at": received,
                   "accelerator_count": len(report.accelerators), "event_count": len(report.events)}
        events = [{"kind": e.kind, "severity": EVENT_SEVERITY[e.kind], "node_id": live.id,
                   "accelerator_uuid": e.accelerator_uuid, "job_id": None,
                   "message": e.message or f"{e.kind} reported by agent",
                   "data": {"xid": e.xid, "seq": report.seq} if e.xid is not None else {"seq": report.seq},
                   "observed_at": to_datetime(e.observed_at), "recorded_at": received}
                  for e in report.events]
        node_id, name = live.id, live.name

        def write(session: Session) -> None:
            session.execute(insert(ReportReceipt), [receipt])
            if events:
                session.execute(insert(Event), events)
            if coming_back:
                admin = session.scalar(select(Node.admin_state).where(Node.id == node_id)) or "active"
                session.execute(update(Node).where(Node.id == node_id)
                                .values(state=admin, state_reason="reporting again", state_changed_at=received))
                session.execute(insert(Event), [{
                    "kind": "node_up", "severity": "info", "node_id": node_id, "accelerator_uuid": None,
                    "job_id": None, "message": f"node {name} is reporting again (seq {report.seq})",
                    "data": {"seq": report.seq}, "observed_at": received, "recorded_at": received}])

        return write

    def _applied(self, live: NodeLive, report: NodeReport, now: float, coming_back: bool) -> None:
        with self.fleet.lock:
            live.remember(report.seq)
            live.interval_seconds = report.interval_seconds
            if coming_back and live.state == "down":
                live.state = live.admin_state
                log.info("node up: node=%s seq=%d state=%s", live.name, report.seq, live.state)
        with self._count_lock:
            self.accepted_total += 1
        self.samples.add(now, report.accelerators)
        for event in report.events:
            log.warning("hardware event: node=%s accelerator=%s kind=%s xid=%s seq=%d %s", live.name,
                        event.accelerator_uuid, event.kind, event.xid, report.seq, event.message)
        for listener in self.listeners:
            try:
                listener(live, report)
            except Exception:
                log.exception("ingest listener failed: node=%s seq=%d", live.name, report.seq)
