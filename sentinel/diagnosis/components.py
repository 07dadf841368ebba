"""Step-time decomposition: where each rank's wall time per step goes, from the SDK's timings relayed by agents.

Per rank and window, per step (seconds):

| component       | from                                                                  | layer          |
| --------------- | --------------------------------------------------------------------- | -------------- |
| `compute`       | time inside `step()` less exposed communication and phases timed in it | compute        |
| `communication` | exposed (non-overlapped) collective time, all-to-all excluded          | interconnect   |
| `all_to_all`    | MoE dispatch / combine collectives (`collective("all_to_all")`)        | interconnect   |
| `data_wait`     | the loop waiting for its next batch (`Telemetry.data`)                 | input_pipeline |
| `checkpoint`    | checkpoint saves the loop waited for (`pause("checkpoint")`)           | checkpoint_io  |
| `host`          | optimizer / Python the job timed (`phase("host")`)                     | host           |
| `idle`          | the rest of the wall time between steps, timed by nothing              | host           |

The iteration (wall time from one step's end to the next's) is what throughput follows; the components add
up to it. Kept in memory per rank over a short window, like the job views (sentinel/live/jobs.py).
"""

from __future__ import annotations

import threading
from collections import deque
from dataclasses import dataclass, field

from sentinel.telemetry.schemas import TaskTelemetry

COMPONENTS = ("compute", "communication", "all_to_all", "data_wait", "checkpoint", "host", "idle")
LAYER_OF = {"compute": "compute", "communication": "interconnect", "all_to_all": "interconnect",
            "data_wait": "input_pipeline", "checkpoint": "checkpoint_io", "host": "host", "idle": "host"}
KNOWN_PHASES = {"data_wait", "checkpoint", "host", "all_to_all"}
WINDOW_SECONDS = 600.0


@dataclass
class _Sample:
    at: float
    attempt: int
    steps: int
    iterations: int
    iteration_seconds: float
    busy: float
    exposed: float
    phases: dict[str, float]
    in_step: float
    tokens: int
    cpu_wait: float | None
    imbalance: float | None
    dropped: int
    routed: int


@dataclass
class RankProfile:
    """One rank over a window: seconds per step of each component, and what else was measured."""

    rank: int
    node: str
    steps: int
    iteration: float  # wall seconds per step
    components: dict[str, float]
    tokens_per_second: float | None
    cpu_wait: float | None  # mean over the window's readings
    imbalance: float | None  # MoE max ÷ mean tokens per expert (worst in the window)
    dropped_ratio: float | None

    def share(self, component: str) -> float:
        return self.components.get(component, 0.0) / self.iteration if self.iteration > 0 else 0.0


@dataclass
class _Rank:
    node: str = ""
    attempt: int = 0
    samples: deque[_Sample] = field(default_factory=deque)


class ComponentStore:
    """Thread-safe: ingest adds, the diagnosis engine and the API read."""

    def __init__(self, window_seconds: float = WINDOW_SECONDS):
        self.window_seconds = window_seconds
        self._jobs: dict[int, dict[int, _Rank]] = {}
        self._lock = threading.Lock()

    def add(self, node: str, tasks: list[TaskTelemetry], now: float) -> None:
        for task in tasks:
            if task.steps == 0 and not task.phases:
                continue
            other = sum(v for k, v in task.phases.items() if k not in KNOWN_PHASES and k != "all_to_all")
            phases = {k: v for k, v in task.phases.items() if k in KNOWN_PHASES}
            if other:  # a phase of the job's own (evaluation, ...) is host time the job named
                phases["host"] = phases.get("host", 0.0) + other
            experts = task.experts
            sample = _Sample(now, task.attempt, task.steps, task.iterations, task.iteration_seconds,
                             task.busy_seconds,
                             task.exposed_collective_seconds if task.exposed_collective_seconds is not None
                             else task.collective_seconds, phases, task.phases_in_step_seconds, task.tokens,
                             task.cpu_wait_ratio, experts.imbalance if experts else None,
                             experts.dropped_tokens if experts else 0, experts.routed_tokens if experts else 0)
            with self._lock:
                rank = self._jobs.setdefault(task.job_id, {}).setdefault(task.rank, _Rank())
                if task.attempt != rank.attempt:  # a new attempt starts afresh
                    rank.samples.clear()
                rank.node, rank.attempt = node, task.attempt
                rank.samples.append(sample)
                while rank.samples and rank.samples[0].at < now - self.window_seconds:
                    rank.samples.popleft()

    def forget(self, job_id: int) -> None:
        with self._lock:
            self._jobs.pop(job_id, None)

    def job_ids(self) -> list[int]:
        with self._lock:
            return sorted(self._jobs)

    def attempts(self, job_id: int) -> dict[int, int]:
        with self._lock:
            return {r: rank.attempt for r, rank in self._jobs.get(job_id, {}).items()}

    def newest(self, job_id: int) -> float | None:
        with self._lock:
            ranks = self._jobs.get(job_id, {})
            return max((r.samples[-1].at for r in ranks.values() if r.samples), default=None)

    def first_seen(self, job_id: int) -> float | None:
        with self._lock:
            ranks = self._jobs.get(job_id, {})
            return min((r.samples[0].at for r in ranks.values() if r.samples), default=None)

    def profile(self, job_id: int, since: float, until: float) -> dict[int, RankProfile]:
        """Per rank, its decomposition over samples received in (since, until]; ranks with no iteration left out."""
        with self._lock:
            ranks = {r: (rank.node, [s for s in rank.samples if since < s.at <= until])
                     for r, rank in self._jobs.get(job_id, {}).items()}
        out = {}
        for r, (node, samples) in ranks.items():
            found = decompose(r, node, samples)
            if found is not None:
                out[r] = found
        return out

    def timeline(self, job_id: int, since: float, until: float, bucket: float) -> list[tuple[float, dict[int,
                                                                                                       RankProfile]]]:
        """The decomposition in consecutive buckets, oldest first (the job's execution timeline)."""
        out = []
        start = since
        while start < until:
            end = min(until, start + bucket)
            found = self.profile(job_id, start, end)
            if found:
                out.append((end, found))
            start = end
        return out


def decompose(rank: int, node: str, samples: list[_Sample]) -> RankProfile | None:
    steps = sum(s.steps for s in samples)
    iterations = sum(s.iterations for s in samples)
    if steps <= 0 or iterations <= 0:
        return None
    iteration = sum(s.iteration_seconds for s in samples) / iterations
    busy = sum(s.busy for s in samples) / steps
    phase_total = {name: sum(s.phases.get(name, 0.0) for s in samples) / steps for name in KNOWN_PHASES}
    in_step = sum(s.in_step for s in samples) / steps
    a2a = phase_total.get("all_to_all", 0.0)
    exposed = sum(s.exposed for s in samples) / steps
    communication = max(0.0, exposed - a2a)
    compute = max(0.0, busy - exposed - max(0.0, in_step - a2a))
    outside = sum(phase_total.values()) - in_step
    idle = max(0.0, iteration - busy - outside)
    components = {"compute": compute, "communication": communication, "all_to_all": a2a,
                  "data_wait": phase_total["data_wait"], "checkpoint": phase_total["checkpoint"],
                  "host": phase_total["host"], "idle": idle}
    waits = [s.cpu_wait for s in samples if s.cpu_wait is not None]
    imbalances = [s.imbalance for s in samples if s.imbalance is not None]
    routed = sum(s.routed for s in samples)
    wall = iteration * iterations
    tokens = sum(s.tokens for s in samples)
    return RankProfile(rank=rank, node=node, steps=steps, iteration=iteration, components=components,
                       tokens_per_second=tokens / wall if wall > 0 and tokens else None,
                       cpu_wait=sum(waits) / len(waits) if waits else None,
                       imbalance=max(imbalances) if imbalances else None,
                       dropped_ratio=sum(s.dropped for s in samples) / routed if routed else None)
