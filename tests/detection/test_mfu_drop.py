"""MFU drop against the job's own baseline, on crafted 40-minute streams."""

from __future__ import annotations

import pytest

from tests.detection import scenarios
from tests.detection.streams import World, assert_dense, fired

DROP_AT = 35 * 60


def test_a_sustained_drop_fires_after_persist_with_the_baseline_and_the_drop():
    world, detector, stream = scenarios.mfu_drop()
    found = fired(stream)
    assert found, "steps 1.5× longer for the same tokens for five minutes"
    first_at, finding = found[0]
    # the 60 s window is 20% down after 3 slow reports (t+30), then 60 s of persistence
    assert DROP_AT + 30 < first_at <= DROP_AT + 100
    assert finding.subject.job_id == 7 and finding.subject.rank is None
    assert finding.layer == "compute" and finding.key == "job=7"
    # two ranks × 4096 tokens/s × 6e9 FLOPs/token ÷ (2 × 1e14): 24.6% before, 16.4% at 1.5× step time
    assert finding.evidence["baseline"]["mfu"] == pytest.approx(0.2458, abs=0.002)
    assert finding.evidence["recent"]["mfu"] == pytest.approx(0.1638, abs=0.002)
    assert "MFU 16.4%" in finding.seen and "24.6% before" in finding.seen and "33% lower" in finding.seen
    assert "step time 1.000 → 1.500 s" in finding.seen
    assert "the job's own baseline" in finding.comparison and "over the previous 30 min" in finding.comparison
    assert finding.observed_at is not None and finding.observed_at <= world.now - (40 * 60 - first_at) - 60
    window = finding.evidence["window"]
    assert window["metric"] == "mfu" and min(window["values"]) < 0.17 < max(window["values"])
    assert_dense(finding)
    assert stream[-1][1].subjects == 1
    assert detector.active == {"mfu_drop|job=7"}


def test_all_reduce_rising_with_the_drop_points_at_the_interconnect():
    _, _, stream = scenarios.mfu_drop(share_after=0.47)
    _, finding = fired(stream)[0]
    assert finding.layer == "interconnect"
    assert "all-reduce share 20% → 47%" in finding.seen
    assert "ibstat" in finding.next_steps[0]


def test_fewer_tokens_per_step_points_at_the_input_pipeline():
    world = World()
    scenarios.training_job(world, job_id=7, ranks=2)
    stream = scenarios.mfu_job(world, 40 * 60, lambda t: 1.0, tokens=lambda t: 2048 if t > DROP_AT else 4096)
    _, finding = fired(stream)[0]
    assert finding.layer == "input_pipeline" and "tokens/step 4,096 → 2,048" in finding.seen


def test_a_dip_shorter_than_persist_is_nothing():
    options = {"recent_seconds": 20}  # a short window, so the dip itself (not the window's tail) is judged
    _, _, stream = scenarios.mfu_drop(options, slow=2.0, seconds=40 * 60)
    assert fired(stream), "control: the same drop, sustained, fires"
    world = World({"mfu_drop": options})
    scenarios.training_job(world, job_id=7, ranks=2)
    stream = scenarios.mfu_job(world, 40 * 60, lambda t: 2.0 if DROP_AT < t <= DROP_AT + 30 else 1.0)
    assert fired(stream) == []


def test_no_verdict_without_five_minutes_of_steady_history():
    # slower after two minutes: by the time five minutes are recorded, the "baseline" holds both paces
    _, _, stream = scenarios.mfu_drop(drop_at=2 * 60, seconds=15 * 60)
    assert fired(stream) == []
    _, _, stream = scenarios.mfu_drop(drop_at=4 * 60, seconds=6 * 60)
    assert fired(stream) == []


def test_warm_up_after_a_restart_is_not_a_drop():
    world = World()
    scenarios.training_job(world, job_id=7, ranks=2)
    stream = scenarios.mfu_job(world, 40 * 60, lambda t: 1.0, attempt=lambda t: 1 if t > DROP_AT else 0)
    assert fired(stream) == []
    # while the new attempt warms up the job is not judged at all
    assert [ev.subjects for at, ev in stream if DROP_AT < at <= DROP_AT + 10] == [0]


def test_without_a_known_peak_throughput_stands_in_for_mfu():
    world = World()
    scenarios.training_job(world, job_id=7, ranks=2)
    detector = scenarios.MfuDropDetector(world.settings)

    def tick(t: float) -> None:
        for rank in range(2):
            world.steps("node-a", 7, rank, [1.5 if t > DROP_AT else 1.0] * 10, peak_flops=None)

    _, finding = fired(scenarios.run(world, detector, 40 * 60, tick))[0]
    assert finding.evidence["window"]["metric"] == "tokens_per_second_per_rank"
    assert "tokens/s per rank 2,731" in finding.seen and "4,096" in finding.seen
