"""Scenarios for the engine_fault detector: serving jobs whose engines' fault-tolerance status (as the agent reads
it from `GET /fault_tolerance/status`) says an engine core failed and waits for an instruction."""

from __future__ import annotations

from sentinel.detection.detectors.engine_fault import EngineFault
from sentinel.telemetry.serving import EngineRankState, FaultToleranceStatus, ServingStats
from tests.detection.scenarios import Outcome
from tests.detection.streams import World, run

NODE = "node-s"


def ft_stats(world: World, replica: str, rank: int, state: str = "healthy", error: str = "") -> ServingStats:
    """One interval of an engine target: no requests counted, only the engine's fault-tolerance status."""
    return ServingStats(source="vllm", replica=replica, fault_tolerance=FaultToleranceStatus(
        at=world.now - 0.2, engines=[EngineRankState(rank=rank, state=state,  # type: ignore[arg-type]
                                                     fault="RuntimeError" if state != "healthy" else "",
                                                     error=error)]))


def serving_world(jobs: tuple[int, ...] = (9,), ranks: int = 2) -> World:
    """`jobs` on one node, each with `ranks` DP ranks (replicas r0, r1, …), each rank on its own accelerator."""
    world = World()
    uuids = world.add_node(NODE, accelerators=len(jobs) * ranks)
    for j, job_id in enumerate(jobs):
        for rank in range(ranks):
            world.place(job_id, rank, NODE, [uuids[j * ranks + rank]])
    return world


def engine_fault(jobs: tuple[int, ...] = (9,), fail_at: float = 60.0, seconds: float = 90.0,
                 fixed_at: float | None = None, failing_rank: int = 1, state: str = "unhealthy") -> Outcome:
    """Each job's replicas report their engine's status every 10 s; from `fail_at` the engine core of rank
    `failing_rank` of every job in `jobs` says `state` (waiting for an instruction), until `fixed_at`."""
    world = serving_world(jobs)
    detector = EngineFault(world.settings)

    def tick(t: float) -> None:
        bad = t >= fail_at and (fixed_at is None or t < fixed_at)
        for job_id in jobs:
            for rank in range(2):
                failed = bad and rank == failing_rank
                world.serving.add(NODE, job_id, rank, ft_stats(world, f"r{rank}", rank,
                                                               state if failed else "healthy"), world.now)

    return world, detector, run(world, detector, seconds, tick)
