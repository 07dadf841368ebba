"""The slowdown detector's streams for the Detector contract and its own tests: two-rank jobs stepping at a
known decomposition, one component growing from `onset` on one rank (or every rank), optionally clearing."""

from __future__ import annotations

from collections.abc import Callable

from sentinel.detection.detectors.slowdown import SlowdownDetector
from tests.detection.scenarios import Outcome, jitter
from tests.detection.streams import World, run

BASE = {"compute": 0.10, "communication": 0.02, "data_wait": 0.004, "checkpoint": 0.002, "host": 0.003,
        "idle": 0.001}
INTERVAL = 2.0  # one agent report per rank every 2 s, 10 steps each


def slowdown(cause: str = "data_wait", extra: float = 0.08, jobs: tuple[int, ...] = (7,), onset: float = 50.0,
             until: Callable[[float], bool] = lambda t: True, seconds: float = 70.0, on_ranks: tuple[int, ...] = (1,),
             cpu_wait: float | None = None, throttle: bool = False, ranks: int = 2) -> Outcome:
    """Jobs of `ranks` ranks on node-<job>; from `onset` while `until(t)`, `cause` grows by `extra` s per step on
    `on_ranks` (communication: on every rank). A synchronous job: the other ranks wait in communication for a
    rank whose compute or data grew. `cpu_wait`: the slowed ranks' run-queue wait meanwhile; `throttle`: their
    accelerator reports thermal slowdown meanwhile."""
    world = World()
    uuids: dict[int, list[str]] = {}
    for job in jobs:
        uuids[job] = world.add_node(f"node-{job}", accelerators=ranks)
        for rank in range(ranks):
            world.place(job, rank, f"node-{job}", [uuids[job][rank]])

    def tick(t: float) -> None:
        slow = onset <= t and until(t)
        for job in jobs:
            for rank in range(ranks):
                parts = {k: v * jitter(rank, int(t)) for k, v in BASE.items()}
                if slow and cause == "communication":
                    parts["communication"] += extra
                elif slow and rank in on_ranks:
                    parts[cause] += extra
                elif slow:  # the others wait for the slow rank inside the all-reduce
                    parts["communication"] += extra
                hot = slow and throttle and rank in on_ranks
                world.sample(uuids[job][rank], throttle=("hw_thermal_slowdown",) if hot else (),
                             clock_hz=1.2e9 if hot else 1.98e9, temperature=90.0 if hot else 60.0)
                world.decomposed(f"node-{job}", job, rank, 10, cpu_wait=cpu_wait if slow and rank in on_ranks
                                 else 0.02, **parts)

    return world, (detector := SlowdownDetector(world.settings)), run(world, detector, seconds, tick, INTERVAL)


def two_jobs() -> Outcome:
    return slowdown(jobs=(7, 8))


def clears() -> Outcome:
    return slowdown(until=lambda t: t < 70.0, seconds=100.0)
