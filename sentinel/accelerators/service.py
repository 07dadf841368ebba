from __future__ import annotations

from sqlalchemy import func, select
from sqlalchemy.orm import Session

from sentinel.accelerators.models import HEALTH_STATES, Accelerator
from sentinel.nodes.models import Node


def list_accelerators(session: Session, *, node: str | None = None, health: str | None = None,
                      limit: int = 1000, offset: int = 0) -> list[tuple[Accelerator, str]]:
    query = (select(Accelerator, Node.name).join(Node, Node.id == Accelerator.node_id)
             .order_by(Node.name, Accelerator.index).limit(limit).offset(offset))
    if node is not None:
        query = query.where(Node.name == node)
    if health is not None:
        query = query.where(Accelerator.health == health)
    return [(acc, name) for acc, name in session.execute(query)]


def count_by_health(session: Session) -> dict[str, int]:
    counts = dict.fromkeys(HEALTH_STATES, 0)
    query = select(Accelerator.health, func.count()).where(Accelerator.present.is_(True)).group_by(Accelerator.health)
    for health, count in session.execute(query):
        counts[health] = count
    return counts
