"""Recovery bookkeeping: which restarts Sentinel is waiting on, when each job was stepping again, what its
recoveries cost it (goodput), all kept in memory and rebuilt from completed orders on taking the lead.

A job recovers when a rank of the ordered attempt (or a later one) first makes step progress (its
telemetry, live/jobs.py). Recovery time runs from the fault being observed (the incident) to then.
Goodput = 1 − (time spent recovering + recomputed steps × median step) ÷ time since the job started.
"""

from __future__ import annotations

import logging
import threading
from dataclasses import dataclass, field
from datetime import datetime

from sqlalchemy import select
from sqlalchemy.orm import Session

from sentinel.checkpoints.interval import CheckpointIntervalPolicy, YoungDaly
from sentinel.checkpoints.schemas import CheckpointPolicy
from sentinel.checkpoints.service import checkpoint_policy
from sentinel.clock import to_datetime
from sentinel.incidents.models import Incident
from sentinel.jobs.models import Job
from sentinel.jobs.schemas import JobMetrics
from sentinel.jobs.service import current_placement
from sentinel.live.jobs import JobTelemetry
from sentinel.remediation.models import Order

log = logging.getLogger("sentinel.remediation")

RESTART_GRACE_SECONDS = 300.0  # a restart that never comes back stops hiding the job's later failures
UNDER_WAY = ("pending", "acknowledged", "done")


@dataclass(frozen=True)
class JobHealth:
    """A job's signals with what its recoveries cost, and the checkpoint interval its failure rate calls for."""

    placement: dict[int, list[str]]  # rank → accelerators of its latest attempt
    metrics: JobMetrics
    checkpoints: CheckpointPolicy


@dataclass
class Settled:
    """What one pass over the orders under way found, to say after its commit."""

    recovered: list[tuple[int | None, str]] = field(default_factory=list)  # (incident, timeline line)
    resolved: list[tuple[int, str]] = field(default_factory=list)  # (incident to resolve, reason)


class Recoveries:
    def __init__(self, telemetry: JobTelemetry, interval_policy: CheckpointIntervalPolicy | None = None):
        self.telemetry = telemetry
        self.interval_policy = interval_policy or YoungDaly()  # the recommended checkpoint interval
        self.seconds: dict[int, float] = {}  # job → its last recovery, fault observed → stepping again
        self.total: dict[int, float] = {}  # job → all its recoveries, summed (for goodput)
        # job → (attempt ordered and not yet stepping, since when)
        self._restarting: dict[int, tuple[int, float]] = {}
        self._lock = threading.Lock()

    def load(self, session: Session) -> None:
        """Each job's recoveries from its completed orders; orders under way are restarts still awaited."""
        for order, observed in session.execute(
                select(Order, Incident.observed_at).outerjoin(Incident, Incident.id == Order.incident_id)
                .where(Order.completed_at.is_not(None), Order.kind != "adjust").order_by(Order.completed_at)):
            assert order.completed_at is not None
            self._add(order.job_id, (order.completed_at - (observed or order.created_at)).total_seconds())
        for order in session.scalars(select(Order).where(Order.completed_at.is_(None), Order.state.in_(UNDER_WAY))):
            if order.attempt > self._restarting.get(order.job_id, (-1, 0.0))[0]:
                self._restarting[order.job_id] = (order.attempt, order.created_at.timestamp())

    def _add(self, job_id: int, seconds: float) -> None:
        with self._lock:
            self.seconds[job_id] = seconds
            self.total[job_id] = self.total.get(job_id, 0.0) + seconds

    def ordered(self, job_id: int, attempt: int, at: float) -> None:
        """Sentinel ordered `attempt`: until it steps, the old attempt's ranks are stopped on purpose."""
        self._restarting[job_id] = (attempt, at)

    def is_restarting(self, job_id: int, attempt: int, now: float) -> bool:
        """Did Sentinel order an attempt newer than `attempt` that is not stepping yet?"""
        ordered, since = self._restarting.get(job_id, (-1, 0.0))
        return ordered > attempt and now - since < RESTART_GRACE_SECONDS

    def settle(self, session: Session, now: float | None = None) -> Settled:
        """Orders whose attempt is stepping: recorded as completed, with their recovery time and lost steps. A
        serving replica does not step: its replacement is complete when the launcher says it is done (it
        answers and takes traffic), seen here at `now`."""
        out = Settled()
        for order in session.scalars(select(Order).where(Order.state.in_(("acknowledged", "done")),
                                                         Order.completed_at.is_(None), Order.kind != "adjust")):
            stepped = self.first_step_at(order.job_id, order.attempt)
            if stepped is None and order.kind == "replace_replica" and order.state == "done" and now is not None:
                stepped = now
            if stepped is not None:
                self._complete(session, order, stepped, out)
        return out

    def _complete(self, session: Session, order: Order, stepped: float, out: Settled) -> None:
        order.completed_at = to_datetime(stepped)
        if self._restarting.get(order.job_id, (-1, 0.0))[0] <= order.attempt:
            self._restarting.pop(order.job_id, None)
        job = session.get(Job, order.job_id)
        if job is not None and job.state == "recovering":
            job.state = "running"
        incident = session.get(Incident, order.incident_id) if order.incident_id else None
        took = stepped - (incident.observed_at.timestamp() if incident else order.created_at.timestamp())
        self._add(order.job_id, took)
        order.recovery_seconds = took
        order.lost_steps = self.lost_steps(order.job_id, order.attempt)
        serving = order.kind == "replace_replica"  # no steps: it serves again once its replacement answers
        again = "serving again" if serving else "stepping again"
        order.result = (f"{again} {took:.1f}s after the fault was observed"
                        + (f"; {order.result}" if serving and order.result else ""))[:1024]
        if incident is not None and not incident.latched and incident.state != "resolved":
            # not latched: resolved, so a new occurrence of the same condition opens a new incident
            out.resolved.append((incident.id, f"recovered: job {order.job_id} {again} (attempt {order.attempt})"))
        redo = f"; {order.lost_steps} step(s) to recompute" if order.lost_steps else ""
        out.recovered.append((order.incident_id, f"job {order.job_id} is {again} (attempt {order.attempt}), "
                                                 f"{took:.1f}s after the fault was observed{redo}"))
        log.warning("job recovered: job=%d attempt=%d order=%s recovery=%.2fs", order.job_id, order.attempt,
                    order.id, took)

    def lost_steps(self, job_id: int, attempt: int) -> int | None:
        """Steps the job recomputes from `attempt` on (None: no telemetry of the job)."""
        for stats in self.telemetry.snapshot():
            if stats.job_id == job_id:
                return sum(v for a, v in stats.lost_by_attempt.items() if a >= attempt) if stats.lost_by_attempt else 0
        return None

    def first_step_at(self, job_id: int, attempt: int) -> float | None:
        """When a rank of the job's `attempt` (or later) first made step progress, from job telemetry."""
        for stats in self.telemetry.snapshot():
            if stats.job_id != job_id:
                continue
            times = [r.first_progress_at for r in stats.ranks.values()
                     if r.attempt >= attempt and r.first_progress_at is not None]
            return min(times) if times else None
        return None

    def job_metrics(self, job_id: int, created_at: datetime, placement: dict[int, list[str]], now: float
                    ) -> JobMetrics:
        """The job's signals over the recent window with its recovery time and goodput."""
        hours = max(1e-9, (now - created_at.timestamp()) / 3600.0)
        summary = self.telemetry.summary(job_id, accelerators_by_rank=placement, hours_running=hours)
        if summary is None:
            return JobMetrics(job_id=job_id, window_seconds=self.telemetry.window_seconds, step_seconds_p50=None,
                              step_seconds_p95=None, tokens_per_second=None, mfu_ratio=None,
                              allreduce_time_ratio=None, allreduce_exposed_ratio=None, memory_peak_bytes=None,
                              memory_capacity_bytes=None, task_failures={}, task_failures_total=0,
                              failures_per_hour=None, ranks=[])
        recovery = self.total.get(job_id, 0.0)
        running = now - created_at.timestamp()
        wasted = recovery + summary.lost_steps_total * (summary.step_seconds_p50 or 0.0)
        goodput = max(0.0, 1.0 - wasted / running) if running > 0 and summary.step_seconds_p50 is not None else None
        return summary.model_copy(update={"recovery_seconds_total": recovery, "goodput_ratio": goodput})

    def job_health(self, session: Session, job: Job, now: float, *, fleet_rate: float | None = None) -> JobHealth:
        """Metrics and checkpoint policy of `job` (the API's job detail, /metrics, the status page)."""
        placement = current_placement(session, job.id)
        metrics = self.job_metrics(job.id, job.created_at, placement, now)
        uuids = [u for rank in sorted(placement) for u in placement[rank]]
        policy = checkpoint_policy(session, job, now=to_datetime(now), failures_per_hour=metrics.failures_per_hour,
                                   accelerators=len(uuids) or job.world_size, step_seconds=metrics.step_seconds_p50,
                                   fleet_rate=fleet_rate, uuids=uuids, interval_policy=self.interval_policy)
        return JobHealth(placement, metrics, policy)
