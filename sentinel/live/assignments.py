"""Which tasks run on each node (node id → assignments): the agents get theirs with every report ack and
watch those processes. Re-read from SQL when a task starts or ends."""

from __future__ import annotations

import threading

from sqlalchemy.orm import Session, sessionmaker

from sentinel.jobs.service import assignments_by_node
from sentinel.telemetry.schemas import Assignment


class Assignments:
    def __init__(self, factory: sessionmaker[Session]):
        self._factory = factory
        self._by_node: dict[int, list[Assignment]] = {}
        self._lock = threading.Lock()

    def load(self, session: Session) -> None:
        with self._lock:
            self._by_node = assignments_by_node(session)

    def refresh(self) -> None:
        """Re-read running tasks. Serialised, query included: two refreshes racing (a task exit and a task
        registration) must not let the older read overwrite the newer one."""
        with self._lock, self._factory() as session:
            self._by_node = assignments_by_node(session)

    def of(self, node_id: int) -> list[Assignment]:
        with self._lock:
            return self._by_node.get(node_id, [])

    def snapshot(self) -> dict[int, list[Assignment]]:
        """Node id → its tasks, as of the last refresh (detectors read it)."""
        with self._lock:
            return self._by_node
