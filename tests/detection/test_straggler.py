"""Straggler ranks from crafted step-time streams: true positives and the usual false-positive traps."""

from __future__ import annotations

import pytest

from tests.detection import scenarios
from tests.detection.streams import World, assert_dense, fired, run


def test_a_persistently_slow_rank_is_a_straggler_with_its_placement_and_numbers():
    world, _, stream = scenarios.straggler(seconds=120)
    found = fired(stream)
    assert found, "rank 2 steps 50% slower for two minutes"
    first_at, finding = found[0]
    # 20 post-warm-up steps by t=30 (the first 5 are warm-up), then 30 s of persistence
    assert first_at == 60
    assert {f.subject.rank for _, f in found} == {2}
    s = finding.subject
    assert (s.job_id, s.rank, s.node, s.accelerator) == (1, 2, "node-a", "GPU-node-a-2")
    assert finding.layer == "compute" and finding.severity == "warning"
    assert finding.key == "job=1|rank=2"
    assert "1.500 s" in finding.seen and "50% above the job median 1.000 s" in finding.seen
    assert "GPU-node-a-2" in finding.seen and "60 °C" in finding.seen
    assert "4 ranks" in finding.comparison and "rank 2 1.500 s" in finding.comparison
    assert finding.observed_at == world.now - 120 + 30
    assert finding.evidence["peers"]["job_median_seconds"] == pytest.approx(1.0)
    assert len(finding.evidence["window"]["values"]) == 50
    assert_dense(finding)
    assert stream[-1][1].subjects == 4


def test_a_throttling_accelerator_points_the_straggler_at_hardware():
    _, _, stream = scenarios.straggler(seconds=90, throttle=True)
    _, finding = fired(stream)[0]
    assert finding.layer == "hardware"
    assert "hw_thermal_slowdown" in finding.seen and "91 °C" in finding.seen
    assert any("airflow" in step for step in finding.next_steps)


def test_warm_up_steps_are_not_stragglers_even_after_a_restart():
    world = World()
    scenarios.training_job(world)
    detector = scenarios.StragglerDetector(world.settings)

    def tick(t: float) -> None:
        for rank in range(4):
            steps = [scenarios.jitter(rank, i) for i in range(10)]
            attempt = 1 if rank == 2 and t > 100 else 0
            if t == 10 or (rank == 2 and t == 110):
                steps[:5] = [40.0] * 5  # compilation after each start
            world.steps("node-a", 1, rank, steps, attempt=attempt)

    assert fired(run(world, detector, 300, tick)) == []


def test_one_slow_step_is_not_a_straggler():
    _, _, stream = scenarios.straggler(seconds=200, slow=lambda t: 1.0)
    assert fired(stream) == []
    world = World()
    scenarios.training_job(world)
    detector = scenarios.StragglerDetector(world.settings)

    def tick(t: float) -> None:
        for rank in range(4):
            steps = [scenarios.jitter(rank, i) for i in range(10)]
            if rank == 2 and t in (60, 120):
                steps[3] = 30.0  # a garbage collection pause, a checkpoint
            world.steps("node-a", 1, rank, steps)

    assert fired(run(world, detector, 200, tick)) == []


def test_a_job_that_slows_down_uniformly_has_no_straggler():
    world = World()
    scenarios.training_job(world)
    detector = scenarios.StragglerDetector(world.settings)

    def tick(t: float) -> None:
        for rank in range(4):
            world.steps("node-a", 1, rank, [scenarios.jitter(rank, i) * (2.0 if t > 60 else 1.0) for i in range(10)])

    stream = run(world, detector, 300, tick)
    assert fired(stream) == [] and stream[-1][1].subjects == 4


def test_a_slow_spell_shorter_than_persist_is_nothing():
    options = {"steps": 10, "min_steps": 10}  # the median follows the last report, to isolate persistence
    _, _, stream = scenarios.straggler(options, seconds=150, slow=lambda t: 1.5 if 60 < t <= 80 else 1.0)
    assert fired(stream) == []
    _, _, stream = scenarios.straggler(options, seconds=150, slow=lambda t: 1.5 if 60 < t <= 120 else 1.0)
    assert [at for at, _ in fired(stream)] == [100, 110, 120]


def test_single_rank_jobs_are_skipped():
    world = World()
    scenarios.training_job(world, ranks=1)
    detector = scenarios.StragglerDetector(world.settings)
    stream = run(world, detector, 100, lambda t: world.steps("node-a", 1, 0, [5.0] * 10))
    assert fired(stream) == [] and stream[-1][1].subjects == 0


def test_two_ranks_compare_against_the_faster_one():
    world = World()
    scenarios.training_job(world, ranks=2)
    detector = scenarios.StragglerDetector(world.settings)

    def tick(t: float) -> None:
        world.steps("node-a", 1, 0, [1.0] * 10)
        world.steps("node-a", 1, 1, [1.4] * 10)

    found = fired(run(world, detector, 100, tick))
    assert found and {f.subject.rank for _, f in found} == {1}
