"""The policy tests' world: a real database (SQLite and PostgreSQL, schema by Alembic) and incident rows."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from datetime import datetime, timedelta

import pytest
from sqlalchemy.orm import Session, sessionmaker

from sentinel.accelerators.models import Accelerator
from sentinel.clock import to_datetime
from sentinel.db import make_engine, make_sessionmaker, transaction, upgrade
from sentinel.incidents.models import Incident
from sentinel.nodes.models import Node

NOW = 1_800_000_000.0


@pytest.fixture
def sessions(database_url: str) -> Iterator[sessionmaker[Session]]:
    upgrade(database_url)
    engine = make_engine(database_url)
    yield make_sessionmaker(engine)
    engine.dispose()


def incident(node: str | None, *, days_ago: float, out_days: float | None = 0.5, layer: str = "hardware",
             severity: str = "critical", detector: str = "hardware", now: float = NOW) -> Incident:
    """An incident opened `days_ago` before `now` and resolved `out_days` later (None: still open)."""
    opened = to_datetime(now) - timedelta(days=days_ago)
    resolved: datetime | None = opened + timedelta(days=out_days) if out_days is not None else None
    return Incident(fingerprint=f"test|{uuid.uuid4().hex}", detector=detector,
                    state="resolved" if resolved else "open", severity=severity, title="test fault", layer=layer,
                    node=node, observed_at=opened, opened_at=opened, last_seen_at=opened, resolved_at=resolved,
                    evidence={}, actions=[], next_steps=[])


def add_incidents(sessions: sessionmaker[Session], *rows: Incident) -> None:
    with transaction(sessions) as session:
        session.add_all(rows)


def add_nodes(sessions: sessionmaker[Session], nodes: dict[str, int]) -> None:
    """Nodes with `nodes[name]` accelerators each, uuids `<name>-<i>`."""
    with transaction(sessions) as session:
        for name, count in nodes.items():
            node = Node(name=name)
            session.add(node)
            session.flush()
            session.add_all(Accelerator(uuid=f"{name}-{i}", node_id=node.id, index=i, model="h100",
                                        memory_total_bytes=80 * 2**30, source="sim") for i in range(count))
