"""A serving job's request signals through the real app on SQLite and PostgreSQL: quantiles per replica and
job-wide, the KV-transfer share of TTFT, SLO attainment from each request's own TTFT and TPOT (DistServe),
goodput, MBU, burn rates; the `sentinel_job_*` serving series; and bad input refused with a precise 4xx."""

from __future__ import annotations

import pytest

from sentinel.sdk import buckets
from sentinel.serving.cli import serving_table
from tests.factories import report
from tests.serving.driver import ServingDriver


@pytest.fixture
def job(client, make_token, clock) -> ServingDriver:  # type: ignore[no-untyped-def]
    return ServingDriver(client, make_token, clock)


def test_signals_per_replica_and_job_wide(job):
    job.requests(0, 40, ttft=0.2, tpot=0.02, tokens=1, kv=0.006)  # prefill: first token only, KV 3% of TTFT
    job.requests(1, 30, ttft=0.3, tpot=0.03)  # decode: within the SLO
    job.requests(1, 10, ttft=0.3, tpot=0.09)  # decode: TPOT misses it
    job.requests(1, 2, ttft=0.1, tpot=0.01, failure="empty")
    job.round()
    out = job.serving()
    assert out["slo"] == {"ttft_seconds": 0.5, "tpot_seconds": 0.05, "objective": 0.99}
    by = {r["replica"]: r for r in out["replicas"]}
    assert set(by) == {"p0", "d1"} and (by["p0"]["stage"], by["d1"]["stage"]) == ("prefill", "decode")
    assert by["p0"]["node"] == "node-a" and by["d1"]["rank"] == 1
    prefill, decode = by["p0"]["signals"], by["d1"]["signals"]
    assert prefill["kv_transfer_ratio"] == pytest.approx(0.03, rel=0.01)
    assert decode["kv_transfer_ratio"] is None, "no transfer on that replica"
    assert decode["latency_seconds"]["ttft"]["p50"] == pytest.approx(0.3, rel=0.09)
    assert decode["latency_seconds"]["tpot"]["p99"] == pytest.approx(0.09, rel=0.09)
    assert decode["failed"] == {"empty": 2} and decode["requests"] == 42
    assert decode["slo_attainment_ratio"] == pytest.approx(30 / 42, abs=1e-4), "TPOT misses and failures miss"
    assert decode["slo"]["basis"] == "joint"
    assert decode["goodput_per_second"] == pytest.approx(30 / 60, abs=1e-3), "within SLO per second of window"
    assert prefill["slo_attainment_ratio"] == 1.0
    whole = out["signals"]
    assert whole["requests"] == 82 and whole["slo_attainment_ratio"] == pytest.approx(70 / 82, abs=1e-4)
    # MBU: 16 GB of weights per token at p50 TPOT ~0.03 s on an H100's 3.35 TB/s
    assert decode["mbu_ratio"] == pytest.approx(16e9 / buckets.quantile({buckets.bucket(0.03): 1}, 0.5) / 3.35e12,
                                                rel=0.01)
    assert out["burn_rates"]["5m"] == pytest.approx((12 / 82) / 0.01, rel=1e-3)


def test_the_window_slides_and_engine_marginals_give_a_lower_bound(job):
    job.requests(1, 10, ttft=0.3, tpot=0.03)
    job.round()
    for _ in range(31):  # past the 60 s window
        job.round()
    assert job.serving()["signals"]["requests"] == 0
    assert job.serving()["burn_rates"]["5m"] == 0.0, "the burn history is longer than the window"
    # an engine adapter's marginals only: 90% within TTFT and 80% within TPOT → at least 70% within both
    marginals = {"source": "vllm", "replica": "d1", "stage": "decode", "requests": 10,
                 "histograms": {"ttft": {str(buckets.bucket(0.1)): 9, str(buckets.bucket(2.0)): 1},
                                "tpot": {str(buckets.bucket(0.01)): 8, str(buckets.bucket(0.5)): 2}}}
    job.clock.advance(2.0)
    job.report(1, marginals)
    d1 = {r["replica"]: r for r in job.serving()["replicas"]}["d1"]
    assert d1["source"] == "vllm"
    assert d1["signals"]["slo"]["basis"] == "bound"
    assert d1["signals"]["slo_attainment_ratio"] == pytest.approx(0.7)
    for _ in range(301):  # p0 reported all along; d1 falls silent for over 10 minutes (replaced, stopped)
        job.clock.advance(2.0)
        job.report(0)
    assert [r["replica"] for r in job.serving()["replicas"]] == ["p0"]


def test_the_serving_series_are_exported(job, client, admin_token):
    job.requests(1, 20, ttft=0.3, tpot=0.03, kv=0.03)
    job.round()
    body = client.get("/metrics", headers={"Authorization": f"Bearer {admin_token}"}).text
    j = str(job.job)
    assert f'sentinel_job_ttft_seconds{{job="{j}",kind="serving",quantile="0.99",replica="",stage=""}}' in body
    assert f'sentinel_job_ttft_seconds{{job="{j}",kind="serving",quantile="0.5",replica="d1",stage="decode"}}' in body
    assert f'sentinel_job_slo_attainment_ratio{{job="{j}",kind="serving",replica="",stage=""}} 1.0' in body
    assert f'sentinel_job_kv_transfer_ratio{{job="{j}",kind="serving",replica="d1",stage="decode"}} 0.1' in body
    assert f'sentinel_job_requests_total{{job="{j}",kind="serving",replica="",stage=""}} 20.0' in body
    assert 'sentinel_job_itl_seconds{' in body
    assert 'sentinel_job_queue_seconds{' not in body, "no request was queued: no series, not a zero"
    assert f'sentinel_job_slo_burn_rate{{job="{j}",kind="serving",window="1h"}} 0.0' in body


@pytest.mark.parametrize("attributes, field", [
    ({"slo": {"ttft_seconds": 0, "tpot_seconds": 0.05}}, "ttft_seconds"),
    ({"slo": {"ttft_seconds": 0.5}}, "tpot_seconds"),
    ({"slo": {"ttft_seconds": 0.5, "tpot_seconds": 0.05, "objective": 1.0}}, "objective"),
    ({"slo": {"ttft_seconds": 0.5, "tpot_seconds": 0.05, "p99": True}}, "p99"),
    ({"model_bytes": -1}, "model_bytes"),
])
def test_a_bad_slo_is_refused_with_the_field(client, make_token, attributes, field):
    answer = client.post("/api/v1/jobs", json={"name": "bad", "kind": "serving", "world_size": 1,
                                               "attributes": attributes},
                         headers={"Authorization": f"Bearer {make_token('launcher')}"})
    assert answer.status_code == 422 and field in answer.text


def test_bad_serving_reports_and_reads_get_a_precise_4xx(job, client):
    bad = {"histograms": {"ttft": {"999": 1}}}
    job.clock.advance(2.0)
    job.seq["node-b"] += 1
    body = report("node-b", job.seq["node-b"], accelerators=1, interval=2.0) | {
        "tasks": [{"job_id": job.job, "rank": 1, "pid": 5001, "serving": bad}]}
    answer = client.post("/api/v1/nodes/node-b/reports", json=body, headers=job.agent)
    assert answer.status_code == 422 and "histograms" in answer.text
    assert client.get("/api/v1/jobs/999999/serving", headers=job.viewer).status_code == 404
    assert client.get(f"/api/v1/jobs/{job.job}/serving").status_code == 401


class Api:
    """`sentinel jobs`'s client over the test app (sentinel/client.py's get, path under /api/v1)."""

    def __init__(self, client, headers):  # type: ignore[no-untyped-def]
        self.client, self.headers = client, headers

    def get(self, path: str):  # type: ignore[no-untyped-def]
        answer = self.client.get(f"/api/v1{path}", headers=self.headers)
        assert answer.status_code == 200, answer.text
        return answer.json()


def test_sentinel_jobs_prints_a_serving_row_per_job_and_replica(job, client):
    job.requests(1, 30, ttft=0.3, tpot=0.03, kv=0.03)
    job.requests(1, 3, ttft=0.3, tpot=0.03, failure="truncated")
    job.round()
    api = Api(client, job.viewer)
    lines = serving_table(api, api.get("/jobs")).splitlines()
    assert lines[0].split()[:4] == ["JOB", "REPLICA", "STAGE", "NODE"]
    rows = {line.split()[1]: line.split() for line in lines[2:]}
    assert set(rows) == {"all", "p0", "d1"}
    d1 = rows["d1"]
    assert d1[2:4] == ["decode", "node-b"] and d1[4] == "0.6", "33 requests in the 60 s window"
    assert d1[7] == "-", "no request was queued"
    assert d1[8:10] == ["9.1%", "90.9%"], "KV on 30 of 33 requests, 10% of their TTFT each"
    assert d1[10:12] == ["3", "(9.1%)"]
    assert serving_table(api, [{"id": 1, "kind": "training"}]) is None
