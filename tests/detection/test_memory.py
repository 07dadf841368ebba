"""Memory near capacity and likely leaks from crafted memory streams; a sawtooth is no leak."""

from __future__ import annotations

import pytest

from tests.detection import scenarios
from tests.detection.streams import GiB, assert_dense, fired


def test_memory_near_capacity_for_six_samples_is_an_oom_warning():
    world, _, stream = scenarios.memory(lambda i: 77 * GiB if i >= 4 else 40 * GiB, samples=12)
    found = fired(stream)
    assert [at for at, _ in found] == [100, 110, 120]
    _, finding = found[0]
    assert finding.key == "capacity|accelerator=GPU-node-m-0" and finding.layer == "compute"
    s = finding.subject
    assert (s.node, s.accelerator, s.job_id, s.rank) == ("node-m", "GPU-node-m-0", 5, 0)
    assert "77.0 GiB of 80.0 GiB (96%)" in finding.seen and "last 6 samples" in finding.seen
    assert "job 5's 2 accelerators now: median 20.0 GiB" not in finding.comparison  # one is at 77 GiB
    assert "job 5's 2 accelerators now" in finding.comparison
    assert finding.observed_at == world.now - 120 + 50
    assert_dense(finding)


def test_five_samples_near_capacity_then_relief_is_nothing():
    _, _, stream = scenarios.memory(lambda i: 77 * GiB if 4 <= i < 9 else 40 * GiB, samples=20)
    assert fired(stream) == []


def test_steady_growth_toward_capacity_is_a_likely_leak():
    world, _, stream = scenarios.leak()
    found = fired(stream)
    assert found and found[0][0] == 200  # the 20th sample: enough for a line
    _, finding = found[0]
    assert finding.key == "leak|accelerator=GPU-node-m-0" and finding.layer == "software"
    assert (finding.subject.job_id, finding.subject.rank) == (5, 0)
    assert finding.evidence["fit"]["slope_bytes_per_second"] == pytest.approx(0.05 * GiB, rel=1e-6)
    assert finding.evidence["fit"]["r2"] == pytest.approx(1.0)
    # 39.5 GiB at the 20th sample, 3 GiB/min: 80 GiB in 13.5 min
    assert finding.evidence["fit"]["seconds_to_capacity"] == pytest.approx(40.5 / 3 * 60, rel=1e-3)
    assert "30.0 GiB → 39.5 GiB" in finding.seen and "3.0 GiB/min" in finding.seen and "R² 1.00" in finding.seen
    assert "in 14 min" in finding.seen
    assert finding.observed_at == world.now - 300 + 10
    assert_dense(finding)


def test_a_sawtooth_is_not_a_leak():
    # the allocator grows to 50 GiB over a minute, frees back to 30 GiB, again and again
    _, _, stream = scenarios.memory(lambda i: 30 * GiB + (i % 6) * 4 * GiB, samples=60)
    assert fired(stream) == []


def test_slow_growth_that_would_take_hours_is_not_a_leak_warning():
    _, _, stream = scenarios.memory(lambda i: 30 * GiB + i * 0.1 * GiB, samples=60)  # 0.6 GiB/min
    assert fired(stream) == []


def test_an_unplaced_accelerator_is_still_judged():
    _, _, stream = scenarios.memory(lambda i: 30 * GiB + i * 0.5 * GiB, samples=25, place=False)
    _, finding = fired(stream)[0]
    assert finding.subject.job_id is None and finding.subject.accelerator == "GPU-node-m-0"
    assert "no job placed on it" in finding.comparison
