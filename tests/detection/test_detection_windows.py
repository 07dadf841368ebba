"""The windowed reads detectors use: JobTelemetry.rates / recent_steps and SampleStore.tail / throttled."""

from __future__ import annotations

import pytest

from sentinel.live.samples import SampleStore, throttle_flags
from sentinel.telemetry.schemas import AcceleratorSample
from tests.detection.streams import World


def test_rates_skip_warm_up_and_earlier_attempts():
    world = World()
    world.add_node("node-a", accelerators=2)
    world.advance(10)
    for rank in range(2):  # the first interval holds the warm-up steps
        world.steps("node-a", 1, rank, [30.0] * 5 + [1.0] * 5, collective_share=0.9)
    assert world.jobs.rates(1, world.now - 60, world.now) is None
    world.advance(10)
    world.steps("node-a", 1, 0, [1.0] * 10, tokens_per_step=1000, collective_share=0.2)
    world.steps("node-a", 1, 1, [2.0] * 10, tokens_per_step=1000, collective_share=0.5)
    rates = world.jobs.rates(1, world.now - 60, world.now, accelerators_by_rank={0: ["x"], 1: ["y"]})
    assert rates is not None and rates.ranks == 2 and rates.steps == 20
    assert rates.tokens_per_second == pytest.approx(1000 + 500)
    assert rates.tokens_per_step == pytest.approx(1000)
    assert rates.step_seconds == pytest.approx(1.5)
    assert rates.rank_shares == {0: pytest.approx(0.2), 1: pytest.approx(0.5)}
    assert rates.allreduce_share == pytest.approx(0.35)
    assert rates.mfu == pytest.approx(6e9 * 1500 / 2e14)
    # rank 1 restarts: its new attempt warms up again, so the job has no clean window yet
    world.advance(10)
    world.steps("node-a", 1, 0, [1.0] * 10)
    world.steps("node-a", 1, 1, [30.0] * 5 + [1.0] * 5, attempt=1)
    assert world.jobs.rates(1, world.now - 5, world.now) is None
    world.advance(10)
    world.steps("node-a", 1, 0, [1.0] * 10)
    world.steps("node-a", 1, 1, [1.0] * 10, attempt=1)
    assert world.jobs.rates(1, world.now - 5, world.now) is not None


def test_rates_need_a_known_peak_for_mfu():
    world = World()
    world.add_node("node-a", accelerators=1)
    for _ in range(2):
        world.advance(10)
        world.steps("node-a", 1, 0, [1.0] * 10, peak_flops=None)
    rates = world.jobs.rates(1, world.now - 5, world.now)
    assert rates is not None and rates.mfu is None and rates.tokens_per_second == pytest.approx(4096)


def test_recent_steps_are_bounded_and_post_warm_up():
    world = World()
    world.add_node("node-a", accelerators=1)
    world.advance(10)
    world.steps("node-a", 1, 0, [9.0] * 5 + [1.0, 2.0, 3.0])
    world.advance(10)
    world.steps("node-a", 1, 0, [4.0, 5.0])
    assert [s for _, s in world.jobs.recent_steps(1, 0.0, 4)[0]] == [2.0, 3.0, 4.0, 5.0]
    assert [s for _, s in world.jobs.recent_steps(1, world.now, 100)[0]] == [4.0, 5.0]


def test_sample_windows_keep_throttle_flags_and_read_tails():
    store = SampleStore(4)
    for i, reasons in enumerate([[], ["sw_power_cap"], ["hw_thermal_slowdown", "sw_power_cap"], ["sync_boost"],
                                 ["sw_thermal_slowdown"]]):
        store.add(100.0 + i, [AcceleratorSample(uuid="g0", utilization_ratio=0.5, memory_used_bytes=i,
                                                memory_total_bytes=10, throttle_reasons=reasons)])
    assert store.uuids() == ["g0"]
    tail = store.tail("g0", ("time", "throttled", "memory_used_bytes"))
    assert tail == {"time": [101.0, 102.0, 103.0, 104.0], "throttled": [2.0, 3.0, 0.0, 1.0],
                    "memory_used_bytes": [1.0, 2.0, 3.0, 4.0]}
    assert store.tail("g0", ("time",), 2) == {"time": [103.0, 104.0]}
    ring = store.window("g0")
    assert ring is not None and (ring.at("time", 0), ring.at("time", -1), ring.at("time", 1)) == (101.0, 104.0, 102.0)
    with pytest.raises(IndexError):
        ring.at("time", 4)
    assert store.tail("nope", ("time",)) is None
    assert throttle_flags(["hw_power_brake_slowdown", "hw_slowdown"]) == 3.0
