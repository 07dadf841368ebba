"""The SDK's request recorder on a fake clock: each latency lands in its histogram and sum, the joint TTFT×TPOT
cell is the request's own, an empty completion and a raised request count as failed, and the sums ride in the
telemetry batch that the agent's wire schema accepts."""

from __future__ import annotations

import pytest

from sentinel.sdk import buckets
from sentinel.sdk.serving import Requests
from sentinel.sdk.telemetry import Telemetry
from sentinel.telemetry.schemas import SdkBatch


class Clock:
    def __init__(self) -> None:
        self.t = 100.0

    def __call__(self) -> float:
        return self.t


def stream(requests: Requests, clock: Clock, *, queue: float, ttft: float, gaps: list[float]) -> None:
    with requests.request(prompt_tokens=12) as req:
        clock.t += queue
        req.admitted()
        clock.t += ttft - queue
        req.token()
        for gap in gaps:
            clock.t += gap
            req.token()


def test_a_streamed_request_is_timed_to_its_first_and_last_token():
    clock = Clock()
    requests = Requests("r0", "decode", clock=clock)
    stream(requests, clock, queue=0.05, ttft=0.3, gaps=[0.02, 0.04, 0.03])
    out = requests.take()
    assert out["requests"] == 1 and out["failed"] == {} and out["output_tokens"] == 4 and out["prompt_tokens"] == 12
    h = out["histograms"]
    assert h["ttft"] == {buckets.bucket(0.3): 1}
    assert h["queue"] == {buckets.bucket(0.05): 1}
    assert sorted(h["itl"]) == sorted({buckets.bucket(0.02), buckets.bucket(0.04), buckets.bucket(0.03)})
    assert h["tpot"] == {buckets.bucket(0.03): 1}, "(last − first token) ÷ (tokens − 1)"
    assert h["e2e"] == {buckets.bucket(0.39): 1}
    assert out["sums"]["ttft"] == pytest.approx(0.3)
    assert out["joint"] == {f"{buckets.bucket(0.3)}:{buckets.bucket(0.03)}": 1}
    assert (out["stage"], out["replica"], out["running"]) == ("decode", "r0", 0)
    assert requests.take()["requests"] == 0, "take starts a fresh interval"


def test_an_empty_completion_and_an_exception_are_failures_and_never_count_as_latency():
    clock = Clock()
    requests = Requests(clock=clock)
    with requests.request():
        clock.t += 0.2  # HTTP 200, no token: vllm-ascend #13165
    with pytest.raises(RuntimeError), requests.request() as req:
        req.token()
        raise RuntimeError("decode failed")
    out = requests.take()
    assert out["requests"] == 2 and out["failed"] == {"empty": 1, "error": 1}
    assert out["histograms"]["ttft"] == {0: 1}, "the failed stream's first token was real"
    assert out["joint"] == {}, "a failed request meets no SLO"


def test_in_flight_requests_say_how_old_the_oldest_is_and_when_a_token_last_came():
    clock = Clock()
    requests = Requests(clock=clock)
    req = requests.start()
    clock.t += 7.5
    req.token()
    out = requests.take()
    assert out["running"] == 1 and out["oldest_inflight_seconds"] == pytest.approx(7.5)
    assert out["last_token_at"] is not None and requests.pending()
    requests.finish(req)
    assert requests.take()["running"] == 0


def test_stages_kv_transfers_and_engine_timed_requests():
    clock = Clock()
    requests = Requests("p1", "prefill", clock=clock)
    with requests.request() as req:
        req.stage("prefill", 0.2)
        req.kv_transfer(0.05, 1 << 20)
        req.kv_transfer(0.01, 0, ok=False)
        req.token()
    requests.record(ttft=0.4, e2e=1.0, output_tokens=7, tpot=0.1, queue=0.1, stages={"decode": 0.6})
    requests.record(ttft=None, e2e=0.5, output_tokens=0, failure="weird")
    out = requests.take()
    assert out["kv_transfer_bytes"] == 1 << 20 and out["kv_transfer_failures"] == 1
    assert out["sums"]["kv_transfer"] == pytest.approx(0.06)
    assert out["histograms"]["prefill"] == {buckets.bucket(0.2): 1}
    assert out["histograms"]["tpot"] == {buckets.bucket(0.1): 1}
    assert out["failed"] == {"error": 1}, "an unknown reason is an error"


def test_the_sums_ride_in_the_telemetry_batch_the_agent_accepts():
    telemetry = Telemetry(job_id=3, rank=1, start_thread=False)
    requests = telemetry.serving(replica="r1", stage="decode")
    assert telemetry.serving() is requests
    with requests.request() as req:
        req.token(3)
    batch = telemetry.take_batch()
    assert batch is not None
    parsed = SdkBatch.model_validate(batch)
    assert parsed.serving is not None and parsed.serving.requests == 1 and parsed.serving.output_tokens == 3
    assert telemetry.take_batch() is None, "nothing new, nothing in flight: no batch"
