"""One true-positive stream per detector, shared by the detector's own tests and the feedback test."""

from __future__ import annotations

from collections.abc import Callable

from sentinel.detection.base import Detector, Evaluation
from sentinel.detection.detectors.allreduce_spike import AllreduceSpikeDetector
from sentinel.detection.detectors.checkpoint_stale import CheckpointStaleDetector
from sentinel.detection.detectors.lemon import LemonDetector
from sentinel.detection.detectors.memory import MemoryDetector
from sentinel.detection.detectors.mfu_drop import MfuDropDetector
from sentinel.detection.detectors.straggler import StragglerDetector
from sentinel.detection.detectors.throttle import ThrottleDetector
from tests.detection.streams import GiB, World, run

Stream = list[tuple[float, Evaluation]]
Outcome = tuple[World, Detector, Stream]


def jitter(rank: int, i: int) -> float:
    """Deterministic noise of ±2% so ranks are never identical."""
    return 1.0 + 0.01 * (((rank * 7 + i * 3) % 5) - 2)


def training_job(world: World, job_id: int = 1, ranks: int = 4, node: str = "node-a") -> list[str]:
    uuids = world.add_node(node, accelerators=ranks)
    for rank in range(ranks):
        world.place(job_id, rank, node, [uuids[rank]])
    return uuids


def straggler(options: dict[str, float] | None = None, seconds: float = 120.0,
              slow: Callable[[float], float] = lambda t: 1.5, throttle: bool = False) -> Outcome:
    """Four ranks stepping ~1 s; rank 2 steps `slow(t)` times slower all along."""
    world = World({"straggler": options or {}})
    uuids = training_job(world)
    detector = StragglerDetector(world.settings)

    def tick(t: float) -> None:
        for rank in range(4):
            factor = slow(t) if rank == 2 else 1.0
            world.steps("node-a", 1, rank, [jitter(rank, i) * factor for i in range(10)])
            world.sample(uuids[rank], temperature=91.0 if throttle and rank == 2 else 60.0,
                         throttle=("hw_thermal_slowdown",) if throttle and rank == 2 else ())

    return world, detector, run(world, detector, seconds, tick)


def mfu_job(world: World, seconds: float, step: Callable[[float], float],
            share: Callable[[float], float] = lambda t: 0.2, tokens: Callable[[float], int] = lambda t: 4096,
            detector: Detector | None = None, attempt: Callable[[float], int] = lambda t: 0) -> Stream:
    """Two ranks, ten steps of `step(t)` seconds per report; a new attempt starts with 30 s compile steps."""
    detector = detector or MfuDropDetector(world.settings)
    started: dict[int, int] = {}

    def tick(t: float) -> None:
        for rank in range(2):
            durations = [step(t) * jitter(rank, i) for i in range(10)]
            if started.get(rank) != attempt(t):
                started[rank] = attempt(t)
                durations[:5] = [30.0] * 5  # warm-up: compilation, caches, data loader start
            world.steps("node-a", 7, rank, durations, tokens_per_step=tokens(t), collective_share=share(t),
                        attempt=attempt(t))

    return run(world, detector, seconds, tick)


def mfu_drop(options: dict[str, float] | None = None, drop_at: float = 35 * 60, seconds: float = 40 * 60,
             slow: float = 1.5, share_after: float = 0.2) -> Outcome:
    """35 steady minutes, then steps `slow` times longer for the same tokens."""
    world = World({"mfu_drop": options or {}})
    training_job(world, job_id=7, ranks=2)
    detector = MfuDropDetector(world.settings)
    stream = mfu_job(world, seconds, lambda t: slow if t > drop_at else 1.0,
                     share=lambda t: share_after if t > drop_at else 0.2, detector=detector)
    return world, detector, stream


def allreduce_spike(before: float = 0.15, after: dict[int, float] | None = None,
                    spike_at: float = 35 * 60, seconds: float = 38 * 60, spike_for: float = 3600.0,
                    options: dict[str, float] | None = None) -> Outcome:
    """Four ranks at all-reduce share `before`; for `spike_for` from `spike_at`, each rank at `after[rank]`."""
    after = after if after is not None else {0: 0.40, 1: 0.60, 2: 0.40, 3: 0.55}
    world = World({"allreduce_spike": options or {}})
    training_job(world, job_id=3, ranks=4)
    detector = AllreduceSpikeDetector(world.settings)

    def tick(t: float) -> None:
        for rank in range(4):
            share = after[rank] if spike_at < t <= spike_at + spike_for else before
            step = 0.85 / (1 - share)  # the same compute, more time waiting in collectives
            world.steps("node-a", 3, rank, [step * jitter(rank, i) for i in range(10)], collective_share=share)

    return world, detector, run(world, detector, seconds, tick)


def throttle(pattern: list[bool] | None = None, reasons: tuple[str, ...] = ("hw_thermal_slowdown",),
             options: dict[str, float] | None = None) -> Outcome:
    """Two accelerators sampled every 10 s; GPU 0 throttles where `pattern` says so."""
    pattern = pattern if pattern is not None else [False] * 4 + [True] * 8
    world = World({"throttle": options or {}})
    uuids = world.add_node("node-t", accelerators=2)
    detector = ThrottleDetector(world.settings)

    def tick(t: float) -> None:
        hot = pattern[min(int(t // 10) - 1, len(pattern) - 1)]
        world.sample(uuids[0], temperature=92.0 if hot else 65.0, power=380.0 if hot else 520.0,
                     clock_hz=1.1e9 if hot else 1.98e9, throttle=reasons if hot else ())
        world.sample(uuids[1], temperature=64.0)

    return world, detector, run(world, detector, 10.0 * len(pattern), tick)


def memory(used: Callable[[int], float], samples: int = 40, place: bool = True) -> Outcome:
    """GPU 0 of a node reports `used(i)` bytes at sample i (every 10 s); GPU 1 sits at 20 GiB."""
    world = World()
    uuids = world.add_node("node-m", accelerators=2)
    if place:
        world.place(5, 0, "node-m", [uuids[0]])
        world.place(5, 1, "node-m", [uuids[1]])
    detector = MemoryDetector(world.settings)

    def tick(t: float) -> None:
        world.sample(uuids[0], used_bytes=used(int(t // 10) - 1))
        world.sample(uuids[1], used_bytes=20 * GiB)

    return world, detector, run(world, detector, 10.0 * samples, tick)


def leak() -> Outcome:
    """30 GiB growing 0.5 GiB every 10 s: full in about 13 minutes once the window is long enough."""
    return memory(lambda i: 30 * GiB + i * 0.5 * GiB, samples=30)


def lemon() -> Outcome:
    """Four nodes of eight; one accelerator with three XID 48 episodes this week."""
    world = World()
    for name in ("node-0", "node-1", "node-2", "node-3"):
        world.add_node(name)
    world.fault("node-1", "GPU-node-1-3", days_ago=5.0)
    world.fault("node-1", "GPU-node-1-3", days_ago=3.0, kind="ecc", xid=None)
    world.fault("node-1", "GPU-node-1-3", days_ago=1.0, xid=48)
    world.fault("node-2", "GPU-node-2-0", days_ago=2.0, xid=79)  # the rest of the fleet: one fault
    detector = LemonDetector(world.settings)
    return world, detector, [(0.0, world.evaluate(detector))]


def checkpoint_stale(stop_at: float = 300.0, seconds: float = 900.0, stepping: Callable[[float], bool] = lambda t: True,
                     resume_at: float | None = None) -> Outcome:
    """Two ranks stepping ~1 s and committing a checkpoint every 60 s; from `stop_at` rank 1's saves stop
    registering (rank 0's still do), until `resume_at`."""
    world = World()
    training_job(world, ranks=2)
    detector = CheckpointStaleDetector(world.settings)

    def tick(t: float) -> None:
        if stepping(t):
            for rank in range(2):
                world.steps("node-a", 1, rank, [jitter(rank, i) for i in range(10)])
        if t % 60 == 0:
            failing = stop_at <= t and (resume_at is None or t < resume_at)
            step = int(t)
            world.checkpoints.shard(1, step, 0, world_size=2, committed=False, at=world.now)
            if not failing:
                world.checkpoints.shard(1, step, 1, world_size=2, committed=True, at=world.now)

    return world, detector, run(world, detector, seconds, tick)
