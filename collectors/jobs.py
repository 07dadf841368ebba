"""Job telemetry on the node: the SDK's batches summed per task for the next report, and how long each task's
main thread waited for a CPU. The exits of task processes are collectors/exits.py's."""

from __future__ import annotations

import logging
import os
import threading
from dataclasses import dataclass, field

from collectors.procfs import read_small
from sentinel.telemetry.schemas import (
    CollectiveTotals,
    ExpertLoad,
    SdkBatch,
    TaskModel,
    TaskPause,
    TaskTelemetry,
)
from sentinel.telemetry.serving import ServingStats, add_stats

log = logging.getLogger("sentinel.agent.jobs")

MAX_STEP_SECONDS = 1024


@dataclass
class _TaskSums:
    job_id: int
    rank: int
    attempt: int
    pid: int
    steps: int = 0
    last_step: int | None = None
    first_step_at: float | None = None
    step_seconds: list[float] = field(default_factory=list)
    tokens: int = 0
    busy_seconds: float = 0.0
    collective_seconds: float = 0.0
    exposed_seconds: float | None = None
    collectives: dict[str, list[float]] = field(default_factory=dict)
    memory_peak_bytes: int | None = None
    memory_source: str | None = None
    model: TaskModel | None = None
    failure: str | None = None
    failure_message: str = ""
    dropped_batches: int = 0
    pause: TaskPause | None = None  # the latest batch's: a pause that ended in the interval is over
    iterations: int = 0  # step ends after the previous step's end, and the wall time between them
    iteration_seconds: float = 0.0
    phases: dict[str, list[float]] = field(default_factory=dict)
    experts: ExpertLoad | None = None
    serving: ServingStats | None = None


class TaskRelay:
    """Sums SDK batches per task until the agent's next report takes them."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._tasks: dict[tuple[int, int, int], _TaskSums] = {}
        self._models: dict[tuple[int, int], TaskModel] = {}
        self._last_end: dict[tuple[int, int, int], float] = {}  # each task's newest step end, across reports
        self.run_queue = RunQueueMeter()
        self.batches_total = 0

    def add(self, batch: SdkBatch) -> None:
        key = (batch.job_id, batch.rank, batch.pid)
        with self._lock:
            self.batches_total += 1
            t = self._tasks.get(key)
            if t is None:
                t = self._tasks[key] = _TaskSums(batch.job_id, batch.rank, batch.attempt, batch.pid)
            if batch.steps:
                self._add_steps(key, t, batch.steps)
            for op, (count, seconds, nbytes) in batch.collectives.items():
                sums = t.collectives.setdefault(op, [0, 0.0, 0])
                sums[0] += count
                sums[1] += seconds
                sums[2] += nbytes
            if batch.memory_peak_bytes is not None:
                t.memory_peak_bytes = max(t.memory_peak_bytes or 0, batch.memory_peak_bytes)
                t.memory_source = batch.memory_source
            if batch.model is not None:
                self._models[(batch.job_id, batch.rank)] = batch.model
            t.model = self._models.get((batch.job_id, batch.rank))
            if batch.failure is not None:
                t.failure, t.failure_message = batch.failure.type, batch.failure.message
            t.dropped_batches = max(t.dropped_batches, batch.dropped_batches)
            t.pause = batch.pause
            for name, (seconds, inside) in batch.phases.items():
                sums_ = t.phases.setdefault(name, [0.0, 0.0])
                sums_[0] += seconds
                sums_[1] += inside
            if batch.experts is not None:
                e = t.experts
                t.experts = batch.experts if e is None else ExpertLoad(
                    imbalance=max(e.imbalance, batch.experts.imbalance),
                    routed_tokens=e.routed_tokens + batch.experts.routed_tokens,
                    dropped_tokens=e.dropped_tokens + batch.experts.dropped_tokens)
            if batch.serving is not None:
                t.serving = batch.serving if t.serving is None else add_stats(t.serving, batch.serving)

    def _add_steps(self, key: tuple[int, int, int], t: _TaskSums,
                   steps: list[tuple[int, float, float, int | None, float, float | None]]) -> None:
        """Sum a batch's steps into `t`. Kept in locals through the loop (a batch carries ~100 steps a second, and
        attribute updates per step were most of the relay's CPU); each sum is added in the same order as before."""
        previous = self._last_end.get(key)
        iterations, iteration_seconds = t.iterations, t.iteration_seconds
        busy, tokens_sum, coll_sum, exposed_sum = t.busy_seconds, t.tokens, t.collective_seconds, t.exposed_seconds
        end = 0.0
        for _index, started, duration, tokens, coll, exposed in steps:
            end = started + duration
            if previous is not None and end > previous:
                iterations += 1
                iteration_seconds += end - previous
            previous = end
            busy += duration
            if tokens:
                tokens_sum += tokens
            coll_sum += coll
            if exposed is not None:
                exposed_sum = (exposed_sum or 0.0) + exposed
        if t.first_step_at is None:
            t.first_step_at = steps[0][1] + steps[0][2]
        self._last_end[key] = end
        t.iterations, t.iteration_seconds = iterations, iteration_seconds
        t.busy_seconds, t.tokens, t.collective_seconds, t.exposed_seconds = busy, tokens_sum, coll_sum, exposed_sum
        t.steps += len(steps)
        t.last_step = steps[-1][0]
        room = MAX_STEP_SECONDS - len(t.step_seconds)
        if room > 0:
            t.step_seconds.extend(step[2] for step in steps[:room])

    def pids(self) -> set[int]:
        with self._lock:
            return {pid for (_, _, pid) in self._tasks}

    def drain(self, device_memory: dict[int, int] | None = None) -> list[TaskTelemetry]:
        """This interval's sums, one per task; `device_memory` is per-pid memory seen by NVML or sim."""
        with self._lock:
            tasks, self._tasks = self._tasks, {}
            self._last_end = {key: at for key, at in self._last_end.items()  # a task quiet this interval keeps it
                              if key in tasks or os.path.exists(f"/proc/{key[2]}")}
        waits = self.run_queue.measure({t.pid for t in tasks.values()})
        out = []
        for t in tasks.values():
            out.append(TaskTelemetry(
                job_id=t.job_id, rank=t.rank, attempt=t.attempt, pid=t.pid, steps=t.steps, last_step=t.last_step,
                first_step_at=t.first_step_at,
                step_seconds=t.step_seconds, tokens=t.tokens, busy_seconds=t.busy_seconds,
                collective_seconds=t.collective_seconds, exposed_collective_seconds=t.exposed_seconds,
                collectives={op: CollectiveTotals(count=int(c), seconds=s, bytes=int(b))
                             for op, (c, s, b) in t.collectives.items()},
                memory_peak_bytes=t.memory_peak_bytes, memory_source=t.memory_source,
                device_memory_bytes=(device_memory or {}).get(t.pid), model=t.model,
                failure={"type": t.failure, "message": t.failure_message} if t.failure else None,  # type: ignore[arg-type]
                dropped_batches=t.dropped_batches, pause=t.pause, iterations=t.iterations,
                iteration_seconds=t.iteration_seconds, phases={n: v[0] for n, v in t.phases.items()},
                phases_in_step_seconds=sum(v[1] for v in t.phases.values()), experts=t.experts,
                cpu_wait_ratio=waits.get(t.pid), serving=t.serving))
        return out


class RunQueueMeter:
    """Of the time a task's main thread was runnable, the share it waited for a CPU, between two readings of
    /proc/<pid>/task/<pid>/schedstat (ns on CPU, ns waiting on a run queue). CPU contention from another
    process shows here; a stopped process, or one blocked on I/O or a collective, does not wait on a run queue.
    The main thread is the one that drives the steps; helper threads (communication, the SDK's sender) wake
    often and briefly, and on a busy core their waits would blur the figure."""

    def __init__(self, proc_root: str = "/proc") -> None:
        self._root = proc_root
        self._last: dict[int, tuple[int, int]] = {}

    def read(self, pid: int) -> tuple[int, int] | None:
        try:
            fields = read_small(f"{self._root}/{pid}/task/{pid}/schedstat").split()
            return int(fields[0]), int(fields[1])
        except (OSError, ValueError, IndexError):
            return None

    def measure(self, pids: set[int]) -> dict[int, float]:
        out: dict[int, float] = {}
        for pid in pids:
            now = self.read(pid)
            before = self._last.get(pid)
            if now is None:
                continue
            self._last[pid] = now
            if before is not None:
                ran, waited = now[0] - before[0], now[1] - before[1]
                if ran >= 0 and waited >= 0 and ran + waited > 0:
                    out[pid] = round(waited / (ran + waited), 4)
        self._last = {pid: v for pid, v in self._last.items() if pid in pids}
        return out
