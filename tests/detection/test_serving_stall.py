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


def _silence(streaming: int | None, ttft: float | None = None) -> list[float]:
    """Reports each second; d0's tokens stop after the report of 1 s; when is it found stalled? `ttft`: its
    first tokens took that long before."""
    world = World()
    world.add_node("node-s", accelerators=1)
    detector = ServingStall(world.settings)
    kv = None if ttft is None else ttft / 10  # serve() gives its requests a 100 ms first token with a KV transfer
    return [at for at, _ in fired(run(world, detector, 14.0, lambda t: world.serve(
        "node-s", 9, 0, "d0", frozen=t > 1.0, streaming=streaming, kv_seconds=kv), interval=1.0))]


def test_streams_open_mid_answer_stall_at_mid_stream_seconds_a_long_prefill_at_stall_seconds():
    mid_stream = _silence(streaming=4)
    assert mid_stream and mid_stream[0] == 4.0, "4 streams mid-answer and no token for 3 s: a frozen decode"
    prefill = _silence(streaming=0)
    assert prefill and prefill[0] == 11.0, "no stream has its first token yet: a long prefill, until 10 s"
    unknown = _silence(streaming=None)
    assert unknown and unknown[0] == 11.0, "a source that cannot say (scraped /metrics) keeps stall_seconds"


def test_the_mid_stream_finding_says_how_many_streams_were_cut_off():
    world = World({"serving_stall": {"mid_stream_seconds": 2.0}})
    world.add_node("node-s", accelerators=1)
    detector = ServingStall(world.settings)
    found = fired(run(world, detector, 5.0, lambda t: world.serve("node-s", 9, 0, "d0", frozen=t > 1.0,
                                                                     streaming=3), interval=1.0))
    assert found and found[0][0] == 3.0
    finding = found[0][1]
    assert "4 requests in flight, 3 of them mid-stream, no token for 2.0 s" in finding.seen
    assert "limits 2.0 s without a token (3 mid-stream)" in finding.seen
    assert finding.evidence["streaming"] == 3 and finding.evidence["stall_limit_seconds"] == 2.0


def test_a_replica_frozen_between_answers_is_found_by_its_own_first_token_times():
    """Nothing mid-stream (it froze between answers: the requests in flight never got a first token): the limit is
    10 × its TTFT p99 of the window, at least mid_stream_seconds; with no first token to go by, stall_seconds."""
    found = _silence(streaming=0, ttft=0.1)
    assert found and found[0] == 4.0, "TTFT p99 100 ms: 10 × is 1 s, so mid_stream_seconds (3 s) holds"
    world = World({"serving_stall": {"ttft_factor": 60.0}})
    world.add_node("node-s", accelerators=1)
    slow = fired(run(world, ServingStall(world.settings), 14.0, lambda t: world.serve(
        "node-s", 9, 0, "d0", frozen=t > 1.0, streaming=0, kv_seconds=0.01), interval=1.0))
    assert slow and slow[0][0] == 7.0, "60 × its p99 (98 ms: the bucket's): 5.9 s of silence may be a prefill"
    seen = slow[0][1].seen
    assert "none past its first token" in seen and "(none mid-stream: 60 × its TTFT p99 of" in seen, seen
