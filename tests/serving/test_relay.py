"""The agent sums a serving task's batches over its interval: counts and histograms add, gauges are the
latest, and the report's task carries the sums the server reads."""

from __future__ import annotations

import os

from collectors.jobs import TaskRelay
from sentinel.telemetry.schemas import NodeReport, SdkBatch


def batch(requests: int, ttft_bucket: int, running: int) -> SdkBatch:
    return SdkBatch.model_validate({"job_id": 4, "rank": 0, "pid": os.getpid(), "serving": {
        "replica": "d0", "stage": "decode", "requests": requests, "failed": {"empty": 1},
        "histograms": {"ttft": {str(ttft_bucket): requests}}, "sums": {"ttft": 0.1 * requests},
        "joint": {f"{ttft_bucket}:40": requests}, "running": running}})


def test_an_interval_of_batches_is_one_sum():
    relay = TaskRelay()
    relay.add(batch(3, 90, running=5))
    relay.add(batch(2, 90, running=1))
    relay.add(batch(1, 95, running=2))
    [task] = relay.drain()
    s = task.serving
    assert s is not None and (s.requests, s.failed, s.running, s.replica) == (6, {"empty": 3}, 2, "d0")
    assert s.histograms["ttft"] == {90: 5, 95: 1} and s.joint == {"90:40": 5, "95:40": 1}
    assert abs(s.sums["ttft"] - 0.6) < 1e-9
    report = NodeReport.model_validate({"node": "n", "seq": 1, "sent_at": 1.0, "tasks": [task.model_dump()]})
    assert report.tasks[0].serving == s
    assert relay.drain() == [], "the next interval starts empty"
