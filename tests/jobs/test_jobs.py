from __future__ import annotations

import pytest

from tests.conftest import bearer
from tests.factories import registration, report


@pytest.fixture
def launcher(client, make_token):  # type: ignore[no-untyped-def]
    client.post("/api/v1/nodes/register", json=registration("node-a", accelerators=2),
                headers=bearer(make_token("agent")))
    return bearer(make_token("launcher", "torchrun-wrapper"))


def test_job_runs_once_every_rank_is_placed(client, launcher):
    job = client.post("/api/v1/jobs", json={"name": "llama-7b", "world_size": 2}, headers=launcher)
    assert job.status_code == 201
    job_id = job.json()["id"]
    assert job.json()["state"] == "pending" and job.json()["owner"] == "launcher:torchrun-wrapper"
    for rank in range(2):
        body = {"rank": rank, "node": "node-a", "accelerators": [f"SIM-node-a-{rank}"], "pid": 100 + rank}
        task = client.post(f"/api/v1/jobs/{job_id}/tasks", headers=launcher, json=body)
        assert task.status_code == 201, task.text
    detail = client.get(f"/api/v1/jobs/{job_id}", headers=launcher).json()
    assert detail["state"] == "running"
    assert [(t["rank"], t["node"], t["accelerators"]) for t in detail["tasks"]] == [
        (0, "node-a", ["SIM-node-a-0"]), (1, "node-a", ["SIM-node-a-1"])]
    assert [j["id"] for j in client.get("/api/v1/jobs", headers=launcher).json()] == [job_id]


def test_agent_learns_its_tasks_in_the_report_ack(client, launcher, make_token):
    job_id = client.post("/api/v1/jobs", json={"name": "j", "world_size": 1}, headers=launcher).json()["id"]
    client.post(f"/api/v1/jobs/{job_id}/tasks", headers=launcher,
                json={"rank": 0, "node": "node-a", "accelerators": ["SIM-node-a-1"], "pid": 4242})
    ack = client.post("/api/v1/nodes/node-a/reports", json=report(seq=1), headers=bearer(make_token("agent"))).json()
    assert ack["assignments"] == [{"job_id": job_id, "rank": 0, "pid": 4242, "accelerators": ["SIM-node-a-1"],
                                   "engine": None}]


def test_a_replica_s_engine_reaches_its_node_s_agent_with_the_assignment(client, launcher, make_token):
    job_id = client.post("/api/v1/jobs", json={"name": "chat", "world_size": 2, "kind": "serving"},
                         headers=launcher).json()["id"]
    engine = "vllm@http://127.0.0.1:8001/metrics#r1"
    made = client.post(f"/api/v1/jobs/{job_id}/tasks", headers=launcher,
                       json={"rank": 1, "node": "node-a", "accelerators": ["SIM-node-a-1"], "pid": 4242,
                             "engine": engine})
    assert made.status_code == 201 and made.json()["engine"] == engine
    for bad in ("vllm@http://10.0.0.7:8001/metrics", "tgi@http://127.0.0.1:8001/metrics",
                "vllm@http://127.0.0.1:8001/metrics#r1:verify", "vllm@http://127.0.0.1.evil.example:80/metrics"):
        refused = client.post(f"/api/v1/jobs/{job_id}/tasks", headers=launcher,
                              json={"rank": 0, "node": "node-a", "pid": 4241, "engine": bad})
        assert refused.status_code == 422, bad  # the agent scrapes what the server names: the node's own only
    ack = client.post("/api/v1/nodes/node-a/reports", json=report(seq=1), headers=bearer(make_token("agent"))).json()
    assert ack["assignments"] == [{"job_id": job_id, "rank": 1, "pid": 4242, "accelerators": ["SIM-node-a-1"],
                                   "engine": engine}]


@pytest.mark.parametrize("task, status, words", [
    ({"rank": 5, "node": "node-a"}, 422, "outside job"),
    ({"rank": 0, "node": "ghost"}, 422, "not registered"),
    ({"rank": 0, "node": "node-a", "accelerators": ["SIM-other-0"]}, 422, "is not on node"),
    ({"rank": 0, "node": "node-a", "accelerators": ["SIM-node-a-0", "SIM-node-a-0"]}, 422, "twice"),
    ({"rank": -1, "node": "node-a"}, 422, ""),
])
def test_bad_tasks_are_refused_precisely(client, launcher, task, status, words):
    job_id = client.post("/api/v1/jobs", json={"name": "j", "world_size": 2}, headers=launcher).json()["id"]
    response = client.post(f"/api/v1/jobs/{job_id}/tasks", json=task, headers=launcher)
    assert response.status_code == status
    assert words in str(response.json()["detail"])


def test_same_rank_twice_is_409_and_cordoned_node_takes_no_tasks(client, launcher, admin_token):
    job_id = client.post("/api/v1/jobs", json={"name": "j", "world_size": 2}, headers=launcher).json()["id"]
    body = {"rank": 0, "node": "node-a", "accelerators": ["SIM-node-a-0"]}
    assert client.post(f"/api/v1/jobs/{job_id}/tasks", json=body, headers=launcher).status_code == 201
    assert client.post(f"/api/v1/jobs/{job_id}/tasks", json=body, headers=launcher).status_code == 409
    client.post("/api/v1/nodes/node-a/cordon", headers=bearer(admin_token))
    cordoned = client.post(f"/api/v1/jobs/{job_id}/tasks", json={**body, "rank": 1}, headers=launcher)
    assert cordoned.status_code == 409 and "cordoned" in cordoned.json()["detail"]


def test_unknown_job_is_404_and_bad_job_spec_is_422(client, launcher):
    assert client.get("/api/v1/jobs/999", headers=launcher).status_code == 404
    missing = client.post("/api/v1/jobs/999/tasks", json={"rank": 0, "node": "node-a"}, headers=launcher)
    assert missing.status_code == 404
    assert client.post("/api/v1/jobs", json={"name": "j", "world_size": 0}, headers=launcher).status_code == 422
    assert client.post("/api/v1/jobs", json={"name": "j", "world_size": 1, "kind": "batch"},
                       headers=launcher).status_code == 422
    assert client.get("/api/v1/jobs/notanumber", headers=launcher).status_code == 422
