"""Stage 1 of the report pipeline (pipeline/report.py): accept a node report. Validate it against what the
node registered, deduplicate on (node, seq), store the receipt and events durably (group commit), then
mark it received in the fleet view and keep its samples. What follows a stored report is the pipeline's.
"""

from __future__ import annotations

import asyncio
import logging
import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, cast

from sqlalchemy import Table, insert, select, update
from sqlalchemy.orm import Session, sessionmaker

from sentinel.clock import Clock, to_datetime
from sentinel.events.models import Event
from sentinel.events.service import EVENT_SEVERITY
from sentinel.jobs.service import ClosedTask, record_task_exit
from sentinel.live.fleet import Fleet, NodeLive
from sentinel.live.samples import SampleStore
from sentinel.nodes.models import Node
from sentinel.pipeline.writer import GroupCommitWriter, Rows
from sentinel.telemetry.models import ReportReceipt
from sentinel.telemetry.schemas import NodeReport

log = logging.getLogger("sentinel.ingest")


# Plain Core tables: the writer inserts a whole batch's rows with one executemany.
RECEIPTS = cast(Table, ReportReceipt.__table__)
EVENTS = cast(Table, Event.__table__)


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
    exits: list[ClosedTask] = field(default_factory=list)  # tasks this report closed (stored; none for a replay)


class Ingest:
    def __init__(self, *, factory: sessionmaker[Session], fleet: Fleet, samples: SampleStore, clock: Clock,
                 writer: GroupCommitWriter):
        self._factory = factory
        self.fleet = fleet
        self.samples = samples
        self.clock = clock
        self.writer = writer
        # (job, rank) → the requests a serving task last said it had in flight (runtime: the ServingView's)
        self.in_flight: Callable[[int, int, float], int] = lambda job_id, rank, now: 0
        self.accepted_total = 0
        self.duplicates_total = 0
        self.rejected_total: dict[str, int] = {}
        self.dropped_total: dict[str, int] = {}  # parts of accepted reports not taken, by reason
        self._count_lock = threading.Lock()

    def drop(self, reason: str, n: int = 1) -> None:
        with self._count_lock:
            self.dropped_total[reason] = self.dropped_total.get(reason, 0) + n

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
                live.leaving = report.leaving
                coming_back = live.state == "down"
        if known is None:
            known = await asyncio.to_thread(self._receipt_exists, live.id, report.seq)
            if not known:
                raise self.reject("out_of_order", 409,
                                  f"seq {report.seq} of node {live.name!r} is below its last seq {live.last_seq} "
                                  "and was never received; sequence numbers must only grow")
        if known:
            return await self._duplicate(live, report.seq)
        exits: list[ClosedTask] = []
        rows, extra = self._write(live, report, now, coming_back, exits)
        try:
            await self.writer.commit(extra, rows)
        except BaseException:
            with self.fleet.lock:
                live.pending.discard(seq)
            raise
        self._applied(live, report, now, coming_back, exits)
        return Outcome(duplicate=False, live=live, exits=exits)

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

    def _write(self, live: NodeLive, report: NodeReport, now: float, coming_back: bool,
               exits: list[ClosedTask]) -> tuple[Rows, Callable[[Session], None] | None]:
        """What the writer stores for this report: plain rows (batched with other reports') and, for a
        node coming back or a task that ended, a callable for the state change (it fills `exits`)."""
        received = to_datetime(now)
        receipt = {"node_id": live.id, "seq": report.seq, "received_at": received,
                   "accelerator_count": len(report.accelerators), "event_count": len(report.events)}
        rows: list[tuple[Table, list[dict[str, Any]]]] = [(RECEIPTS, [receipt])]
        if report.events:
            rows.append((EVENTS, [
                {"kind": e.kind, "severity": EVENT_SEVERITY[e.kind], "node_id": live.id,
                 "accelerator_uuid": e.accelerator_uuid, "job_id": None,
                 "message": e.message or f"{e.kind} reported by agent",
                 "data": {"seq": report.seq, **({"xid": e.xid} if e.xid is not None else {}),
                          **({"value": e.value} if e.value is not None else {}),
                          **({"count": e.count, "last_observed_at": e.last_observed_at} if e.count > 1 else {})},
                 "observed_at": to_datetime(e.observed_at), "recorded_at": received}
                for e in report.events]))
        if not coming_back and not report.task_exits:
            return rows, None
        node_id, name, seq = live.id, live.name, report.seq
        exceptions = {t.pid: t.failure.type for t in report.tasks if t.failure is not None}
        flight = {t.pid: t.serving.running or 0 for t in report.tasks if t.serving is not None}
        for ended in report.task_exits:  # a serving task's last word may have come in an earlier report
            if ended.pid not in flight and ended.job_id is not None and ended.rank is not None:
                flight[ended.pid] = self.in_flight(ended.job_id, ended.rank, now)

        def write(session: Session) -> None:
            exits.clear()  # a batch retried one write at a time runs this again
            for ended in report.task_exits:
                closed = record_task_exit(session, node_id=node_id, job_id=ended.job_id, rank=ended.rank,
                                          pid=ended.pid, exit_code=ended.exit_code, exit_signal=ended.signal,
                                          exception=exceptions.get(ended.pid), in_flight=flight.get(ended.pid, 0),
                                          observed_at=to_datetime(ended.observed_at))
                if closed is not None:
                    exits.append(ClosedTask(closed[0].job_id, closed[0].rank, ended.pid, closed[1], closed[0].attempt))
            if not coming_back:
                return
            admin = session.scalar(select(Node.admin_state).where(Node.id == node_id)) or "active"
            session.execute(update(Node).where(Node.id == node_id)
                            .values(state=admin, state_reason="reporting again", state_changed_at=received))
            session.execute(insert(Event), [{
                "kind": "node_up", "severity": "info", "node_id": node_id, "accelerator_uuid": None,
                "job_id": None, "message": f"node {name} is reporting again (seq {seq})",
                "data": {"seq": seq}, "observed_at": received, "recorded_at": received}])

        return rows, write

    def _applied(self, live: NodeLive, report: NodeReport, now: float, coming_back: bool,
                 exits: list[ClosedTask]) -> None:
        with self.fleet.lock:
            live.pending.discard(report.seq)
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
        for closed in exits:
            log.warning("task ended: node=%s job=%d rank=%d pid=%d %s", live.name, closed.job_id, closed.rank,
                        closed.pid, closed.failure_reason or "succeeded")
