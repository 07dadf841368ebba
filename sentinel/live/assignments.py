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
        self._homes: dict[tuple[int, int], set[int]] = {}  # (job, rank) → the nodes it runs on
        self._lock = threading.Lock()

    def load(self, session: Session) -> None:
        with self._lock:
            self._set(assignments_by_node(session))

    def refresh(self) -> None:
        """Re-read running tasks. Serialised, query included: two refreshes racing (a task exit and a task
        registration) must not let the older read overwrite the newer one."""
        with self._lock, self._factory() as session:
            self._set(assignments_by_node(session))

    def _set(self, by_node: dict[int, list[Assignment]]) -> None:
        homes: dict[tuple[int, int], set[int]] = {}
        for node_id, tasks in by_node.items():
            for task in tasks:
                homes.setdefault((task.job_id, task.rank), set()).add(node_id)
        self._by_node, self._homes = by_node, homes

    def elsewhere(self, node_id: int, job_id: int, rank: int) -> bool:
        """Is this rank running, but on other nodes only? Then telemetry for it from `node_id` is not its own."""
        with self._lock:
            homes = self._homes.get((job_id, rank))
            return homes is not None and node_id not in homes

    def of(self, node_id: int) -> list[Assignment]:
        with self._lock:
            return self._by_node.get(node_id, [])

    def snapshot(self) -> dict[int, list[Assignment]]:
        """Node id → its tasks, as of the last refresh (detectors read it)."""
        with self._lock:
            return self._by_node
