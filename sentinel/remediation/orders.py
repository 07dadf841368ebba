"""Orders for launchers, in SQL (an order outlives a server restart): a new attempt for a job, its
acknowledgement (`acknowledged` → `done` | `failed`, never backwards), and escalation of orders nobody took.
How an order reaches its launcher (long-poll, signed webhook) is the launcher executor's
(remediation/executors/launcher.py)."""

from __future__ import annotations

import logging
import uuid
from datetime import datetime, timedelta
from typing import Any

from sqlalchemy import func, select
from sqlalchemy.orm import Session

from sentinel.jobs.models import Job, Task
from sentinel.remediation.executors.base import adjust_purpose
from sentinel.remediation.models import Order

log = logging.getLogger("sentinel.orders")
# an ack moves an order forward only: superseded ones cannot be acknowledged at all
ACK_RANK = {"pending": 0, "superseded": 0, "acknowledged": 1, "done": 2, "failed": 2}


def next_attempt(session: Session, job_id: int) -> int:
    tasks = session.scalar(select(func.max(Task.attempt)).where(Task.job_id == job_id))
    orders = session.scalar(select(func.max(Order.attempt)).where(Order.job_id == job_id))
    return max(tasks if tasks is not None else -1, orders if orders is not None else -1) + 1


def latest_attempt(session: Session, job_id: int) -> int | None:
    return session.scalar(select(func.max(Task.attempt)).where(Task.job_id == job_id))


def create_order(session: Session, *, job: Job, kind: str, placement: list[dict[str, Any]], reason: str,
                 incident_id: int | None, now: datetime, ack_seconds: float) -> Order:
    """A new attempt for `job`; pending orders it makes obsolete are superseded (a launcher acts on the
    newest only)."""
    for old in session.scalars(select(Order).where(Order.job_id == job.id, Order.state == "pending",
                                                   Order.kind != "adjust")):  # a batch limit outlives a restart
        old.state, old.result = "superseded", "a newer order replaced it"
    order = Order(id=str(uuid.uuid4()), job_id=job.id, kind=kind, attempt=next_attempt(session, job.id),
                  placement=placement, reason=reason[:512], incident_id=incident_id, state="pending",
                  created_at=now, deadline_at=now + timedelta(seconds=ack_seconds))
    session.add(order)
    job.state = "recovering"
    job.updated_at = now
    session.flush()
    return order


def close_finished(session: Session, job_id: int, state: str) -> int:
    """A job that ended (`succeeded`, `cancelled`) has no launcher left to act: its orders still pending are
    superseded, saying why; how many."""
    closed = 0
    for old in session.scalars(select(Order).where(Order.job_id == job_id, Order.state == "pending")):
        old.state, old.result = "superseded", f"the job was {state} before its launcher took the order"
        closed += 1
    return closed


def create_adjust(session: Session, *, job: Job, params: dict[str, Any], reason: str, now: datetime,
                  ack_seconds: float, incident_id: int | None = None) -> Order:
    """A change to a running serving job (its batch limit, an instruction to its engines): no new attempt, the
    job stays as it is; a pending adjust of the same purpose it makes obsolete is superseded."""
    for old in session.scalars(select(Order).where(Order.job_id == job.id, Order.state == "pending",
                                                   Order.kind == "adjust")):
        if adjust_purpose(old.params) == adjust_purpose(params):
            old.state, old.result = "superseded", "a newer adjustment replaced it"
    order = Order(id=str(uuid.uuid4()), job_id=job.id, kind="adjust", attempt=latest_attempt(session, job.id) or 0,
                  placement=[], params=params, reason=reason[:512], incident_id=incident_id, state="pending",
                  created_at=now, deadline_at=now + timedelta(seconds=ack_seconds))
    session.add(order)
    session.flush()
    return order


def order_dict(order: Order) -> dict[str, Any]:
    """The order as its launcher gets it (webhook body, Action.order)."""
    return {"id": order.id, "job_id": order.job_id, "kind": order.kind, "attempt": order.attempt,
            "placement": order.placement, "params": order.params, "reason": order.reason,
            "incident_id": order.incident_id,
            "state": order.state, "created_at": order.created_at.isoformat(),
            "deadline_at": order.deadline_at.isoformat()}


class OrderSuperseded(ValueError):
    """A newer order for the same job replaced this one: the launcher must act on the newer one."""


def acknowledge(order: Order, *, status: str, detail: str, actor: str, now: datetime) -> bool:
    """Apply a launcher's ack; True when it moved the order forward (a repeat or a step back is a no-op)."""
    if order.state == "superseded":
        raise OrderSuperseded(f"order {order.id} was superseded by a newer order for job {order.job_id}")
    if ACK_RANK[status] <= ACK_RANK[order.state]:
        return False
    order.state = status
    if order.kind == "adjust" and status in ("done", "failed"):
        order.completed_at = now  # nothing to step again: applied is complete
    order.acknowledged_at = order.acknowledged_at or now
    order.acknowledged_by = order.acknowledged_by or actor
    order.result = detail or order.result
    return True


def late_orders(session: Session, now: datetime, ack_seconds: float) -> list[tuple[int | None, str]]:
    """Pending orders past their deadline, each escalated once: (incident, timeline line)."""
    late: list[tuple[int | None, str]] = []
    for order in session.scalars(select(Order).where(Order.state == "pending", Order.escalated.is_(False),
                                                     Order.deadline_at < now)):
        order.escalated = True
        late.append((order.incident_id, f"order {order.id} for job {order.job_id} was not acknowledged within "
                                        f"{ack_seconds:g}s: is its launcher running?"))
    return late
