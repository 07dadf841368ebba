"""What the status page shows, gathered in one read-only session: fleet state from memory where the server has
it (like nodes/api.py), incidents, job signals, the breaker."""

from __future__ import annotations

from sqlalchemy.orm import Session, sessionmaker

from sentinel import __version__
from sentinel.accelerators.service import count_by_health
from sentinel.auth.service import Principal
from sentinel.clock import Clock, to_datetime
from sentinel.incidents import render as incident_text
from sentinel.incidents.models import Incident
from sentinel.incidents.service import list_incidents
from sentinel.jobs.service import current_placement, list_jobs
from sentinel.live.view import LiveView
from sentinel.nodes.service import list_accelerators, list_nodes
from sentinel.remediation.engine import RemediationEngine
from sentinel.remediation.models import BreakerState
from sentinel.ui.render import AcceleratorCell, IncidentView, JobRow, NodeRow, StatusView

MAX_NODES = 1000
MAX_ACCELERATORS_PER_NODE = 64
MAX_INCIDENTS = 50
MAX_JOBS = 50
ACTIVE_STATES = ("open", "acknowledged")


def gather(sessions: sessionmaker[Session], live: LiveView, remediation: RemediationEngine, clock: Clock,
           principal: Principal) -> StatusView:
    now = clock.time()
    notes: list[str] = []
    with sessions() as session:
        nodes = _nodes(live, session, now)
        node_counts = live.fleet.count_by_state()
        nodes_total = sum(node_counts.values())
        if nodes_total > len(nodes):
            notes.append(f"Showing the first {len(nodes)} of {nodes_total} nodes by name.")
        incidents, incidents_total = list_incidents(session, states=ACTIVE_STATES, limit=MAX_INCIDENTS)
        incident_views = [_incident(i, now) for i in incidents]
        jobs = [JobRow(id=j.id, name=j.name, kind=j.kind, state=j.state, world_size=j.world_size,
                       metrics=remediation.recoveries.job_metrics(j.id, j.created_at, current_placement(session, j.id),
                                                                  now))
                for j in list_jobs(session, limit=MAX_JOBS)]
        breaker_open = remediation.breaker.open
        row = session.get(BreakerState, 1) if breaker_open else None
        return StatusView(actor=principal.actor, generated_at=to_datetime(now), version=__version__, nodes=nodes,
                          nodes_total=nodes_total, node_counts=node_counts, health_counts=count_by_health(session),
                          incidents=incident_views, incidents_total=incidents_total, jobs=jobs,
                          breaker_open=breaker_open, breaker_reason=row.reason if row is not None else "",
                          notes=notes)


def _nodes(view: LiveView, session: Session, now: float) -> list[NodeRow]:
    rows = list_nodes(session, limit=MAX_NODES)
    shown = {row.name for row in rows}
    cells: dict[str, list[AcceleratorCell]] = {}
    for acc, node in list_accelerators(session, limit=MAX_NODES * MAX_ACCELERATORS_PER_NODE):
        if node not in shown:
            continue
        latest = view.samples.latest(acc.uuid)
        sample = latest[1] if latest is not None else None
        cells.setdefault(node, []).append(AcceleratorCell(
            index=acc.index, uuid=acc.uuid, model=acc.model, health=acc.health, health_reason=acc.health_reason,
            present=acc.present, memory_total_bytes=acc.memory_total_bytes,
            utilization_ratio=sample.utilization_ratio if sample else None,
            temperature_celsius=sample.temperature_celsius if sample else None,
            memory_used_bytes=sample.memory_used_bytes if sample else None,
            sample_age_seconds=now - latest[0] if latest is not None else None))
    out = []
    for row in rows:
        live = view.fleet.get(row.name)
        seen: float | None
        if live is not None:
            state, seen = live.state, now - live.last_seen
        else:
            state, seen = row.state, (now - row.last_seen_at.timestamp()) if row.last_seen_at else None
        out.append(NodeRow(name=row.name, state=state, labels={str(k): str(v) for k, v in (row.labels or {}).items()},
                           last_seen_age_seconds=seen, accelerators=cells.get(row.name, [])))
    return out


def _incident(incident: Incident, now: float) -> IncidentView:
    return IncidentView(id=incident.id, severity=incident.severity, state=incident.state, title=incident.title,
                        subject=incident_text.subject(incident), age_seconds=now - incident.opened_at.timestamp(),
                        occurrences=incident.occurrences, sections=incident_text.sections(incident))
