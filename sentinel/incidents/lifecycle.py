"""The incident lifecycle for one server: open from findings, acknowledge, resolve — each in one
transaction with the notifications it owes (the outbox), then the in-memory view and metrics.

Writes are serialised by one lock: detectors on the scheduler, the fatal-event worker and the API
may all touch the same fingerprint, and dedup must hold across them.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import Protocol

from prometheus_client import Histogram
from sqlalchemy.orm import Session, sessionmaker

from sentinel.clock import Clock, to_datetime
from sentinel.config import Settings
from sentinel.db import transaction
from sentinel.incidents import service
from sentinel.incidents.findings import SEVERITY_ORDER, Finding, OpenIncident, Subject
from sentinel.incidents.models import Incident
from sentinel.incidents.schemas import IncidentOut

log = logging.getLogger("sentinel.incidents")

ACTION_TEXT = {
    "record": "",
    "restart_task": "restart the task",
    "reset_accelerator": "take the accelerator out of service, reset it and restart its tasks elsewhere",
    "restart_node": "take the node out of service and restart its tasks elsewhere",
    "quarantine": "take the accelerator out of service for diagnostics (a lemon)",
    "drain_node": "drain the node and restart its tasks elsewhere",
    "page": "page a person; act on nothing automatically",
}
LATENCY_BUCKETS = (0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0, 300.0)


class Owed(Protocol):
    """A notification an incident change owes (alerting's outbox row), as far as the timeline tells it."""

    receiver: str
    event: str  # trigger | acknowledge | resolve
    state: str  # pending | silenced
    silence_id: int | None


class Outbox(Protocol):
    """Where incident changes owe notifications (the alerting dispatcher): `owe` queues the rows inside the
    incident's transaction; `ring` is called after the commit, so the sender never sees an uncommitted row."""

    def owe(self, session: Session, incident: Incident, event: str, now: datetime) -> Sequence[Owed]: ...

    def ring(self, rows: Sequence[Owed]) -> None: ...


class NoOutbox:
    """No receivers: incident changes owe nothing (a server built without alerting, and unit tests)."""

    def owe(self, session: Session, incident: Incident, event: str, now: datetime) -> Sequence[Owed]:
        return []

    def ring(self, rows: Sequence[Owed]) -> None:
        return None


@dataclass
class _Recorded:
    """What one `record` call did, for after its commit."""

    opened: list[IncidentOut] = field(default_factory=list)
    repeated: list[IncidentOut] = field(default_factory=list)  # event-driven, seen again: remediation may act again
    rows: list[Owed] = field(default_factory=list)
    kept: list[Incident] = field(default_factory=list)  # held here: the session's identity map keeps weak references


def _view(incident: Incident) -> OpenIncident:
    return OpenIncident(id=incident.id, fingerprint=incident.fingerprint, detector=incident.detector,
                        latched=incident.latched,
                        subject=Subject(node=incident.node, accelerator=incident.accelerator_uuid,
                                        job_id=incident.job_id, rank=incident.rank),
                        opened_at=incident.opened_at.timestamp())


class Incidents:
    def __init__(self, factory: sessionmaker[Session], settings: Settings, clock: Clock,
                 outbox: Outbox | None = None):
        self._factory = factory
        self._settings = settings
        self._clock = clock
        self.outbox: Outbox = outbox or NoOutbox()  # the notification sink: alerting's dispatcher
        self._lock = threading.RLock()
        self._open: dict[str, OpenIncident] = {}
        self._severity: dict[str, str] = {}
        self.latency = Histogram("sentinel_detection_latency_seconds",
                                 "From the agent observing a condition to its incident being open",
                                 labelnames=["detector"], buckets=LATENCY_BUCKETS, registry=None)
        self.listeners: list[Callable[[IncidentOut, str], None]] = []  # (incident, "opened"|"resolved"|…)

    def load(self, session: Session) -> None:
        with self._lock:
            self._open.clear()
            for incident in service.active_incidents(session):
                self._open[incident.fingerprint] = _view(incident)
                self._severity[incident.fingerprint] = incident.severity

    def active(self) -> list[OpenIncident]:
        with self._lock:
            return list(self._open.values())

    def is_open(self, fingerprint: str) -> bool:
        with self._lock:
            return fingerprint in self._open

    def open_counts(self) -> dict[str, int]:
        counts = {"info": 0, "warning": 0, "critical": 0}
        with self._lock:
            for severity in self._severity.values():
                counts[severity] = counts.get(severity, 0) + 1
        return counts

    def record(self, findings: list[Finding], *, repeat: bool) -> list[IncidentOut]:
        """Open an incident for each new fingerprint, refresh the active ones. Returns those opened."""
        if not findings:
            return []
        batch = _Recorded()
        with self._lock:
            now = to_datetime(self._clock.time())
            with transaction(self._factory) as session:
                for finding in findings:
                    self._record_one(session, finding, now, repeat, batch)
                views = [(_view(i), i.severity) for i in batch.kept]
            for view, severity in views:
                self._open[view.fingerprint] = view
                self._severity[view.fingerprint] = severity
        for out in batch.opened:
            latency = out.detection_latency_seconds
            if latency is not None:
                self.latency.labels(out.detector).observe(latency)
            log.warning("incident opened: id=%d severity=%s detector=%s fingerprint=%s latency=%s %s", out.id,
                        out.severity, out.detector, out.fingerprint,
                        f"{latency:.3f}s" if latency is not None else "-", out.title)
            self._tell(out, "opened")
        for out in batch.repeated:
            self._tell(out, "repeated")
        if batch.rows:
            self.outbox.ring(batch.rows)
        return batch.opened

    def _record_one(self, session: Session, finding: Finding, now: datetime, repeat: bool, batch: _Recorded) -> None:
        known = self._open.get(finding.fingerprint)
        incident = session.get(Incident, known.id) if known else None
        if incident is None or incident.state == "resolved":
            incident = service.find_active(session, finding.fingerprint)
        if incident is not None:
            batch.kept.append(incident)
            if service.update_incident(session, incident, finding, now, repeat=repeat):
                batch.rows += self.outbox.owe(session, incident, "trigger", now)
            if repeat:
                batch.repeated.append(IncidentOut.model_validate(incident))
            return
        incident = service.open_incident(session, finding, now)
        batch.kept.append(incident)
        recommended = ACTION_TEXT.get(finding.action, finding.action)
        if recommended:
            tail = ("" if self._settings.remediation_enabled else
                    " (automatic remediation is off on this server; nothing was changed)")
            service.add_action(incident, now, f"recommended: {recommended}{tail}")
        sent = self.outbox.owe(session, incident, "trigger", now)
        self._note_notifications(incident, sent, now)
        batch.rows += sent
        batch.opened.append(IncidentOut.model_validate(incident))

    @staticmethod
    def _note_notifications(incident: Incident, notifications: Sequence[Owed], now: datetime) -> None:
        names = [f"{n.receiver} (muted by silence #{n.silence_id})" if n.state == "silenced" else n.receiver
                 for n in notifications]
        if names:
            service.add_action(incident, now, "notifying " + ", ".join(names))

    def acknowledge(self, incident_id: int, *, actor: str, note: str = "") -> IncidentOut:
        out = self._transition(incident_id, "acknowledge", lambda session, now: service.acknowledge(
            session, incident_id, actor=actor, note=note, now=now))
        log.info("incident acknowledged: id=%d by=%s fingerprint=%s", out.id, actor, out.fingerprint)
        self._tell(out, "acknowledged")
        return out

    def resolve(self, incident_id: int, *, actor: str, reason: str = "") -> IncidentOut:
        out = self._transition(incident_id, "resolve", lambda session, now: service.resolve(
            session, incident_id, actor=actor, reason=reason, now=now))
        log.info("incident resolved: id=%d by=%s fingerprint=%s %s", out.id, actor, out.fingerprint, reason)
        self._tell(out, "resolved")
        return out

    def annotate(self, incident_id: int, text: str, *, severity: str | None = None) -> None:
        """Add a line to the incident's timeline ("what Sentinel did"); raise its severity if asked (which
        pages receivers that the new severity now reaches). A resolved incident only gets the line."""
        rows: Sequence[Owed] = []
        with self._lock:
            now = to_datetime(self._clock.time())
            with transaction(self._factory) as session:
                incident = service.get_incident(session, incident_id)
                service.add_action(incident, now, text)
                if (severity is not None and incident.state != "resolved"
                        and SEVERITY_ORDER[severity] > SEVERITY_ORDER.get(incident.severity, 0)):
                    service.add_action(incident, now, f"severity raised from {incident.severity} to {severity}")
                    incident.severity = severity
                    rows = self.outbox.owe(session, incident, "trigger", now)
                    self._severity[incident.fingerprint] = severity
        log.info("incident %d: %s", incident_id, text)
        if rows:
            self.outbox.ring(rows)

    def _transition(self, incident_id: int, event: str,
                    change: Callable[[Session, datetime], Incident]) -> IncidentOut:
        """Apply `change` and owe the receivers `event` when it changed the state; a no-op change owes nothing."""
        with self._lock:
            now = to_datetime(self._clock.time())
            with transaction(self._factory) as session:
                before = service.get_incident(session, incident_id).state
                incident = change(session, now)
                rows = self.outbox.owe(session, incident, event, now) if incident.state != before else []
                out = IncidentOut.model_validate(incident)
            if out.state == "resolved" and getattr(self._open.get(out.fingerprint), "id", None) == out.id:
                del self._open[out.fingerprint]
                self._severity.pop(out.fingerprint, None)
        self.outbox.ring(rows)
        return out

    def _tell(self, incident: IncidentOut, what: str) -> None:
        for listener in self.listeners:
            try:
                listener(incident, what)
            except Exception:
                log.exception("incident listener failed: id=%d", incident.id)
