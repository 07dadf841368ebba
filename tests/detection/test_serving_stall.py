"""The serving stall detector on a live ServingView: a decode replica frozen mid-stream (requests in flight, no
token) is found within one report past `stall_seconds`, named with its stage and evidence; a replica with tokens
flowing, or with nothing in flight, is not; a request older than its deadline is; the incident can clear."""

from __future__ import annotations

from sentinel.detection.detectors.serving_stall import ServingStall
from tests.detection import scenarios
from tests.detection.streams import World, assert_dense, fired, run


def test_a_replica_frozen_mid_stream_is_found_within_one_report_past_the_limit():
    _, _, stream = scenarios.serving_stall()
    found = fired(stream)
    assert found, "the frozen replica is found"
    first_at, first = found[0]
    assert first_at == 60.0, "frozen after the report of 50 s: at the report of 60 s its last token is 10 s old"
    assert {f.key for _, f in found} == {"job=9|replica=d1"}, "the healthy replica d0 is never named"
    assert (first.subject.job_id, first.subject.rank, first.subject.node) == (9, 1, "node-s")
    assert "decode replica d1" in first.title and "4 requests in flight" in first.seen
    assert "inter-token latency p99" in first.comparison and "ms" in first.comparison
    assert first.action == "restart_task" and first.layer == "software"
    assert_dense(first)
    assert first.evidence["window"]["values"][-1] >= 10.0


def test_tokens_flowing_or_nothing_in_flight_is_healthy():
    _, _, stream = scenarios.serving_stall(replicas=())
    assert fired(stream) == []
    _, _, idle = scenarios.serving_stall(running=0)
    assert fired(idle) == [], "no request in flight: a quiet replica is an idle one"


def test_a_request_older_than_its_deadline_is_found_while_tokens_flow():
    world = World({"serving_stall": {"deadline_seconds": 30.0}})
    world.add_node("node-s", accelerators=1)
    detector = ServingStall(world.settings)
    ages = iter(range(5, 500, 10))

    def tick(t: float) -> None:
        world.serve("node-s", 9, 0, "d0")
        world.serving.replicas(9, world.now)[0].oldest_inflight_seconds = float(next(ages))

    found = fired(run(world, detector, 60.0, tick))
    assert found and found[0][0] == 40.0 and "oldest request in flight is 35 s old" in found[0][1].seen


def test_a_replica_that_stopped_reporting_is_left_to_the_heartbeat_detector():
    world = World()
    world.add_node("node-s", accelerators=1)
    detector = ServingStall(world.settings)
    world.serve("node-s", 9, 0, "d0", frozen=True)
    world.advance(31.0)
    assert detector.evaluate(world.ctx, world.now).subjects == 0


def test_the_condition_clears_when_tokens_come_back():
    _, detector, stream = scenarios.serving_stall(resume_at=100.0, seconds=150.0)
    assert fired(stream) and stream[-1][1].findings == [] and detector.active == set()
