"""Pieces the statistical detectors share: placements indexed once per evaluation (so no lookup walks
the fleet), when each condition started to hold, a job's own past as its baseline, and compact
evidence windows."""

from __future__ import annotations

import math
import statistics
from collections import deque
from dataclasses import dataclass
from typing import Any

from sentinel.detection.base import DetectionContext

EVIDENCE_POINTS = 60  # a finding's window is never longer than this


def is_application(ctx: DetectionContext, kind: str, xid: int | None) -> bool:
    """Is this fault normally caused by the running program (the catalog's origin), not the accelerator?
    Such faults restart the task; they never make a lemon nor drain a node without corroboration."""
    return kind == "xid" and xid is not None and ctx.catalog.xids.get(xid, ctx.catalog.default_xid).application


@dataclass
class Placements:
    """Where things are, indexed once per evaluation: O(accelerators + tasks) to build, O(1) to ask."""

    node_of: dict[str, str]  # accelerator uuid → node name
    accelerators_of: dict[str, list[str]]  # node name → accelerator uuids
    ranks_of: dict[int, dict[int, tuple[str | None, list[str]]]]  # job → rank → (node, accelerator uuids)
    task_on: dict[str, tuple[int, int]]  # accelerator uuid → (job, rank) placed on it

    @classmethod
    def of(cls, ctx: DetectionContext) -> Placements:
        node_of: dict[str, str] = {}
        accelerators_of: dict[str, list[str]] = {}
        names: dict[int, str] = {}
        for live in ctx.fleet.all():
            names[live.id] = live.name
            uuids = sorted(live.accelerators)
            accelerators_of[live.name] = uuids
            for uuid in uuids:
                node_of[uuid] = live.name
        ranks_of: dict[int, dict[int, tuple[str | None, list[str]]]] = {}
        task_on: dict[str, tuple[int, int]] = {}
        for node_id, tasks in ctx.assignments().items():
            for task in tasks:
                ranks_of.setdefault(task.job_id, {})[task.rank] = (names.get(node_id), list(task.accelerators))
                for uuid in task.accelerators:
                    task_on[uuid] = (task.job_id, task.rank)
        return cls(node_of, accelerators_of, ranks_of, task_on)

    def rank(self, job_id: int, rank: int) -> tuple[str | None, list[str]]:
        return self.ranks_of.get(job_id, {}).get(rank, (None, []))

    def accelerators_by_rank(self, job_id: int) -> dict[int, list[str]]:
        return {rank: uuids for rank, (_, uuids) in self.ranks_of.get(job_id, {}).items()}


class Onsets:
    """When each condition started to hold. A condition that stops holding is forgotten at once, so a
    dip that clears and comes back starts its persistence clock again."""

    def __init__(self) -> None:
        self._since: dict[str, float] = {}
        self._held: set[str] = set()

    def hold(self, key: str, now: float) -> float:
        """The condition `key` holds now; returns since when it has held without a break."""
        self._held.add(key)
        return self._since.setdefault(key, now)

    def holding(self, key: str) -> bool:
        return key in self._since

    def sweep(self) -> None:
        """End of an evaluation: forget what did not hold in it."""
        for key in [k for k in self._since if k not in self._held]:
            del self._since[key]
        self._held = set()


@dataclass(frozen=True)
class Baseline:
    """A job's usual value: the median of its normal points, their MAD (a wide one means the job was
    not steady, so there is nothing to compare with) and how many points there were."""

    median: float
    mad: float
    points: int

    def steady(self, min_points: int, max_mad: float) -> bool:
        return self.points >= min_points and self.mad <= max_mad


class JobBaseline:
    """A job's own recent past: one point every `sample_seconds`, kept for `keep_seconds`. Points taken
    while the condition held are kept for the evidence window but never enter the baseline, so a lasting
    drop is not averaged into the normal it is compared with."""

    def __init__(self, sample_seconds: float, keep_seconds: float):
        self.sample_seconds = sample_seconds
        self.keep_seconds = keep_seconds
        self.points: deque[tuple[float, dict[str, float], bool]] = deque()

    def record(self, now: float, values: dict[str, float], *, held: bool) -> bool:
        """Take a point if the last one is `sample_seconds` old; True when it did."""
        if self.points and now - self.points[-1][0] < self.sample_seconds:
            return False
        self.points.append((now, values, held))
        while self.points and self.points[0][0] < now - self.keep_seconds:
            self.points.popleft()
        return True

    def baseline(self, name: str, since: float, until: float) -> Baseline | None:
        """Median, spread and size of `name` over the normal points taken in [since, until]."""
        values = [v[name] for at, v, held in self.points if since <= at <= until and not held and name in v]
        if not values:
            return None
        median = statistics.median(values)
        return Baseline(median, statistics.median(abs(v - median) for v in values), len(values))

    def window(self, name: str, now: float, scale: float = 1.0) -> dict[str, Any]:
        times = [at - now for at, v, _ in self.points if name in v]
        values = [v[name] * scale for _, v, _ in self.points if name in v]
        return evidence_window(name, times, values)


def evidence_window(metric: str, times: list[float], values: list[float], digits: int = 4) -> dict[str, Any]:
    """A bounded window for a finding's evidence: at most EVIDENCE_POINTS points (the newest when there
    are more), times as seconds relative to now (negative: in the past)."""
    times, values = times[-EVIDENCE_POINTS:], values[-EVIDENCE_POINTS:]
    return {"metric": metric, "times": [round(t, 1) for t in times],
            "values": [None if math.isnan(v) else round(v, digits) for v in values]}


def gib(value: float) -> str:
    return f"{value / 2**30:.1f} GiB"


def minutes(seconds: float) -> str:
    return f"{seconds / 60:.0f} min" if seconds >= 120 else f"{seconds:.0f} s"


def prune(state: dict[Any, Any], seen: set[Any]) -> None:
    """Forget the state of subjects not seen in this evaluation (replaced, stopped, silent)."""
    for key in [k for k in state if k not in seen]:
        del state[key]

