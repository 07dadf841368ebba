"""Recent checkpoint commits per job, in memory, for detectors (which never touch SQL)."""

from __future__ import annotations

import threading
from collections import deque
from dataclasses import dataclass, field

from sqlalchemy import select
from sqlalchemy.orm import Session

from sentinel.checkpoints.models import Checkpoint

KEEP = 16


@dataclass
class JobLedger:
    commits: deque[tuple[float, int]] = field(default_factory=lambda: deque(maxlen=KEEP))  # (committed at, step)
    pending_step: int | None = None  # the newest step with shards in but not committed
    pending_ranks: set[int] = field(default_factory=set)
    world_size: int = 0


class CheckpointLedger:
    """Thread-safe: the catalog API writes, the checkpoint detector reads."""

    def __init__(self) -> None:
        self._jobs: dict[int, JobLedger] = {}
        self._lock = threading.Lock()

    def load(self, session: Session) -> None:
        rows = session.execute(select(Checkpoint.job_id, Checkpoint.step, Checkpoint.committed_at,
                                      Checkpoint.shards_expected)
                               .where(Checkpoint.committed_at.is_not(None)).order_by(Checkpoint.committed_at))
        with self._lock:
            self._jobs.clear()
            for job_id, step, at, expected in rows:
                if at is None:
                    continue
                ledger = self._jobs.setdefault(job_id, JobLedger(world_size=expected))
                ledger.commits.append((at.timestamp(), int(step)))

    def shard(self, job_id: int, step: int, rank: int, *, world_size: int, committed: bool, at: float) -> None:
        with self._lock:
            ledger = self._jobs.setdefault(job_id, JobLedger())
            ledger.world_size = world_size
            if committed:
                ledger.commits.append((at, step))
                if ledger.pending_step is not None and ledger.pending_step <= step:
                    ledger.pending_step, ledger.pending_ranks = None, set()
            elif ledger.pending_step is None or step > ledger.pending_step:
                ledger.pending_step, ledger.pending_ranks = step, {rank}
            elif step == ledger.pending_step:
                ledger.pending_ranks.add(rank)

    def view(self, job_id: int) -> JobLedger | None:
        with self._lock:
            ledger = self._jobs.get(job_id)
            if ledger is None:
                return None
            return JobLedger(deque(ledger.commits, maxlen=KEEP), ledger.pending_step, set(ledger.pending_ranks),
                             ledger.world_size)

    def job_ids(self) -> list[int]:
        with self._lock:
            return sorted(self._jobs)
