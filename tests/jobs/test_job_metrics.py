"""Job signals computed by the server from relayed task telemetry, on SQLite and PostgreSQL."""

from __future__ import annotations

import pytest
from prometheus_client.parser import text_string_to_metric_families

from tests.conftest import FakeClock, bearer, stop_app
from tests.factories import registration, report


@pytest.fixture
def job(client, make_token):  # type: ignore[no-untyped-def]
    agent = bearer(make_token("agent"))
    reg = registration("node-a", accelerators=2)
    reg["accelerators"][0]["model"] = "NVIDIA H100 80GB HBM3"  # datasheet peak 989e12 bf16
    reg["accelerators"][1]["peak_flops"] = 2e11  # as a sim agent measures it
    assert client.post("/api/v1/nodes/register", json=reg, headers=agent).status_code == 200
    launcher = bearer(make_token("launcher"))
    job_id = client.post("/api/v1/jobs", json={"name": "llm", "world_size": 2}, headers=launcher).json()["id"]
    for rank in range(2):
        body = {"rank": rank, "node": "node-a", "accelerators": [f"SIM-node-a-{rank}"], "pid": 1000 + rank}
        assert client.post(f"/api/v1/jobs/{job_id}/tasks", json=body, headers=launcher).status_code == 201
    return job_id, agent


def task(job_id: int, rank: int, steps: list[float], tokens_per_step: int, collective: float, **extra: object):
    return {"job_id": job_id, "rank": rank, "pid": 1000 + rank, "steps": len(steps), "last_step": len(steps),
            "step_seconds": steps, "tokens": tokens_per_step * len(steps), "busy_seconds": sum(steps),
            "collective_seconds": collective, "model": {"flops_per_token": 1e9}, **extra}


def test_signals_are_aggregated_per_rank_and_per_job(client, job, admin_token):
    job_id, agent = job
    body = report(seq=1, accelerators=0)
    body["tasks"] = [task(job_id, 0, [0.1] * 9 + [0.5], 1000, 0.2, memory_peak_bytes=2**30),
                     task(job_id, 1, [0.2] * 10, 1000, 1.0, memory_peak_bytes=3 * 2**30)]
    assert client.post("/api/v1/nodes/node-a/reports", json=body, headers=agent).status_code == 200
    m = client.get(f"/api/v1/jobs/{job_id}/metrics", headers=bearer(admin_token)).json()
    r0, r1 = m["ranks"]
    assert r0["tokens_per_second"] == pytest.approx(10_000 / 1.4)
    assert r1["tokens_per_second"] == pytest.approx(10_000 / 2.0)
    assert m["tokens_per_second"] == pytest.approx(10_000 / 1.4 + 5_000)
    assert (r0["allreduce_time_ratio"], r1["allreduce_time_ratio"]) == (pytest.approx(0.2 / 1.4), pytest.approx(0.5))
    assert m["allreduce_time_ratio"] == pytest.approx((0.2 / 1.4 + 0.5) / 2)
    assert r0["step_seconds_p50"] == pytest.approx(0.1) and r0["step_seconds_p95"] > 0.1
    assert m["step_seconds_p50"] == pytest.approx(0.2)  # nine 0.1s, ten 0.2s, one 0.5s
    # rank 0 on an H100 (datasheet), rank 1 on an accelerator whose agent measured 2e11
    assert (r0["peak_flops_per_accelerator"], r1["peak_flops_per_accelerator"]) == (989e12, 2e11)
    expected = 1e9 * (10_000 / 1.4 + 5_000) / (989e12 + 2e11)
    assert m["mfu_ratio"] == pytest.approx(expected)
    assert m["memory_peak_bytes"] == 3 * 2**30 and m["memory_capacity_bytes"] == 80 * 2**30

    text = client.get("/metrics", headers=bearer(admin_token)).text
    samples = {(s.name, tuple(sorted(s.labels.items()))): s.value
               for f in text_string_to_metric_families(text) for s in f.samples}
    labels = (("job", str(job_id)), ("kind", "training"))
    assert samples[("sentinel_job_mfu_ratio", labels)] == pytest.approx(expected)
    assert samples[("sentinel_job_allreduce_time_ratio", labels)] == pytest.approx(m["allreduce_time_ratio"])
    assert samples[("sentinel_job_step_seconds", (*labels, ("quantile", "0.5")))] == pytest.approx(0.2)
    assert samples[("sentinel_job_tokens_per_second", labels)] == pytest.approx(m["tokens_per_second"])
    assert samples[("sentinel_job_memory_peak_bytes", labels)] == 3 * 2**30


def test_mfu_waits_until_every_rank_can_say(client, job, admin_token):
    job_id, agent = job
    body = report(seq=1, accelerators=0)
    body["tasks"] = [task(job_id, 0, [0.1], 100, 0.0)]
    body["tasks"][0]["model"] = None
    client.post("/api/v1/nodes/node-a/reports", json=body, headers=agent)
    assert client.get(f"/api/v1/jobs/{job_id}/metrics", headers=bearer(admin_token)).json()["mfu_ratio"] is None


def test_a_task_exit_fails_the_task_counts_it_and_says_why(client, job, admin_token, clock: FakeClock):
    job_id, agent = job
    clock.advance(1800)  # half an hour into the job
    body = report(seq=1, accelerators=0)
    body["tasks"] = [task(job_id, 1, [0.1], 10, 0.0, failure={"type": "CUDAError", "message": "illegal address"})]
    body["task_exits"] = [{"job_id": job_id, "rank": 1, "pid": 1001, "exit_code": 1, "observed_at": 1.8e9},
                          {"job_id": job_id, "rank": 0, "pid": 1000, "signal": 9, "observed_at": 1.8e9}]
    assert client.post("/api/v1/nodes/node-a/reports", json=body, headers=agent).status_code == 200
    tasks = {t["rank"]: t for t in client.get(f"/api/v1/jobs/{job_id}", headers=bearer(admin_token)).json()["tasks"]}
    assert (tasks[0]["state"], tasks[0]["exit_signal"], tasks[0]["failure_reason"]) == ("failed", 9, "signal:SIGKILL")
    assert (tasks[1]["exit_code"], tasks[1]["failure_reason"]) == (1, "exception:CUDAError")
    m = client.get(f"/api/v1/jobs/{job_id}/metrics", headers=bearer(admin_token)).json()
    assert m["task_failures"] == {"signal:SIGKILL": 1, "exception:CUDAError": 1}
    assert m["failures_per_hour"] == pytest.approx(4.0, rel=0.01)
    events = client.get("/api/v1/events", params={"kind": "task_failed"}, headers=bearer(admin_token)).json()
    assert sorted(e["message"] for e in events) == [
        f"job {job_id} rank 0 (pid 1000) killed by signal 9 (SIGKILL)",
        f"job {job_id} rank 1 (pid 1001) exited with code 1 after an uncaught CUDAError"]
    ack = client.post("/api/v1/nodes/node-a/reports", json=report(seq=2, accelerators=0), headers=agent).json()
    assert ack["assignments"] == [], "ended tasks are no longer the agent's to watch"


def test_failure_counts_survive_a_server_restart(settings, clock, client, job, admin_token):
    from fastapi.testclient import TestClient

    from sentinel.app import create_app

    job_id, agent = job
    body = report(seq=1, accelerators=0)
    body["task_exits"] = [{"job_id": job_id, "rank": 0, "pid": 1000, "signal": 11, "observed_at": 1.8e9}]
    client.post("/api/v1/nodes/node-a/reports", json=body, headers=agent)
    stop_app(client)
    with TestClient(create_app(settings, clock, run_scheduler=False)) as again:
        m = again.get(f"/api/v1/jobs/{job_id}/metrics", headers=bearer(admin_token)).json()
    assert m["task_failures"] == {"signal:SIGSEGV": 1}


def test_unknown_job_metrics_is_404_and_bad_task_telemetry_is_422(client, job, admin_token):
    job_id, agent = job
    assert client.get("/api/v1/jobs/999/metrics", headers=bearer(admin_token)).status_code == 404
    body = report(seq=1, accelerators=0)
    body["tasks"] = [task(job_id, 0, [-1.0], 1, 0.0)]
    response = client.post("/api/v1/nodes/node-a/reports", json=body, headers=agent)
    assert response.status_code == 422 and "tasks.0.step_seconds.0" in str(response.json())


def test_fleet_reliability_counts_hardware_faults_per_1000_accelerator_days(client, job, admin_token, clock):
    _, agent = job
    clock.advance(86400)
    events = [{"kind": "xid", "xid": 79, "accelerator_uuid": "SIM-node-a-0", "observed_at": 1.8e9},
              {"kind": "thermal", "accelerator_uuid": "SIM-node-a-1", "observed_at": 1.8e9}]
    client.post("/api/v1/nodes/node-a/reports", json=report(seq=1, accelerators=0, events=events), headers=agent)
    r = client.get("/api/v1/fleet/reliability", headers=bearer(admin_token)).json()
    assert r["hardware_faults"] == 1  # thermal throttling is not a hardware fault
    assert r["nodes"][0]["node"] == "node-a" and r["nodes"][0]["hardware_faults"] == 1
    assert r["accelerator_days"] > 0 and r["faults_per_1000_accelerator_days"] == pytest.approx(
        1000 / r["accelerator_days"])


def test_a_restart_counts_the_steps_it_threw_away(client, job, admin_token, clock: FakeClock):
    job_id, agent = job
    clock.advance(60)
    body = report(seq=1, accelerators=0)
    body["tasks"] = [task(job_id, r, [0.1] * 50, 10, 0.0) for r in range(2)]
    client.post("/api/v1/nodes/node-a/reports", json=body, headers=agent)
    body = report(seq=2, accelerators=0)
    body["tasks"] = [{**task(job_id, r, [0.1] * 5, 10, 0.0), "attempt": 1, "pid": 2000 + r} for r in range(2)]
    client.post("/api/v1/nodes/node-a/reports", json=body, headers=agent)
    m = client.get(f"/api/v1/jobs/{job_id}/metrics", headers=bearer(admin_token)).json()
    assert m["lost_steps_total"] == 50, "attempt 1 started over at step 0 after attempt 0 reached step 50"
    # 50 recomputed steps of 0.1 s over ~60 s since the job started: goodput ≈ 1 − 5/60
    assert m["goodput_ratio"] == pytest.approx(1 - 50 * 0.1 / 60, abs=0.02)


def test_a_checkpoint_saved_after_the_last_telemetry_counts_towards_the_lost_steps(client, job, admin_token,
                                                                                      make_token):
    """A rank killed between two telemetry flushes got further than its telemetry says; the shards it
    registered say how far, so the steps the restart recomputes are not undercounted."""
    job_id, agent = job
    launcher = bearer(make_token("launcher"))
    body = report(seq=1, accelerators=0)
    body["tasks"] = [task(job_id, r, [0.1] * 48, 10, 0.0) for r in range(2)]  # telemetry got to step 48
    client.post("/api/v1/nodes/node-a/reports", json=body, headers=agent)
    where = [{"tier": "persistent", "node": "", "uri": "/ckpt/shared"}]
    for step in (50, 60):  # then both ranks saved steps 50 and 60 before they were killed
        for rank in range(2):
            shard = {"manifest_digest": "ab" * 16, "attempt": 0, "locations": where}
            response = client.put(f"/api/v1/jobs/{job_id}/checkpoints/{step}/shards/{rank}", json=shard,
                                  headers=launcher)
            assert response.status_code == 200, response.text
    body = report(seq=2, accelerators=0)  # attempt 1 resumed from step 50 and made 5 steps
    body["tasks"] = [{**task(job_id, r, [0.1] * 5, 10, 0.0), "attempt": 1, "pid": 2000 + r, "last_step": 55}
                     for r in range(2)]
    client.post("/api/v1/nodes/node-a/reports", json=body, headers=agent)
    m = client.get(f"/api/v1/jobs/{job_id}/metrics", headers=bearer(admin_token)).json()
    assert m["lost_steps_total"] == 10, "steps 51-60 are recomputed, though telemetry only showed up to 48"
