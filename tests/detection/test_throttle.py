"""Persistent thermal / power throttling from crafted sample streams; blips are nothing."""

from __future__ import annotations

from tests.detection import scenarios
from tests.detection.streams import World, assert_dense, fired, run


def test_persistent_thermal_throttling_fires_on_the_accelerator_with_its_temperatures():
    world, _, stream = scenarios.throttle()  # four cool samples, then eight throttled ones
    found = fired(stream)
    assert [at for at, _ in found] == [90, 100, 110, 120]  # 5 of the last 6 samples from the 9th sample on
    _, finding = found[0]
    assert finding.subject.accelerator == "GPU-node-t-0" and finding.subject.node == "node-t"
    assert finding.layer == "hardware" and finding.key == "accelerator=GPU-node-t-0"
    assert "thermal throttling in 5 of its last 6 samples" in finding.seen
    assert "92 °C" in finding.seen and "380 W" in finding.seen and "SM clock 1.10 GHz" in finding.seen
    assert "hw_thermal_slowdown" in finding.seen
    assert "the other 1 accelerators on node-t: 0 throttling now, median 64 °C" in finding.comparison
    assert finding.observed_at == world.now - 120 + 50  # the first throttled sample in those six
    assert finding.evidence["window"]["metric"] == "temperature_celsius"
    assert finding.evidence["throttled"]["values"][-1] == 1.0
    assert any("nvidia-smi -q -d PERFORMANCE,TEMPERATURE" in step for step in finding.next_steps)
    assert_dense(finding)
    assert stream[-1][1].subjects == 2


def test_a_brief_blip_is_nothing():
    _, _, stream = scenarios.throttle([False] * 5 + [True, True] + [False] * 5)
    assert fired(stream) == []
    # flapping: at most 4 of any 6 samples
    _, _, stream = scenarios.throttle([True, True, False, True, True, False] * 3)
    assert fired(stream) == []


def test_one_clear_sample_does_not_hide_persistent_throttling():
    _, _, stream = scenarios.throttle([True] * 3 + [False] + [True] * 3)
    assert [at for at, _ in fired(stream)] == [60, 70]


def test_power_capping_counts_unless_switched_off():
    _, _, stream = scenarios.throttle(reasons=("sw_power_cap",))
    _, finding = fired(stream)[0]
    assert "power throttling" in finding.seen and "sw_power_cap" in finding.seen
    _, _, stream = scenarios.throttle(reasons=("sw_power_cap",), options={"power": 0})
    assert fired(stream) == []
    _, _, stream = scenarios.throttle(reasons=("sync_boost",))
    assert fired(stream) == []


def test_a_silent_accelerator_is_not_judged_on_its_old_window():
    world = World()
    uuid = world.add_node("node-s", accelerators=1)[0]
    detector = scenarios.ThrottleDetector(world.settings)
    stream = run(world, detector, 60, lambda t: world.sample(uuid, throttle=("hw_thermal_slowdown",)))
    assert fired(stream)
    stream = run(world, detector, 180, lambda t: None)
    assert stream[-1][1].findings == [] and stream[-1][1].subjects == 0
