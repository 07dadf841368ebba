"""Hardware events a leader stored but died before turning into incidents.

A report is acknowledged once its rows, events included, are committed; the incident for an event is
written a moment later by the detection queue. A leader that dies in between (kill -9, lost lock, power)
leaves a stored event with no incident, and the agent will not send it again: it was acknowledged. So a
server that takes the lead reads back the agent events of the last REPLAY_SECONDS, asks the event
detectors again, and keeps only the findings no incident has seen since the event was stored. Events
handled before are therefore never handled twice: their incident was last seen after they were recorded.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime

from sqlalchemy import func, select
from sqlalchemy.orm import Session

from sentinel.events.models import Event
from sentinel.events.service import EVENT_SEVERITY
from sentinel.incidents.models import Incident
from sentinel.nodes.models import Node
from sentinel.telemetry.schemas import HardwareEvent, NodeReport

# Far longer than the few milliseconds an event waits in the queue, and than a slow leader's stall.
REPLAY_SECONDS = 120.0


@dataclass
class StoredReport:
    """The events of one acknowledged report, rebuilt from the events table."""

    node: str
    report: NodeReport
    recorded_at: datetime


def stored_reports(session: Session, since: datetime) -> list[StoredReport]:
    """Agent events recorded since `since`, grouped back into their reports, oldest first.

    Only events an agent sent carry their report's seq; those the server makes (node up or down,
    state changes) do not, and are not replayed."""
    rows = session.execute(
        select(Node.name, Event.kind, Event.accelerator_uuid, Event.message, Event.data, Event.observed_at,
               Event.recorded_at)
        .join(Node, Node.id == Event.node_id)
        .where(Event.recorded_at >= since, Event.kind.in_(tuple(EVENT_SEVERITY)))
        .order_by(Event.id))
    grouped: dict[tuple[str, int], StoredReport] = {}
    for name, kind, uuid, message, data, observed_at, recorded_at in rows:
        seq = data.get("seq") if isinstance(data, dict) else None
        if not isinstance(seq, int):
            continue
        stored = grouped.get((name, seq))
        if stored is None:
            report = NodeReport.model_construct(node=name, seq=seq, sent_at=recorded_at.timestamp(),
                                                interval_seconds=10.0, host=None, accelerators=[], events=[],
                                                tasks=[], task_exits=[])
            stored = grouped[(name, seq)] = StoredReport(name, report, recorded_at)
        stored.report.events.append(HardwareEvent.model_construct(
            kind=kind, accelerator_uuid=uuid, xid=data.get("xid"),
            message="" if message == f"{kind} reported by agent" else message,  # the default ingest stores
            observed_at=observed_at.timestamp(), value=data.get("value"), count=int(data.get("count", 1)),
            last_observed_at=data.get("last_observed_at")))
    return list(grouped.values())


def last_seen(session: Session, fingerprint: str) -> datetime | None:
    """When any incident with this fingerprint, in any state, was last seen."""
    return session.scalar(select(func.max(Incident.last_seen_at)).where(Incident.fingerprint == fingerprint))
