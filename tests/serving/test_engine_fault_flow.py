"""An engine core fails and waits for an instruction, end to end: real replica processes of the project's demo
engine (its stand-in of vLLM's fault-tolerance API) behind the launcher's router, the agent's engine watch
reading their status, the real server app deciding (engine_fault) and ordering, the launcher applying the
order, the engine serving again. Retry when nothing speaks against the hardware; scale_down after an XID on
the failed replica's accelerator."""

from __future__ import annotations

import http.client
import io
import json
import sys
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from fastapi.testclient import TestClient

from collectors.engines.watch import EngineWatch
from sentinel.launcher.replicas import ServingProcesses
from sentinel.remediation.executors.base import Action, JobRef
from sentinel.serving.router import Router
from sentinel.telemetry.schemas import Assignment
from tests.conftest import FakeClock, bearer
from tests.factories import registration, report
from tests.live import wait_for
from tests.remediation.conftest import rt, settle

NODE = "node-a"


class Flow:
    """The server's side (agent and launcher tokens), the launcher's replicas, and the agent's engine watch."""

    def __init__(self, client: TestClient, make_token: Any, clock: FakeClock, local: ServingProcesses,
                 router: Router, fault: Path) -> None:
        self.client, self.clock, self.local, self.router, self.fault = client, clock, local, router, fault
        self.agent, self.launcher = bearer(make_token("agent")), bearer(make_token("launcher"))
        self.viewer = bearer(make_token("viewer"))
        assert client.post("/api/v1/nodes/register", json=registration(NODE, 2, 10.0),
                           headers=self.agent).status_code == 200
        job = client.post("/api/v1/jobs", json={"name": "chat", "kind": "serving", "world_size": 2},
                          headers=self.launcher)
        assert job.status_code == 201, job.text
        self.job = local.job_id = int(job.json()["id"])
        local.start_attempt([{"rank": r, "node": NODE, "accelerators": [f"SIM-{NODE}-{r}"]} for r in range(2)], 0)
        wait_for(lambda: all(r["ready"] for r in router.snapshot()["replicas"].values())
                 and len(router.snapshot()["replicas"]) == 2, timeout=30, what="both replicas answering")
        self.placed = [Assignment(job_id=self.job, rank=r.rank, pid=r.proc.pid, accelerators=[f"SIM-{NODE}-{r.rank}"])
                       for r in local.ranks]
        for a in self.placed:
            body = {"rank": a.rank, "node": NODE, "accelerators": a.accelerators, "pid": a.pid}
            assert client.post(f"/api/v1/jobs/{self.job}/tasks", json=body, headers=self.launcher).status_code == 201
        self.watch = EngineWatch([f"{self.job}/{r}=vllm@http://127.0.0.1:{local.ports[r]}/metrics#r{r}"
                                  for r in range(2)])
        self.seq = 0

    def round(self, events: list[dict[str, Any]] | None = None) -> list[Any]:
        """One agent interval: the engines' status relayed in the node's report; then the engine_fault detector."""
        self.clock.advance(10.0)
        self.seq += 1
        tasks = [{"job_id": b.job_id, "rank": b.rank, "pid": b.pid,
                  "serving": b.serving.model_dump(mode="json", exclude_none=True)}
                 for b in self.watch.poll(self.placed) if b.serving is not None]
        body = report(NODE, self.seq, accelerators=2, interval=10.0, events=events) | {"tasks": tasks}
        answer = self.client.post(f"/api/v1/nodes/{NODE}/reports", json=body, headers=self.agent)
        assert answer.status_code == 200, answer.text
        settle(self.client)
        found = rt(self.client).detection.evaluate("engine_fault")
        settle(self.client)
        return found

    def fail_r1(self) -> None:
        Path(str(self.fault).replace("{replica}", "r1")).write_text("engine_core")
        threading.Thread(target=complete, args=(self.local.ports[1],), daemon=True).start()  # its next step fails

    def incident(self) -> dict[str, Any]:
        [found] = self.client.get("/api/v1/incidents", params={"detector": "engine_fault"},
                                  headers=self.viewer).json()["incidents"]
        return dict(self.client.get(f"/api/v1/incidents/{found['id']}", headers=self.viewer).json())

    def carry_out(self, order: dict[str, Any]) -> str:
        """As the launcher does: apply the order here, acknowledge it with the result."""
        outcome = self.local.execute(Action("order", NODE, "test", jobs=(JobRef(self.job, "chat", "serving"),),
                                            order=order))
        ack = self.client.post(f"/api/v1/orders/{order['id']}/ack", headers=self.launcher,
                               json={"status": "done" if outcome.ok else "failed", "detail": outcome.detail})
        assert ack.status_code == 200, ack.text
        return outcome.detail


def complete(port: int, max_tokens: int = 4) -> tuple[int, bytes]:
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
    try:
        conn.request("POST", "/v1/completions", body=json.dumps({"prompt": "hi", "max_tokens": max_tokens,
                                                                 "stream": True}))
        response = conn.getresponse()
        try:
            return response.status, response.read()
        except http.client.IncompleteRead as cut:
            return response.status, cut.partial
    finally:
        conn.close()


@pytest.fixture
def flow(client: TestClient, make_token: Any, clock: FakeClock, tmp_path: Path) -> Iterator[Flow]:
    router = Router(queue_seconds=10.0, read_seconds=5.0)
    fault = tmp_path / "fault-{replica}"
    local = ServingProcesses(argv=[sys.executable, "-m", "sentinel.demo.engine", "--no-telemetry",
                                   "--enable-fault-tolerance", "--step-seconds", "0.01", "--per-request-seconds", "0",
                                   "--max-batch", "8"],
                             nproc=2, env={"ENGINE_FAULT_FILE": str(fault)}, warm=False, out=io.StringIO(),
                             router=router, drain_seconds=1.0)
    try:
        yield Flow(client, make_token, clock, local, router, fault)
    finally:
        local.close(grace_seconds=1)


def adjust_orders(f: Flow) -> list[dict[str, Any]]:
    return [o for o in f.client.get(f"/api/v1/jobs/{f.job}/orders", headers=f.launcher).json()
            if o["kind"] == "adjust"]


def test_a_failed_engine_core_is_retried_and_serves_again(flow: Flow) -> None:
    assert flow.round() == [], "healthy engines: nothing"
    flow.fail_r1()
    wait_for(lambda: bool(flow.round()), timeout=20, what="the engine's status says r1's core waits")
    detail = flow.incident()
    assert "engine core failed on replica r1 (DP rank 1, unhealthy: EngineCoreFault); decided retry: no hardware " \
           f"evidence on node {NODE}'s accelerators SIM-{NODE}-1" in detail["title"]
    assert detail["evidence"]["decision"] == "retry" and "no retry in the last 10 min" in detail["comparison"]
    [order] = adjust_orders(flow)
    assert order["params"] == {"fault_tolerance": "retry", "replicas": ["r1"]}
    assert order["incident_id"] == detail["id"]
    Path(str(flow.fault).replace("{replica}", "r1")).write_text("")  # transient: gone by the time the retry comes
    result = flow.carry_out(order)
    assert "r1 accepted retry (HTTP 202 Request accepted; poll /fault_tolerance/status for updates.)" in result
    assert complete(flow.local.ports[1])[1].rstrip().endswith(b"data: [DONE]"), "it serves again"
    assert flow.round() == [] and rt(flow.client).detection.detectors["engine_fault"].active == set()
    timeline = "\n".join(a["text"] for a in flow.incident()["actions"])
    assert "tells the engine of r1 to retry" in timeline and "r1 accepted retry" in timeline, timeline


def test_after_an_xid_on_its_accelerator_the_engine_is_scaled_down(flow: Flow) -> None:
    flow.round(events=[{"kind": "xid", "accelerator_uuid": f"SIM-{NODE}-1", "xid": 79,
                        "observed_at": flow.clock.time()}])
    flow.fail_r1()
    wait_for(lambda: bool(flow.round()), timeout=20, what="the engine's status says r1's core waits")
    detail = flow.incident()
    assert "decided scale_down: hardware evidence on node node-a's accelerators SIM-node-a-1 (replica r1): " \
           "xid 79 on SIM-node-a-1 0 min ago" in detail["title"], detail["title"]
    assert detail["layer"] == "hardware"
    [order] = adjust_orders(flow)
    assert order["params"] == {"fault_tolerance": "scale_down", "replicas": ["r1"]}
    result = flow.carry_out(order)  # the fault stays in the file: the failed part is gone
    assert "r1 accepted scale_down (HTTP 202" in result, result
    assert complete(flow.local.ports[1])[1].rstrip().endswith(b"data: [DONE]"), "it serves again, smaller"
    assert flow.round() == []
