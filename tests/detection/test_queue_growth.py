"""The queue-growth detector on a live ServingView: a replica whose waiting requests grow 5 a report is found
when its queue passes 16, named with the growth, what it finished meanwhile and its batch limit; a steady
queue, however long, and a short rise are not; the incident clears when the queue drains."""

from __future__ import annotations

from sentinel.detection.detectors.queue_growth import QueueGrowth, slope
from tests.detection import scenarios
from tests.detection.streams import World, assert_dense, fired, run


def test_a_growing_queue_is_found_when_it_passes_the_floor() -> None:
    _, _, stream = scenarios.queue_growth()
    found = fired(stream)
    assert {f.key for _, f in found} == {"job=9|replica=d1"}, "d0's steady queue of 2 is never named"
    first_at, first = found[0]
    assert first_at == 80.0, "7, 12, then 17 waiting at 80 s: past the floor of 16"
    assert first.title == "serving job 9: decode replica d1: queue growing (2 → 17 waiting in 70 s)"
    assert "32 running" in first.seen and "finished 2.0 requests/s" in first.comparison
    assert first.severity == "warning" and first.action == "record"
    assert first.evidence["window"]["values"][-1] == 17.0
    assert_dense(first)


def test_a_long_steady_queue_is_not_growth() -> None:
    world = World()
    world.add_node("node-s", accelerators=1)
    detector = QueueGrowth(world.settings)
    stream = run(world, detector, 300.0, lambda t: world.serve("node-s", 9, 0, "d0", waiting=40))
    assert fired(stream) == [], "40 waiting all along: a loaded replica keeping up, not a growing queue"


def test_a_rise_under_the_floor_is_not_found() -> None:
    _, _, stream = scenarios.queue_growth(per_report=1, seconds=130.0)
    assert fired(stream) == [], "from 2 to 10 waiting: under min_waiting 16"


def test_the_slope_is_least_squares() -> None:
    assert slope([(0.0, 0.0, 0), (10.0, 5.0, 0), (20.0, 10.0, 0)]) == 0.5
    assert slope([(5.0, 3.0, 0)]) == 0.0


def test_the_condition_clears_when_the_queue_drains() -> None:
    _, detector, stream = scenarios.queue_growth(fixed_at=160.0, seconds=300.0)
    assert fired(stream) and stream[-1][1].findings == [] and detector.active == set()
