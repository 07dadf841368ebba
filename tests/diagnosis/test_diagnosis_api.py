"""Slowdown attribution through the real app on SQLite and PostgreSQL: a job learns its baseline, a cause is
named with its layer and evidence, the proposed experiment runs on the agent (played by the test) or on the
server and confirms it, the incident says so; and bad requests get a precise 4xx."""

from __future__ import annotations

from typing import Any

import pytest

from tests.conftest import bearer
from tests.diagnosis.jobdriver import JobDriver
from tests.remediation.conftest import settle


@pytest.fixture
def job(client, make_token, clock) -> JobDriver:  # type: ignore[no-untyped-def]
    return JobDriver(client, make_token, clock)


def learnt(job: JobDriver) -> None:
    job.run(20)
    assert job.diagnosis()["state"] == "learning"
    job.run(14)
    found = job.diagnosis()
    assert found["state"] == "healthy", found
    assert found["baseline_iteration_seconds"] == pytest.approx(0.126, rel=0.01)
    kinds = sorted(c["spec"]["kind"] for cs in job.commands.values() for c in cs)
    assert kinds == ["collective", "collective", "disk_write", "disk_write"], "calibrations while healthy"
    job.answer_calibrations(1e9)


def incident(job: JobDriver) -> dict[str, Any]:
    settle(job.client)
    [found] = job.client.get("/api/v1/incidents", params={"detector": "slowdown"},
                             headers=job.viewer).json()["incidents"]
    return dict(job.client.get(f"/api/v1/incidents/{found['id']}", headers=job.viewer).json())


def test_a_slow_collective_path_is_named_and_the_proposed_experiment_confirms_it(job):
    learnt(job)
    job.cause = "communication"
    job.run(10)
    d = job.diagnosis()["diagnosis"]
    assert (d["layer"], d["component"], d["ranks"], d["status"]) == ("interconnect", "communication", [0, 1],
                                                                    "suspected")
    assert d["slowdown"] == pytest.approx(0.08 / 0.126, rel=0.05)
    assert d["proposed_experiment"]["kind"] == "collective"
    assert {"compute", "data_wait", "checkpoint"} <= {r["what"] for r in d["ruled_out"]}
    first = incident(job)
    assert first["layer"] == "interconnect" and first["evidence"]["attribution"]["component"] == "communication"

    started = job.client.post(f"/api/v1/jobs/{job.job}/experiments", json={}, headers=job.operator)
    assert started.status_code == 202, started.text
    assert started.json()["state"] == "pending" and started.json()["target"] == "bus bandwidth node-a↔node-b"
    job.post("node-a")  # the command rides on the next ack
    [command] = job.commands["node-a"]
    assert command["spec"]["peer"] == "10.9.0.2:9482"
    job.answer("node-a", command, 0.25e9)
    done = job.client.get(f"/api/v1/jobs/{job.job}/experiments/{started.json()['id']}", headers=job.viewer).json()
    assert (done["state"], done["verdict"], done["ratio"]) == ("done", "confirmed", pytest.approx(0.25))
    d = job.diagnosis()["diagnosis"]
    assert d["status"] == "confirmed" and "0.25×" in d["confirmation"]
    assert [e["id"] for e in d["experiments"]] == [done["id"]]
    assert any("confirmed" in a["text"] for a in incident(job)["actions"]), "the incident says what was found"


def test_a_slow_data_loader_is_confirmed_from_fresh_telemetry(job):
    learnt(job)
    job.cause = "data_wait"
    job.run(10)
    d = job.diagnosis()["diagnosis"]
    assert (d["layer"], d["ranks"], d["proposed_experiment"]["kind"]) == ("input_pipeline", [1], "data_loader")
    started = job.client.post(f"/api/v1/jobs/{job.job}/experiments", json={}, headers=job.operator).json()
    job.run(8)
    done = job.client.get(f"/api/v1/jobs/{job.job}/experiments/{started['id']}", headers=job.viewer).json()
    assert (done["state"], done["verdict"], done["unit"]) == ("done", "confirmed", "batches/s")
    assert done["ratio"] == pytest.approx(0.004 / 0.084, rel=0.05), "batches/s now against the baseline"
    assert job.diagnosis()["diagnosis"]["status"] == "confirmed"


def test_a_healthy_job_gets_no_diagnosis_and_the_timeline_and_ranks_read_back(job):
    learnt(job)
    job.run(20)
    found = job.diagnosis()
    assert found["state"] == "healthy" and found["diagnosis"] is None
    points = job.client.get(f"/api/v1/jobs/{job.job}/timeline", params={"seconds": 60, "bucket": 10},
                            headers=job.viewer).json()
    assert len(points) == 6 and all(p["iteration_seconds"] == pytest.approx(0.126, rel=0.01) for p in points)
    rows = job.client.get(f"/api/v1/jobs/{job.job}/ranks", headers=job.viewer).json()
    assert [(r["rank"], r["node"]) for r in rows] == [(0, "node-a"), (1, "node-b")]
    assert rows[1]["components"]["compute"] == pytest.approx(0.1)
    assert rows[1]["baseline"]["compute"] == pytest.approx(0.1)


def test_bad_experiment_requests_get_a_precise_error(job, client, make_token):
    learnt(job)
    url = f"/api/v1/jobs/{job.job}/experiments"
    assert client.get("/api/v1/jobs/999/diagnosis", headers=job.viewer).status_code == 404
    assert client.post("/api/v1/jobs/999/experiments", json={"kind": "cpu"}, headers=job.operator).status_code == 404
    assert client.post(url, json={"kind": "cpu", "node": "node-a"}, headers=job.viewer).status_code == 403
    assert client.post(url, json={"kind": "reboot"}, headers=job.operator).status_code == 422
    assert client.post(url, json={"kind": "cpu", "bogus": 1}, headers=job.operator).status_code == 422
    no_diagnosis = client.post(url, json={}, headers=job.operator)
    assert no_diagnosis.status_code == 409 and "name a kind" in no_diagnosis.json()["detail"]
    unknown = client.post(url, json={"kind": "gemm", "node": "node-a", "accelerator": "SIM-nowhere-0"},
                          headers=job.operator)
    assert unknown.status_code == 404 and "SIM-nowhere-0" in unknown.json()["detail"]
    assert client.post(url, json={"kind": "cpu", "node": "node-z"}, headers=job.operator).status_code == 404
    idle = client.post("/api/v1/jobs", json={"name": "idle", "world_size": 1}, headers=job.launcher).json()
    refused = client.post(f"/api/v1/jobs/{idle['id']}/experiments", json={"kind": "cpu", "node": "node-a"},
                          headers=job.operator)
    assert refused.status_code == 422 and "not running" in refused.json()["detail"]
    assert client.get(f"{url}/exp-999", headers=job.viewer).status_code == 404
    assert client.get(f"{url}/nonsense", headers=job.viewer).status_code == 422


def test_a_failed_or_silent_experiment_is_reported_as_such(job, client, clock):
    learnt(job)
    url = f"/api/v1/jobs/{job.job}/experiments"
    failed = client.post(url, json={"kind": "cpu", "node": "node-b", "rank": 1}, headers=job.operator).json()
    silent = client.post(url, json={"kind": "gemm", "node": "node-a", "rank": 0}, headers=job.operator).json()
    job.post("node-b")
    [command] = job.commands["node-b"]
    assert command["spec"]["pids"] == [4001]
    job.answer("node-b", command, None, error="the task processes [4001] are gone or unreadable")
    job.post("node-b", experiments=[{"id": "exp-777", "kind": "cpu", "value": 0.5, "unit": "ratio",
                                     "started_at": clock.time(), "ended_at": clock.time()}])  # unknown: ignored
    out = client.get(f"{url}/{failed['id']}", headers=job.viewer).json()
    assert (out["state"], out["verdict"], out["error"]) == ("failed", None, "the task processes [4001] are gone or "
                                                                            "unreadable")
    job.run(62)
    out = client.get(f"{url}/{silent['id']}", headers=job.viewer).json()
    assert out["state"] == "timed_out" and out["value"] is None and "node-a" in out["error"]


def test_an_agent_token_cannot_run_experiments(job, client, make_token):
    learnt(job)
    answer = client.post(f"/api/v1/jobs/{job.job}/experiments", json={"kind": "cpu", "node": "node-a"},
                         headers=bearer(make_token("agent")))
    assert answer.status_code == 403
