"""Node registration, administrative state, and the fleet's accelerators by node (with their fault rates).
Functions take a session and never commit."""

from __future__ import annotations

from datetime import datetime

from sqlalchemy import func, select
from sqlalchemy.orm import Session

from sentinel.accelerators.models import Accelerator
from sentinel.audit.service import record
from sentinel.db import utcnow
from sentinel.events.models import Event
from sentinel.events.service import record_event
from sentinel.nodes.models import Node
from sentinel.telemetry.schemas import NodeRegistration


class NodeNotFound(LookupError):
    pass


class AcceleratorConflict(ValueError):
    pass


def get_node(session: Session, name: str) -> Node:
    node = session.scalar(select(Node).where(Node.name == name))
    if node is None:
        raise NodeNotFound(f"node {name!r} is not registered")
    return node


def list_nodes(session: Session, *, state: str | None = None, limit: int = 1000, offset: int = 0) -> list[Node]:
    query = select(Node).order_by(Node.name).limit(limit).offset(offset)
    if state is not None:
        query = query.where(Node.state == state)
    return list(session.scalars(query))


def list_accelerators(session: Session, *, node: str | None = None, health: str | None = None,
                      limit: int = 1000, offset: int = 0) -> list[tuple[Accelerator, str]]:
    query = (select(Accelerator, Node.name).join(Node, Node.id == Accelerator.node_id)
             .order_by(Node.name, Accelerator.index).limit(limit).offset(offset))
    if node is not None:
        query = query.where(Node.name == node)
    if health is not None:
        query = query.where(Accelerator.health == health)
    return [(acc, name) for acc, name in session.execute(query)]



HARDWARE_FAULTS = ("xid", "ecc", "offline", "remap")


def fault_rates(session: Session, now: datetime) -> list[tuple[str, int, float]]:
    """(node, hardware faults, accelerator-days observed) per node, for failures per 1,000 accelerator-days."""
    query = (select(Node.name, func.count(Event.id)).join(Event, Event.node_id == Node.id)
             .where(Event.kind.in_(HARDWARE_FAULTS), Event.severity == "critical").group_by(Node.name))
    faults: dict[str, int] = {name: count for name, count in session.execute(query)}
    days: dict[str, float] = {}
    for name, registered in session.execute(select(Node.name, Accelerator.registered_at)
                                            .join(Node, Node.id == Accelerator.node_id)):
        days[name] = days.get(name, 0.0) + max(0.0, (now - registered).total_seconds()) / 86400.0
    return [(name, int(faults.get(name, 0)), days.get(name, 0.0)) for name in sorted(set(days) | set(faults))]


def agent_urls(session: Session, names: set[str]) -> dict[str, str]:
    """Each node's agent URL (its `agent_url` label; '' when it has none)."""
    return {name: str((labels or {}).get("agent_url", "")) for name, labels in
            session.execute(select(Node.name, Node.labels).where(Node.name.in_(names)))}


def node_accelerators(session: Session, node_id: int) -> list[Accelerator]:
    return list(session.scalars(select(Accelerator).where(Accelerator.node_id == node_id)
                                .order_by(Accelerator.present.desc(), Accelerator.index)))


def register_node(session: Session, reg: NodeRegistration) -> tuple[Node, list[Accelerator]]:
    """Create or refresh a node and its accelerators. An accelerator that disappeared is kept, marked absent."""
    uuids = [a.uuid for a in reg.accelerators]
    if len(set(uuids)) != len(uuids):
        raise AcceleratorConflict("registration lists the same accelerator uuid twice")
    node = session.scalar(select(Node).where(Node.name == reg.name))
    if node is None:
        node = Node(name=reg.name, state="active", admin_state="active", last_seq=0, labels={}, sources=[])
        session.add(node)
        session.flush()
        record_event(session, kind="node_registered", node_id=node.id,
                     message=f"node {reg.name} registered with {len(uuids)} accelerators")
    node.hostname, node.interval_seconds, node.agent_version = reg.hostname, reg.interval_seconds, reg.agent_version
    node.sources, node.labels = list(reg.sources), dict(reg.labels)
    node.last_seen_at = utcnow()
    existing = {a.uuid: a for a in session.scalars(select(Accelerator).where(
        (Accelerator.node_id == node.id) | Accelerator.uuid.in_(uuids)))}
    for info in reg.accelerators:
        row = existing.get(info.uuid)
        if row is None:
            row = Accelerator(uuid=info.uuid, node_id=node.id, health="healthy", health_reason="")
            session.add(row)
        elif row.node_id != node.id:
            record_event(session, kind="accelerator_moved", node_id=node.id, accelerator_uuid=info.uuid,
                         message=f"accelerator {info.uuid} moved to node {reg.name}")
            row.node_id = node.id
        row.index, row.model, row.memory_total_bytes = info.index, info.model, info.memory_total_bytes
        row.source, row.simulated, row.present = info.source, info.simulated, True
        row.peak_flops = info.peak_flops
    for uuid, row in existing.items():
        if row.node_id == node.id and uuid not in uuids and row.present:
            row.present = False
            record_event(session, kind="accelerator_gone", severity="warning", node_id=node.id,
                         accelerator_uuid=uuid,
                         message=f"accelerator {uuid} (index {row.index}) is no longer reported by {reg.name}")
    session.flush()
    return node, node_accelerators(session, node.id)


def set_admin_state(session: Session, node: Node, *, admin_state: str, reason: str, actor: str) -> Node:
    """Cordon or uncordon. A down node keeps showing `down` until it reports, then takes this state."""
    if node.admin_state == admin_state:
        return node
    previous = node.admin_state
    node.admin_state = admin_state
    if node.state != "down":
        node.state = admin_state
        node.state_changed_at = utcnow()
    node.state_reason = reason or f"{admin_state} by {actor}"
    verb = {"cordoned": "cordon", "draining": "drain"}.get(admin_state, "uncordon")
    record(session, actor=actor, action=f"node.{verb}", subject=f"node/{node.name}", reason=reason,
           detail={"from": previous, "to": admin_state})
    record_event(session, kind=f"node_{admin_state}", node_id=node.id,
                 message=f"node {node.name} {admin_state} by {actor}" + (f": {reason}" if reason else ""))
    return node


def mark_down(session: Session, node_id: int, *, reason: str, severity: str = "critical") -> Node | None:
    node = session.get(Node, node_id)
    if node is None or node.state == "down":
        return None
    node.state, node.state_reason, node.state_changed_at = "down", reason, utcnow()
    record_event(session, kind="node_down", severity=severity, node_id=node.id,
                 message=f"node {node.name} is down: {reason}")
    return node
