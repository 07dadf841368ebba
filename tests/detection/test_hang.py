"""The hang detector's limit is the rank's own cadence with a small floor, bounded below by the freshness of
the data, and it leaves alone a rank that is slow on purpose (a checkpoint pause, a slow step it has taken
before, warm-up). Real live views (Fleet, JobTelemetry) on a fake clock; pauses go through the real SDK and
the agent's real TaskRelay."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable

import numpy as np
import pytest

import sentinel.sdk
from collectors.jobs import TaskRelay
from sentinel.detection.detectors.hang import HungTask, freshness_seconds
from sentinel.incidents.findings import Finding
from sentinel.sdk import Telemetry
from sentinel.sdk.checkpoint import CheckpointManager
from sentinel.telemetry.schemas import SdkBatch, TaskTelemetry
from tests.detection.streams import World


def job_world(ranks: int = 2, interval: float = 1.0, **settings: float) -> tuple[World, HungTask]:
    world = World()
    for key, value in settings.items():
        setattr(world.settings, key, value)
    uuids = world.add_node("node-h", accelerators=ranks)
    live = world.fleet.get("node-h")
    assert live is not None
    live.interval_seconds = interval
    for rank in range(ranks):
        world.place(1, rank, "node-h", [uuids[rank]])
    return world, HungTask(world.settings)


def run_job(world: World, detector: HungTask, seconds: float, steps: Callable[[float, int], list[float]],
            interval: float = 1.0, evaluate_every: float = 0.25) -> list[tuple[float, Finding]]:
    """Every `interval` the node reports: rank r's steps are `steps(t, r)`. The detector is evaluated every
    `evaluate_every` s (finer than the engine's round, to see the limit itself). Returns (t, finding) fired."""
    fired: list[tuple[float, Finding]] = []
    t = 0.0
    live = world.fleet.get("node-h")
    assert live is not None
    while t < seconds - 1e-9:
        world.advance(evaluate_every)
        t += evaluate_every
        if abs(t / interval - round(t / interval)) < 1e-9:
            live.last_seen = world.now
            for rank in range(2):
                if steps(t, rank):  # a rank with nothing to say sends no batch (as the SDK does)
                    world.steps("node-h", 1, rank, steps(t, rank))
        fired += [(t, f) for f in world.evaluate(detector).findings]
    return fired


def test_a_steady_job_that_stops_is_flagged_within_its_own_limit():
    """0.1 s steps reported every second: its cadence allows 10 × 0.1 = 1 s, the data's freshness 1.25 × 1 s +
    the SDK's 1 s flush = 2.25 s. Both ranks stop at t=60 (the report at 60 is the last with steps)."""
    world, detector = job_world()
    fired = run_job(world, detector, 70.0, lambda t, r: [0.1] * 10 if t <= 60 else [])
    assert fired, "a job that stopped stepping is hung"
    first_at, finding = fired[0]
    assert finding.evidence["stalled_ranks"][0]["limit_seconds"] == pytest.approx(freshness_seconds(1.0)) == 2.25
    assert 60 + 2.25 < first_at <= 60 + 2.25 + 0.25, "flagged at the first evaluation past the limit"
    assert first_at - 60 < 5.0, "sooner than the old fixed 5 s floor"
    assert all(at > 60 for at, _ in fired), "never while it stepped"


def test_the_limit_scales_with_the_rank_cadence():
    """1 s steps reported every 10 s: 10 × its step = 10 s, but a report interval of 10 s makes the data up to
    13.5 s stale; 5 s steps reported every second: 10 × 5 s = 50 s."""
    world, detector = job_world(interval=10.0)
    fired = run_job(world, detector, 200.0, lambda t, r: [1.0] * 10 if t <= 100 else [], interval=10.0,
                    evaluate_every=0.5)
    assert fired[0][1].evidence["stalled_ranks"][0]["limit_seconds"] == pytest.approx(13.5)
    assert 113.5 < fired[0][0] <= 114.0

    world, detector = job_world()
    slow = run_job(world, detector, 200.0, lambda t, r: [5.0] if t <= 100 and t % 5 == 1 else [], evaluate_every=1.0)
    assert slow and all(at > 96 + 50 for at, _ in slow), "a 5 s/step job is not hung between its steps"
    assert slow[0][1].evidence["stalled_ranks"][0]["limit_seconds"] == pytest.approx(50.0, rel=0.05)


def test_time_between_steps_counts_in_the_cadence():
    """0.1 s inside each step but one step every 3 s (loading data outside `step()`): the limit is 10 × its
    3 s wall time per step, not 10 × 0.1 s, so it is not hung between steps."""
    world, detector = job_world()
    fired = run_job(world, detector, 300.0, lambda t, r: [0.1] if t <= 200 and t % 3 == 1 else [],
                    evaluate_every=0.5)
    assert fired and all(at > 199 + 25 for at, _ in fired)
    assert fired[0][1].evidence["stalled_ranks"][0]["limit_seconds"] == pytest.approx(30.0, rel=0.05)


def test_a_slow_step_it_has_taken_before_is_not_a_hang():
    """Steps of 0.1 s, and every 60 s one 8 s step (an evaluation inside the step). Once the rank has taken one
    in the window, 1.5 × its slowest recent step (12 s) covers the next."""
    world, detector = job_world()

    def steps(t: float, rank: int) -> list[float]:
        if t % 60 == 0:
            return [8.0]  # reported when it ends: the 8 s before it were silent
        return [] if t % 60 > 52 else [0.1] * 10

    fired = run_job(world, detector, 300.0, steps, evaluate_every=0.5)
    assert fired, "the first slow step, never seen before and not marked with pause(), looks like a hang"
    assert all(at <= 60 for at, _ in fired), f"after one, the slow steps are its cadence: {[a for a, _ in fired]}"


def test_warm_up_steps_are_judged_as_start_up():
    """A new attempt's first steps have no cadence yet (a 30 s compile, then a slow data loader start): until
    the fifth, the limit is hang_startup_seconds; from then on its cadence."""
    world, detector = job_world()
    fired = run_job(world, detector, 950.0, lambda t, r: [30.0] if t in (31, 300) else [0.5] if t == 120 else [],
                    evaluate_every=1.0)
    assert fired, "a rank silent for longer than hang_startup_seconds in its warm-up is hung"
    assert fired[0][0] > 300 + 600 - 1 and fired[0][1].evidence["stalled_ranks"][0]["limit_seconds"] == 600


# -- pauses: the real SDK `pause()`, through the agent's TaskRelay into the live view ---------------------------------

def relay_to_server(world: World, tels: list[Telemetry], relay: TaskRelay) -> list[TaskTelemetry]:
    for tel in tels:
        batch = tel.take_batch()
        if batch is not None:
            relay.add(SdkBatch.model_validate(batch))
    tasks = relay.drain()
    world.jobs.add("node-h", tasks, world.now)
    live = world.fleet.get("node-h")
    assert live is not None
    live.last_seen = world.now
    return tasks


def test_a_checkpoint_pause_is_not_a_hang_for_the_rank_or_its_peers():
    """Rank 0 saves a checkpoint for 100 s inside `pause()`; rank 1 waits for it in the next collective (no
    steps, no pause of its own). Neither is hung; once the pause ends they step again."""
    world, detector = job_world()
    tels = [Telemetry(job_id=1, rank=r, start_thread=False) for r in range(2)]
    for r, tel in enumerate(tels):
        tel.pid = 1000 + r  # the pids the world placed
    relay = TaskRelay()
    fired: list[Finding] = []
    pause = tels[0].pause("checkpoint")
    for t in range(1, 200):
        if t == 60:
            pause.__enter__()
        if t == 160:
            pause.__exit__(None, None, None)
        for r, tel in enumerate(tels):
            if t < 60 or t > 161 or (t == 161 and r == 0):
                for _ in range(10):
                    tel.record_step(0.1)
        world.advance(1.0)
        tasks = relay_to_server(world, tels, relay)
        if t == 100:
            [paused] = [task for task in tasks if task.rank == 0]
            assert paused.pause is not None and paused.pause.reason == "checkpoint"
        fired += world.evaluate(detector).findings
    assert fired == [], [f.title for f in fired]
    assert world.jobs.job(1).ranks[0].pause is None, "the pause ended"


def test_a_pause_longer_than_its_limit_is_a_hang():
    world, detector = job_world(hang_pause_seconds=120.0)
    tel = Telemetry(job_id=1, rank=0, start_thread=False)
    tel.pid = 1000
    relay = TaskRelay()
    fired: list[tuple[int, Finding]] = []
    with tel.pause("eval"):
        for t in range(1, 200):
            if t < 20:
                for _ in range(10):
                    tel.record_step(0.1)
            world.advance(1.0)
            relay_to_server(world, [tel], relay)
            fired += [(t, f) for f in world.evaluate(detector).findings]
    assert fired, "a pause is allowed hang_pause_seconds, not for ever"
    at, finding = fired[0]
    assert 120 < at <= 122 and "eval pause for 121s" in finding.seen and "hang_pause_seconds" in finding.seen


def test_checkpoint_manager_saves_are_marked_as_a_pause(tmp_path, monkeypatch):
    """While `save` waits for the save in flight (a slow write), the process's telemetry says it is paused."""
    tel = Telemetry(job_id=1, rank=0, start_thread=False)
    monkeypatch.setattr(sentinel.sdk, "_default", tel)
    ckpt = CheckpointManager(job_id=1, rank=0, node="node-h", local_dir=str(tmp_path / "{node}"), catalog=False,
                             write_bytes_per_second=4e6, when_busy="wait")
    state = {"w": np.ones(2_000_000, dtype=np.float32)}  # 8 MB at 4 MB/s: the first write takes ~2 s
    ckpt.save(1, state)
    second = threading.Thread(target=ckpt.save, args=(2, state))
    second.start()
    seen = []
    deadline = time.monotonic() + 10
    while second.is_alive() and time.monotonic() < deadline:
        batch = tel.take_batch()
        if batch is not None and "pause" in batch:
            seen.append(SdkBatch.model_validate(batch).pause)
        time.sleep(0.05)
    second.join()
    ckpt.close()
    assert seen and seen[0] is not None and seen[0].reason == "checkpoint"
    after = tel.take_batch()
    assert after is not None and "pause" not in after, "the batch after the save says the pause is over"
