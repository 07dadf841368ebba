"""Exits that lie (SkyPilot #4421, vLLM #48966): exit 0 is a failure when the process ended right after an error
the SDK saw (a step or collective that raised, none good after it), or when its peers still wait for it
hang_exit_grace_seconds later. A normal end (every rank exits 0 within seconds) stays a success.

Real pieces: a training process with the real SDK posting to an HTTP endpoint, the agent's TaskRelay, the
server app on SQLite and PostgreSQL; the peers-waiting rule on the real live views with a fake clock."""

from __future__ import annotations

import http.client
import json
import os
import subprocess
import sys
from typing import Any

import pytest
from fastapi.testclient import TestClient

from collectors.jobs import TaskRelay
from sentinel.detection.detectors.hang import HungTask
from sentinel.incidents.findings import Finding
from sentinel.runtime import Runtime
from sentinel.telemetry.schemas import SdkBatch
from tests.conftest import FakeClock, bearer
from tests.detection.streams import World
from tests.factories import registration, report
from tests.live import wait_for
from tests.sdk.test_telemetry import RecordingAgent

TRAIN = """
import sys, sentinel.sdk
tel = sentinel.sdk.init(job_id=5, rank=1, agent_url={url!r})
for step in range(5):
    with tel.step(tokens=8):
        pass
try:
    with tel.step(tokens=8), tel.collective("all_reduce"):
        {body}
except {caught} as exc:
    print("training stopped:", exc)  # the wrapper that turns a collective error into a clean exit
{after}
sys.exit(0)
"""


def train(agent: RecordingAgent, body: str, caught: str = "RuntimeError", after: str = "") -> tuple[int, list[Any]]:
    """Run a rank that exits 0; returns its pid and every batch its SDK sent."""
    script = TRAIN.format(url=agent.url, body=body, caught=caught, after=after)
    result = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stderr
    batches = [SdkBatch.model_validate(b) for b in agent.batches]
    return batches[0].pid, batches


@pytest.fixture
def agent():
    a = RecordingAgent()
    yield a
    a.close()


def test_a_process_that_exits_0_right_after_a_failed_collective_says_what_it_ended_on(agent):
    _, batches = train(agent, 'raise RuntimeError("Connection closed by peer [10.0.0.2]:29500")')
    failures = [b.failure for b in batches if b.failure is not None]
    assert [(f.type, f.message) for f in failures] == [
        ("RuntimeError", "step 6 raised: Connection closed by peer [10.0.0.2]:29500")]


@pytest.mark.parametrize(("body", "caught", "after"), [
    ("raise StopIteration", "StopIteration", ""),  # the end of the data, through a step: a normal end
    ('raise RuntimeError("CUDA out of memory")', "RuntimeError",  # skipped the batch and went on
     "with tel.step(tokens=8):\n    pass"),
], ids=["end-of-data", "recovered"])
def test_a_normal_end_or_a_recovered_step_sends_no_failure(agent, body, caught, after):
    _, batches = train(agent, body, caught, after)
    assert [b.failure for b in batches if b.failure is not None] == []


# -- the server: the exit report carries the final batch (the agent drains its relay into it) -----------------------

@pytest.fixture
def placed(client: TestClient, make_token) -> tuple[dict[str, str], dict[str, str]]:
    agent_auth = bearer(make_token("agent"))
    assert client.post("/api/v1/nodes/register", json=registration("node-a", 2, interval=10.0),
                       headers=agent_auth).status_code == 200
    return agent_auth, bearer(make_token("launcher"))


def place(client: TestClient, launcher: dict[str, str], pids: list[int], kind: str = "training") -> int:
    job_id = int(client.post("/api/v1/jobs", json={"name": "llm", "world_size": len(pids), "kind": kind},
                             headers=launcher).json()["id"])
    for rank, pid in enumerate(pids):
        body = {"rank": rank, "node": "node-a", "accelerators": [f"SIM-node-a-{rank}"], "pid": pid}
        assert client.post(f"/api/v1/jobs/{job_id}/tasks", json=body, headers=launcher).status_code == 201
    return job_id


def post(client: TestClient, agent_auth: dict[str, str], body: dict[str, Any]) -> None:
    response = client.post("/api/v1/nodes/node-a/reports", json=body, headers=agent_auth)
    assert response.status_code == 200, response.text
    runtime: Runtime = client.app.state.runtime  # type: ignore[attr-defined]
    assert runtime.detection.drain()


def test_exit_0_after_the_sdk_saw_a_collective_error_is_a_failure_end_to_end(client, placed, admin_token, agent,
                                                                              clock: FakeClock):
    agent_auth, launcher = placed
    pid, batches = train(agent, 'raise RuntimeError("Connection closed by peer")')
    relay = TaskRelay()
    for batch in batches:
        relay.add(batch.model_copy(update={"job_id": 1}))
    job_id = place(client, launcher, [pid + 1, pid])  # rank 1 is the process that ran
    assert job_id == 1
    body = report(seq=1, accelerators=0, interval=10.0)
    body["tasks"] = [t.model_dump(mode="json") for t in relay.drain()]
    body["task_exits"] = [{"job_id": job_id, "rank": 1, "pid": pid, "exit_code": 0, "observed_at": clock.time()}]
    post(client, agent_auth, body)

    admin = bearer(admin_token)
    tasks = {t["rank"]: t for t in client.get(f"/api/v1/jobs/{job_id}", headers=admin).json()["tasks"]}
    assert (tasks[1]["state"], tasks[1]["exit_code"], tasks[1]["failure_reason"]) == (
        "failed", 0, "exit:0+exception:RuntimeError")
    metrics = client.get(f"/api/v1/jobs/{job_id}/metrics", headers=admin).json()
    assert metrics["task_failures"] == {"exit:0+exception:RuntimeError": 1}
    [event] = client.get("/api/v1/events", params={"kind": "task_failed"}, headers=admin).json()
    assert "exited with code 0 right after a RuntimeError: counted as a failure" in event["message"]
    [incident] = client.get("/api/v1/incidents", params={"detector": "task_exit"}, headers=admin).json()["incidents"]
    assert (incident["job_id"], incident["rank"]) == (job_id, 1)
    assert "counted as a failure" in incident["title"]
    assert "step 6 raised: Connection closed by peer" in incident["seen"] and "exited 0" in incident["seen"]


def test_a_normal_end_exit_0_on_every_rank_is_a_success(client, placed, admin_token, clock: FakeClock):
    agent_auth, launcher = placed
    job_id = place(client, launcher, [1000, 1001])
    body = report(seq=1, accelerators=0, interval=10.0)
    body["tasks"] = [{"job_id": job_id, "rank": r, "pid": 1000 + r, "steps": 10, "last_step": 100,
                      "step_seconds": [0.5] * 10} for r in range(2)]
    post(client, agent_auth, body)
    clock.advance(10.0)
    body = report(seq=2, accelerators=0, interval=10.0)
    body["task_exits"] = [{"job_id": job_id, "rank": r, "pid": 1000 + r, "exit_code": 0,
                           "observed_at": clock.time() - 1.5 + r} for r in range(2)]  # within a second or two
    post(client, agent_auth, body)
    runtime: Runtime = client.app.state.runtime
    for seq in range(3, 12):  # well past hang_exit_grace_seconds
        clock.advance(10.0)
        post(client, agent_auth, report(seq=seq, accelerators=0, interval=10.0))
        runtime.detection.evaluate()
    admin = bearer(admin_token)
    tasks = client.get(f"/api/v1/jobs/{job_id}", headers=admin).json()["tasks"]
    assert {(t["state"], t["failure_reason"]) for t in tasks} == {("exited", "")}
    assert client.get("/api/v1/incidents", params={"state": "all"}, headers=admin).json()["incidents"] == []


def test_a_rank_that_exits_while_its_peer_still_waits_is_named_end_to_end(client, placed, admin_token,
                                                                          clock: FakeClock):
    """Through the app as it is wired today: the pipeline does not hand the exit's reason to the live view, so
    the incident says "ended (exit status not known)"; the rule and the rank it names are the same."""
    agent_auth, launcher = placed
    job_id = place(client, launcher, [1000, 1001])
    runtime: Runtime = client.app.state.runtime
    admin = bearer(admin_token)
    for seq, t in enumerate(range(0, 200, 10), start=1):
        body = report(seq=seq, accelerators=0, interval=10.0)
        if t <= 100:  # both step 0.5 s steps; at 100 rank 1 exits 0 (its exit report carries its last batch) and
            # rank 0 waits for it in the next all-reduce
            body["tasks"] = [{"job_id": job_id, "rank": r, "pid": 1000 + r, "steps": 20, "last_step": 2 * t + 20,
                              "step_seconds": [0.5] * 20} for r in range(2)]
        if t == 100:
            body["task_exits"] = [{"job_id": job_id, "rank": 1, "pid": 1001, "exit_code": 0,
                                   "observed_at": clock.time()}]
        post(client, agent_auth, body)
        runtime.detection.evaluate()
        found = client.get("/api/v1/incidents", headers=admin).json()["incidents"]
        if t <= 100 + 60:
            assert found == [], f"t={t}: within hang_exit_grace_seconds rank 0 may be finishing"
        clock.advance(10.0)
    [incident] = found
    assert (incident["detector"], incident["job_id"], incident["rank"]) == ("hang", job_id, 1)
    assert "while its peers still waited: counted as a failure" in incident["title"]
    assert incident["recommended_action"] == "restart_task"


# -- the peers-waiting rule on the live views -------------------------------------------------------------------------

def waiting_world(*, peers_step: bool = False, both_exit: bool = False, restarting: bool = False,
                  seconds: float = 200.0) -> list[tuple[float, Finding]]:
    """Two ranks stepping 0.5 s steps, reported every 10 s; at t=100 rank 1 exits 0 (the pipeline tells the live
    view the reason, ''); rank 0 then waits, or steps on (`peers_step`), or exits 0 too a second later."""
    world = World()
    uuids = world.add_node("node-w", accelerators=2)
    for rank in range(2):
        world.place(3, rank, "node-w", [uuids[rank]])
    world.ctx.restarting = lambda job_id, attempt: restarting
    detector = HungTask(world.settings)
    live = world.fleet.get("node-w")
    assert live is not None
    fired: list[tuple[float, Finding]] = []
    t = 0.0
    while t < seconds:
        world.advance(10.0)
        t += 10.0
        live.last_seen = world.now
        for rank in range(2):
            if t <= 100 or (rank == 0 and peers_step):
                world.steps("node-w", 3, rank, [0.5] * 20)
        if t == 100:
            world.jobs.mark_ended(3, 1, 1001, reason="", at=world.now - 0.5)
            if both_exit:
                world.jobs.mark_ended(3, 0, 1000, reason="", at=world.now + 0.5)
        fired += [(t, f) for f in world.evaluate(detector).findings]
    return fired


def test_exit_0_while_the_peers_still_wait_is_a_failure_after_the_grace():
    fired = waiting_world()
    assert fired and all(at - 99.5 > 60 for at, _ in fired), "not while the peers may be finishing"
    at, finding = fired[0]
    assert at == 160.0, "at the first round past hang_exit_grace_seconds after the exit (at 99.5)"
    assert finding.subject.rank == 1 and finding.action == "restart_task" and finding.severity == "critical"
    assert "rank 1 exited 0 on node-w while its peers still waited: counted as a failure" in finding.title
    assert "Exited 0 while its peers still waited: counted as a failure." in finding.seen
    assert finding.evidence["exit"]["reason"] == "exit:0+peers-waiting"
    assert [w["rank"] for w in finding.evidence["waiting_ranks"]] == [0]


@pytest.mark.parametrize("case", ["both-exit", "peers-step", "restarting"])
def test_no_failure_when_the_job_ended_normally_the_peers_step_on_or_sentinel_restarts_it(case):
    fired = waiting_world(both_exit=case == "both-exit", peers_step=case == "peers-step",
                          restarting=case == "restarting")
    assert [f.title for _, f in fired if "exited 0" in f.title] == []
    if case != "restarting":
        assert fired == []


# -- a serving engine that exits 0 with requests in flight (vLLM #48966) -------------------------------------------

def test_an_engine_that_exits_0_with_requests_in_flight_failed_end_to_end(client, placed, admin_token, agent, tmp_path,
                                                                         clock: FakeClock):
    """The project's own serving engine (sentinel/demo/engine.py), a real process with the real SDK, streams 3
    requests and exits 0 mid-answer; its last batch came a report before the exit, as after an os._exit."""
    agent_auth, launcher = placed
    fault = tmp_path / "fault"
    engine = subprocess.Popen([sys.executable, "-m", "sentinel.demo.engine", "--port", "0", "--fault-file", str(fault)],
                              env={**os.environ, "SENTINEL_AGENT_URL": agent.url, "SENTINEL_JOB_ID": "1", "RANK": "0"},
                              stdout=subprocess.PIPE, text=True)
    try:
        port = int(engine.stdout.readline().split("http://127.0.0.1:")[1].split()[0])  # type: ignore[union-attr]
        streams = [http.client.HTTPConnection("127.0.0.1", port, timeout=30) for _ in range(3)]
        for conn in streams:
            conn.request("POST", "/v1/completions", body=json.dumps({"prompt": "hi", "max_tokens": 100000,
                                                                     "stream": True}))
            conn.getresponse().readline()  # the first token is out: the request is in flight
        wait_for(lambda: any((b.get("serving") or {}).get("running") == 3 for b in agent.batches), timeout=10,
                 what="a batch saying 3 requests in flight")
        fault.write_text("exit0")
        assert engine.wait(timeout=10) == 0, "the engine exits 0, as vLLM's front end does when its core died"
    finally:
        engine.kill()
        engine.wait()
    relay = TaskRelay()
    for batch in agent.batches:
        relay.add(SdkBatch.model_validate(batch))
    pid = agent.batches[0]["pid"]
    job_id = int(client.post("/api/v1/jobs", json={"name": "chat", "world_size": 1, "kind": "serving"},
                             headers=launcher).json()["id"])
    assert client.post(f"/api/v1/jobs/{job_id}/tasks", json={
        "rank": 0, "node": "node-a", "accelerators": ["SIM-node-a-0"], "pid": pid}, headers=launcher).status_code == 201
    body = report(seq=1, accelerators=0, interval=10.0)
    body["tasks"] = [t.model_dump(mode="json") for t in relay.drain()]
    post(client, agent_auth, body)
    clock.advance(10.0)
    body = report(seq=2, accelerators=0, interval=10.0)
    body["task_exits"] = [{"job_id": job_id, "rank": 0, "pid": pid, "exit_code": 0, "observed_at": clock.time()}]
    post(client, agent_auth, body)

    admin = bearer(admin_token)
    [task] = client.get(f"/api/v1/jobs/{job_id}", headers=admin).json()["tasks"]
    assert (task["state"], task["exit_code"], task["failure_reason"]) == ("failed", 0, "exit:0+in_flight")
    [incident] = client.get("/api/v1/incidents", params={"detector": "task_exit"}, headers=admin).json()["incidents"]
    assert "exited with code 0 with 3 request(s) in flight: counted as a failure" in incident["title"]
    assert "vLLM #48966" in incident["seen"]


def test_a_serving_replica_that_exits_0_with_nothing_in_flight_has_stopped_serving(client, placed, admin_token,
                                                                                    clock: FakeClock):
    """An idle vLLM whose engine core died exits 0 too (vLLM #48966, reproduced in test_vllm_live.py): a replica
    that nothing stopped has stopped serving, and the job has one fewer. A training rank's exit 0 is success."""
    agent_auth, launcher = placed
    job_id = place(client, launcher, [1000], kind="serving")
    body = report(seq=1, accelerators=0, interval=10.0)
    body["tasks"] = [{"job_id": job_id, "rank": 0, "pid": 1000, "serving": {"replica": "r0", "requests": 20,
                                                                            "running": 0}}]
    post(client, agent_auth, body)
    body = report(seq=2, accelerators=0, interval=10.0)
    body["task_exits"] = [{"job_id": job_id, "rank": 0, "pid": 1000, "exit_code": 0, "observed_at": clock.time()}]
    post(client, agent_auth, body)
    [task] = client.get(f"/api/v1/jobs/{job_id}", headers=bearer(admin_token)).json()["tasks"]
    assert (task["state"], task["failure_reason"]) == ("failed", "exit:0+serving")
    [incident] = client.get("/api/v1/incidents", params={"detector": "task_exit"},
                            headers=bearer(admin_token)).json()["incidents"]
    assert "exited with code 0 though nothing stopped it" in incident["title"]
    assert "a serving replica does not end on its own" in incident["seen"]
    training = place(client, launcher, [1001])
    body = report(seq=3, accelerators=0, interval=10.0)
    body["task_exits"] = [{"job_id": training, "rank": 0, "pid": 1001, "exit_code": 0, "observed_at": clock.time()}]
    post(client, agent_auth, body)
    [task] = client.get(f"/api/v1/jobs/{training}", headers=bearer(admin_token)).json()["tasks"]
    assert (task["state"], task["failure_reason"]) == ("exited", ""), "a training rank that exits 0 finished"
