"""A 2-rank job driven through the real app's REST API on a fake clock: each rank on its own node reports its
step decomposition every 2 s as an agent would relay it, a cause grows one component from a chosen moment, and
the test plays the agents' part for experiments (takes the command from the report ack, answers it)."""

from __future__ import annotations

from typing import Any

import httpx
from fastapi.testclient import TestClient

from sentinel.runtime import Runtime
from tests.conftest import FakeClock, bearer
from tests.factories import registration, report
from tests.remediation.conftest import rt

BASE = {"compute": 0.10, "communication": 0.02, "data_wait": 0.004, "checkpoint": 0.002}
NODES = ("node-a", "node-b")


class JobDriver:
    def __init__(self, client: TestClient | httpx.Client, make_token: Any, clock: FakeClock, *,
                 checkpoint_dir: str = "/tmp", runtime: Runtime | None = None, job_id: int | None = None):
        self.client, self.clock = client, clock
        self.runtime = runtime or rt(client)  # type: ignore[arg-type]
        self.agent, self.launcher = bearer(make_token("agent")), bearer(make_token("launcher"))
        self.operator, self.viewer = bearer(make_token("operator")), bearer(make_token("viewer"))
        for i, node in enumerate(NODES):
            body = registration(node, 1, 2.0) | {"labels": {"probe_addr": f"10.9.0.{i + 1}:9482"}}
            assert client.post("/api/v1/nodes/register", json=body, headers=self.agent).status_code == 200
        while True:  # up to the id asked for ("what is wrong with job 7?")
            job = client.post("/api/v1/jobs", json={"name": "moe", "world_size": 2,
                                                    "attributes": {"checkpoint_dir": checkpoint_dir}},
                              headers=self.launcher).json()
            if job_id is None or int(job["id"]) >= job_id:
                break
        self.job = int(job["id"])
        for rank, node in enumerate(NODES):
            body = {"rank": rank, "node": node, "accelerators": [f"SIM-{node}-0"], "pid": 4000 + rank}
            assert client.post(f"/api/v1/jobs/{self.job}/tasks", json=body, headers=self.launcher).status_code == 201
        self.seq = dict.fromkeys(NODES, 0)
        self.steps = [0, 0]
        self.commands: dict[str, list[dict[str, Any]]] = {n: [] for n in NODES}
        self.cause: str | None = None
        self.extra = 0.08

    def task(self, rank: int) -> dict[str, Any]:
        parts = dict(BASE)
        if self.cause == "communication" or (self.cause and rank != 1):
            parts["communication"] += self.extra  # a slow link, or waiting for rank 1 inside the all-reduce
        elif self.cause:
            parts[self.cause] += self.extra
        n = 10
        busy = parts["compute"] + parts["communication"]
        iteration = busy + parts["data_wait"] + parts["checkpoint"]
        self.steps[rank] += n
        return {"job_id": self.job, "rank": rank, "pid": 4000 + rank, "steps": n, "last_step": self.steps[rank],
                "step_seconds": [busy] * n, "tokens": 4096 * n, "busy_seconds": busy * n,
                "collective_seconds": parts["communication"] * n,
                "exposed_collective_seconds": parts["communication"] * n, "iterations": n,
                "iteration_seconds": iteration * n,
                "phases": {"data_wait": parts["data_wait"] * n, "checkpoint": parts["checkpoint"] * n},
                "cpu_wait_ratio": 0.03}

    def post(self, node: str, **extra: Any) -> dict[str, Any]:
        self.seq[node] += 1
        body = report(node, self.seq[node], accelerators=1, interval=2.0) | extra
        answer = self.client.post(f"/api/v1/nodes/{node}/reports", json=body, headers=self.agent)
        assert answer.status_code == 200, answer.text
        ack = dict(answer.json())
        self.commands[node] += [c for c in ack.get("commands", []) if c["kind"] == "experiment"]
        return ack

    def run(self, seconds: float) -> None:
        """Report every 2 s for `seconds`, and let the slowdown detector evaluate after each round."""
        for _ in range(int(seconds / 2)):
            self.clock.advance(2.0)
            for rank, node in enumerate(NODES):
                self.post(node, tasks=[self.task(rank)])
            self.runtime.detection.evaluate("slowdown")

    def answer(self, node: str, command: dict[str, Any], value: float | None, unit: str = "bytes/s",
               error: str | None = None) -> None:
        spec = command["spec"]
        result = {"id": spec["id"], "kind": spec["kind"], "value": value, "unit": unit, "detail": "measured",
                  "error": error, "started_at": self.clock.time() - 1, "ended_at": self.clock.time()}
        self.post(node, experiments=[{k: v for k, v in result.items() if v is not None}])

    def answer_calibrations(self, value: float = 1e9) -> None:
        for node in NODES:
            pending, self.commands[node] = self.commands[node], []
            for command in pending:
                self.answer(node, command, value)

    def diagnosis(self) -> dict[str, Any]:
        answer = self.client.get(f"/api/v1/jobs/{self.job}/diagnosis", headers=self.viewer)
        assert answer.status_code == 200, answer.text
        return dict(answer.json())
