"""Per-job signals from the task telemetry the agents relay: step time, tokens/s, MFU, all-reduce
share, peak memory, failures. Kept in memory over a sliding window; history is Prometheus's job.

Definitions (DESIGN §3): a rank's tokens/s is its tokens over its time inside steps; the job's is
the sum over ranks. MFU = FLOPs/token × job tokens/s ÷ (accelerators × peak per accelerator).
All-reduce share = collective time ÷ step time, per rank and as the mean over ranks; the exposed
share counts only communication that compute did not hide.
"""

from __future__ import annotations

import statistics
import threading
from collections import deque
from dataclasses import dataclass, field
from typing import NamedTuple

from sqlalchemy import select
from sqlalchemy.orm import Session

from sentinel.accelerators.models import Accelerator
from sentinel.events.models import Event
from sentinel.jobs.schemas import JobMetrics, RankMetrics
from sentinel.sdk.flops import peak_flops
from sentinel.telemetry.schemas import TaskModel, TaskPause, TaskTelemetry

STEP_WINDOW = 512
WARMUP_STEPS = 5  # the first steps of every attempt (compilation, caches, data loader start) are not judged


@dataclass
class _Interval:
    at: float
    steps: int
    tokens: int
    busy_seconds: float
    collective_seconds: float
    exposed_seconds: float | None
    slowest_seconds: float = 0.0  # its slowest step


@dataclass
class RankStats:
    rank: int
    step_seconds: deque[float] = field(default_factory=lambda: deque(maxlen=STEP_WINDOW))
    intervals: deque[_Interval] = field(default_factory=deque)
    last_step: int | None = None
    memory_peak_bytes: int = 0
    device_memory_bytes: int = 0
    model: TaskModel | None = None
    node: str = ""
    last_seen: float = 0.0
    first_seen: float = 0.0
    # the current attempt: a new pid or attempt number starts a new one (after a restart)
    pid: int = 0
    attempt: int = 0
    attempt_steps: int = 0
    # (received at, step seconds) of steps past warm-up in this attempt, for detectors
    recent: deque[tuple[float, float]] = field(default_factory=lambda: deque(maxlen=STEP_WINDOW))
    last_progress_at: float | None = None  # when last_step last moved forward
    first_progress_at: float | None = None  # when this attempt first moved forward (recovery is measured to it)
    previous_last_step: int | None = None  # where the attempt before this one had got to
    saved_step: int | None = None  # the newest step this attempt saved a checkpoint shard of
    ended: bool = False  # its process exited; a hung rank is one whose process still lives
    ended_at: float | None = None
    exit_reason: str | None = None  # '' exited 0, else the failure reason; None: not told
    pause: TaskPause | None = None  # a declared pause (checkpoint, evaluation) its SDK reports, while it lasts
    paused_at: float | None = None  # when that pause was first seen here, and when the last one was seen over
    pause_ended_at: float | None = None


class StepProfile(NamedTuple):
    """A rank's cadence in this attempt, for the hang detector (seconds; past warm-up unless named so)."""

    median: float | None
    slowest: float | None  # over the intervals of the window (5 min)
    wall_per_step: float | None  # wall time per received step, warm-up too: time between steps (data) counts
    warming_up: bool  # within its first WARMUP_STEPS (compilation, caches, the data loader starting)


@dataclass
class JobStats:
    job_id: int
    kind: str = "training"
    ranks: dict[int, RankStats] = field(default_factory=dict)
    failures: dict[str, int] = field(default_factory=dict)
    first_seen: float = 0.0
    lost_by_attempt: dict[int, int] = field(default_factory=dict)  # steps recomputed after each restart


def _furthest(*steps: int | None) -> int | None:
    return max((s for s in steps if s is not None), default=None)


def quantile(values: list[float], q: float) -> float | None:
    if len(values) <= 1:
        return values[0] if values else None
    return statistics.quantiles(values, n=100, method="inclusive")[round(q * 100) - 1]


class JobTelemetry:
    """Thread-safe: ingest adds, the API and /metrics read."""

    def __init__(self, window_seconds: float = 300.0):
        self.window_seconds = window_seconds
        self._jobs: dict[int, JobStats] = {}
        self._lock = threading.Lock()
        # accelerator uuid → (model name, peak FLOP/s measured by its agent, memory bytes)
        self.accelerators: dict[str, tuple[str, float | None, int]] = {}

    def load(self, session: Session) -> None:
        """Accelerator facts MFU needs, and failure counts that must survive a restart."""
        for uuid, model, peak, memory in session.execute(
                select(Accelerator.uuid, Accelerator.model, Accelerator.peak_flops, Accelerator.memory_total_bytes)):
            self.accelerators[uuid] = (model, peak, memory)
        for job_id, data in session.execute(select(Event.job_id, Event.data).where(Event.kind == "task_failed")):
            if job_id is not None:
                self.count_failure(job_id, str(data.get("reason", "unknown")))

    def find(self, job_id: int) -> JobStats | None:
        """The job's stats, if any telemetry of it was seen (a reader's lookup: it creates nothing)."""
        with self._lock:
            return self._jobs.get(job_id)

    def job(self, job_id: int, kind: str = "training") -> JobStats:
        with self._lock:
            stats = self._jobs.get(job_id)
            return stats if stats is not None else self._jobs.setdefault(job_id, JobStats(job_id, kind))

    def add(self, node: str, tasks: list[TaskTelemetry], now: float) -> None:
        for task in tasks:
            stats = self.job(task.job_id)
            with self._lock:
                stats.first_seen = stats.first_seen or now
                rank = stats.ranks.get(task.rank)
                if rank is None:
                    rank = stats.ranks[task.rank] = RankStats(task.rank)
                if rank.pid != task.pid or rank.attempt != task.attempt:
                    if rank.pid and task.attempt > rank.attempt:
                        rank.previous_last_step = _furthest(rank.last_step, rank.saved_step)
                    rank.pid, rank.attempt, rank.attempt_steps = task.pid, task.attempt, 0
                    rank.ended, rank.first_seen, rank.last_progress_at = False, now, None
                    rank.first_progress_at = rank.saved_step = rank.ended_at = rank.exit_reason = rank.pause = None
                    rank.recent.clear()
                for seconds in task.step_seconds:
                    rank.attempt_steps += 1
                    if rank.attempt_steps > WARMUP_STEPS:
                        rank.recent.append((now, seconds))
                if task.pause != rank.pause:  # a pause seen anew starts its clock; none after one: it is over
                    fresh = task.pause is not None and (rank.pause is None or task.pause.since != rank.pause.since)
                    rank.paused_at = now if fresh else rank.paused_at
                    rank.pause_ended_at, rank.pause = (now if task.pause is None else rank.pause_ended_at), task.pause
                if task.steps > 0 or (task.last_step is not None and (rank.last_step is None
                                                                      or task.last_step > rank.last_step)):
                    rank.last_progress_at = now
                    if rank.first_progress_at is None:
                        rank.first_progress_at = min(now, task.first_step_at or now)
                        if rank.previous_last_step is not None and task.last_step is not None:
                            resumed_from = task.last_step - task.steps  # 0 when it started over
                            lost = max(0, rank.previous_last_step - resumed_from)
                            stats.lost_by_attempt[task.attempt] = max(stats.lost_by_attempt.get(task.attempt, 0),
                                                                      lost)
                rank.step_seconds.extend(task.step_seconds)
                rank.intervals.append(_Interval(now, task.steps, task.tokens, task.busy_seconds,
                                                task.collective_seconds, task.exposed_collective_seconds,
                                                max(task.step_seconds, default=0.0)))
                while rank.intervals and rank.intervals[0].at < now - self.window_seconds:
                    rank.intervals.popleft()
                rank.last_step = task.last_step if task.last_step is not None else rank.last_step
                rank.memory_peak_bytes = max(rank.memory_peak_bytes, task.memory_peak_bytes or 0)
                rank.device_memory_bytes = max(rank.device_memory_bytes, task.device_memory_bytes or 0)
                rank.model = task.model or rank.model
                rank.node, rank.last_seen = node, now

    def count_failure(self, job_id: int, reason: str) -> None:
        stats = self.job(job_id)
        with self._lock:
            stats.failures[reason] = stats.failures.get(reason, 0) + 1

    def saved(self, job_id: int, rank: int, attempt: int, step: int) -> None:
        """A rank registered a checkpoint shard of `step`: its attempt got at least that far, even when the
        telemetry of those steps never arrived (a rank killed between two flushes). Lost steps count it."""
        with self._lock:
            stats = self._jobs.get(job_id)
            found = stats.ranks.get(rank) if stats else None
            if found is not None and found.attempt == attempt:
                found.saved_step = _furthest(found.saved_step, step)

    def mark_ended(self, job_id: int, rank: int, pid: int, *, reason: str | None = None, at: float = 0.0) -> None:
        """Its process exited: it can no longer be hung. `reason` '' is exit 0; `at` defaults to its last telemetry."""
        with self._lock:
            stats = self._jobs.get(job_id)
            found = stats.ranks.get(rank) if stats else None
            if found is not None and found.pid in (pid, 0):
                found.ended, found.exit_reason = True, reason
                found.ended_at = at or found.last_seen

    def snapshot(self) -> list[JobStats]:
        """The jobs as they are now, for detectors. Rank objects are shared: read, never write."""
        with self._lock:
            return list(self._jobs.values())

    def forget(self, job_id: int) -> None:
        with self._lock:
            self._jobs.pop(job_id, None)

    def last_step(self, job_id: int) -> int | None:
        """The furthest step any rank of the job reported."""
        with self._lock:
            stats = self._jobs.get(job_id)
            steps = [r.last_step for r in stats.ranks.values() if r.last_step is not None] if stats else []
        return max(steps) if steps else None

    def job_ids(self) -> list[int]:
        with self._lock:
            return sorted(self._jobs)

    def summary(self, job_id: int, *, accelerators_by_rank: dict[int, list[str]] | None = None,
                hours_running: float | None = None) -> JobMetrics | None:
        with self._lock:
            stats = self._jobs.get(job_id)
            if stats is None:
                return None
            ranks = [self._rank_summary(r, (accelerators_by_rank or {}).get(r.rank, []))
                     for r in sorted(stats.ranks.values(), key=lambda r: r.rank)]
            all_steps = [s for r in stats.ranks.values() for s in r.step_seconds]
            failures = dict(stats.failures)
            lost = sum(stats.lost_by_attempt.values())
        rates = [r.tokens_per_second for r in ranks if r.tokens_per_second is not None]
        tokens_per_second = sum(rates) if rates else None
        shares = [r.allreduce_time_ratio for r in ranks if r.allreduce_time_ratio is not None]
        exposed = [r.allreduce_exposed_ratio for r in ranks if r.allreduce_exposed_ratio is not None]
        peaks = [r.memory_peak_bytes for r in ranks if r.memory_peak_bytes is not None]
        capacities = [r.memory_capacity_bytes for r in ranks if r.memory_capacity_bytes]
        total_failures = sum(failures.values())
        return JobMetrics(
            job_id=job_id, window_seconds=self.window_seconds,
            step_seconds_p50=quantile(all_steps, 0.5), step_seconds_p95=quantile(all_steps, 0.95),
            steps_in_window=len(all_steps), step_seconds_sum=sum(all_steps),
            lost_steps_total=lost, tokens_per_second=tokens_per_second, mfu_ratio=mfu_of(ranks),
            allreduce_time_ratio=statistics.fmean(shares) if shares else None,
            allreduce_exposed_ratio=statistics.fmean(exposed) if exposed else None,
            memory_peak_bytes=max(peaks) if peaks else None,
            memory_capacity_bytes=min(capacities) if capacities else None,
            task_failures=failures, task_failures_total=total_failures,
            failures_per_hour=total_failures / hours_running if hours_running else None, ranks=ranks)

    def _rank_summary(self, rank: RankStats, uuids: list[str]) -> RankMetrics:
        steps = list(rank.step_seconds)
        busy = sum(i.busy_seconds for i in rank.intervals)
        tokens = sum(i.tokens for i in rank.intervals)
        collective = sum(i.collective_seconds for i in rank.intervals)
        exposed_parts = [i.exposed_seconds for i in rank.intervals if i.exposed_seconds is not None]
        capacity = sum(self.accelerators.get(u, ("", None, 0))[2] for u in uuids) or None
        return RankMetrics(
            rank=rank.rank, node=rank.node, last_step=rank.last_step,
            step_seconds_p50=quantile(steps, 0.5), step_seconds_p95=quantile(steps, 0.95),
            tokens_per_second=tokens / busy if busy > 0 else None,
            allreduce_time_ratio=min(1.0, collective / busy) if busy > 0 else None,
            allreduce_exposed_ratio=min(1.0, sum(exposed_parts) / busy) if busy > 0 and exposed_parts else None,
            memory_peak_bytes=max(rank.memory_peak_bytes, rank.device_memory_bytes) or None,
            memory_capacity_bytes=capacity, accelerators=uuids,
            flops_per_token=rank.model.flops_per_token if rank.model else None,
            accelerators_per_rank=rank.model.accelerators_per_rank if rank.model else max(1, len(uuids)),
            peak_flops_per_accelerator=self._peak(rank.model, uuids))

    def _peak(self, model: TaskModel | None, uuids: list[str]) -> float | None:
        """The job's own figure, else the datasheet for the accelerator's model, else the agent's probe."""
        if model is not None and model.peak_flops_per_accelerator:
            return model.peak_flops_per_accelerator
        dtype = model.dtype if model is not None else "bf16"
        for uuid in uuids:
            name, measured, _ = self.accelerators.get(uuid, ("", None, 0))
            table = peak_flops(name, dtype) if name else None
            if table or measured:
                return table or measured
        return None

    # --- windowed reads for detectors (each under the lock: ingest appends from another thread) ---

    def step_profile(self, job_id: int, rank: int) -> StepProfile | None:
        with self._lock:
            found = self._jobs[job_id].ranks.get(rank) if job_id in self._jobs else None
            if found is None:
                return None
            steps = [seconds for _, seconds in found.recent]
            moved = [i for i in found.intervals if i.at >= found.first_seen and i.steps > 0]  # warm-up included
            later = sum(i.steps for i in moved[1:])  # the steps made after the first interval that made any
            return StepProfile(statistics.median(steps) if steps else None,
                               max((i.slowest_seconds for i in _settled_intervals(found)), default=None),
                               (moved[-1].at - moved[0].at) / later if later else None,
                               found.attempt_steps <= WARMUP_STEPS)

    def recent_steps(self, job_id: int, since: float, last: int) -> dict[int, list[tuple[float, float]]]:
        """Per live rank, its newest `last` post-warm-up (received at, step seconds) received at or after
        `since`, oldest first; O(last) per rank."""
        with self._lock:
            stats = self._jobs.get(job_id)
            if stats is None:
                return {}
            out: dict[int, list[tuple[float, float]]] = {}
            for rank in stats.ranks.values():
                if rank.ended:
                    continue
                steps: list[tuple[float, float]] = []
                for at, seconds in reversed(rank.recent):
                    if at < since or len(steps) >= last:
                        break
                    steps.append((at, seconds))
                steps.reverse()
                out[rank.rank] = steps
            return out

    def rates(self, job_id: int, since: float, until: float, *,
              accelerators_by_rank: dict[int, list[str]] | None = None) -> WindowRates | None:
        """MFU, all-reduce share and throughput from the intervals received in (since, until], counting
        only the current attempt past warm-up. None until every reporting rank has stepped in the window:
        a rank still warming up (or stuck) would bias it."""
        with self._lock:
            stats = self._jobs.get(job_id)
            if stats is None:
                return None
            per_rank: list[tuple[RankStats, float, float, float, int]] = []
            for rank in stats.ranks.values():
                if rank.ended or rank.last_seen <= since:  # gone or silent: not part of this window
                    continue
                busy = tokens = collective = 0.0
                steps = 0
                for interval in _settled_intervals(rank):
                    if since < interval.at <= until:
                        busy += interval.busy_seconds
                        tokens += interval.tokens
                        collective += interval.collective_seconds
                        steps += interval.steps
                if busy <= 0 or steps <= 0:
                    return None
                per_rank.append((rank, busy, tokens, collective, steps))
            if not per_rank:
                return None
            achieved = peak_total = 0.0
            mfu_known = True
            shares: dict[int, float] = {}
            for rank, busy, tokens, collective, _ in per_rank:
                shares[rank.rank] = min(1.0, collective / busy)
                peak = self._peak(rank.model, (accelerators_by_rank or {}).get(rank.rank, []))
                if rank.model is None or peak is None:
                    mfu_known = False
                    continue
                achieved += rank.model.flops_per_token * tokens / busy
                peak_total += peak * rank.model.accelerators_per_rank
        total_steps = sum(r[4] for r in per_rank)
        return WindowRates(
            since=since, until=until, ranks=len(per_rank), steps=total_steps,
            tokens_per_second=sum(r[2] / r[1] for r in per_rank),
            tokens_per_step=sum(r[2] for r in per_rank) / total_steps,
            step_seconds=sum(r[1] for r in per_rank) / total_steps,
            allreduce_share=statistics.fmean(shares.values()),
            mfu=achieved / peak_total if mfu_known and peak_total > 0 else None,
            rank_shares=shares)


def mfu_of(ranks: list[RankMetrics]) -> float | None:
    """Σ FLOPs/token × tokens/s over ranks ÷ Σ accelerators × peak; None until every rank can say."""
    achieved = peak_total = 0.0
    for r in ranks:
        if r.flops_per_token is None or r.peak_flops_per_accelerator is None or r.tokens_per_second is None:
            return None
        achieved += r.flops_per_token * r.tokens_per_second
        peak_total += r.peak_flops_per_accelerator * r.accelerators_per_rank
    return achieved / peak_total if ranks and peak_total else None


@dataclass
class WindowRates:
    """A job's signals over one window, for detectors that compare a window with the job's own past."""

    since: float
    until: float
    ranks: int
    steps: int  # summed over ranks
    tokens_per_second: float  # summed over ranks (each rank's tokens over its time inside steps)
    tokens_per_step: float  # per rank
    step_seconds: float  # mean time inside a step
    allreduce_share: float  # mean over ranks of collective ÷ step time
    mfu: float | None  # None unless every rank knows its FLOPs per token and its peak
    rank_shares: dict[int, float]


def _settled_intervals(rank: RankStats) -> list[_Interval]:
    """The rank's intervals in its current attempt that hold no warm-up step (oldest first)."""
    attempt = [i for i in rank.intervals if i.at >= rank.first_seen]
    # steps of this attempt already trimmed out of the interval window
    counted = max(0, rank.attempt_steps - sum(i.steps for i in attempt))
    settled = []
    for interval in attempt:
        if counted >= WARMUP_STEPS:
            settled.append(interval)
        counted += interval.steps
    return settled
