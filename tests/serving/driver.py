"""A disaggregated serving job driven through the real app's REST API on a fake clock: a prefill replica on
node-a and a decode replica on node-b, each reporting the request sums its SDK recorded (the real recorder, on the
test's clock) every 2 s as an agent would relay them."""

from __future__ import annotations

from typing import Any

from fastapi.testclient import TestClient

from sentinel.sdk.serving import Requests
from tests.conftest import FakeClock, bearer
from tests.factories import registration, report

REPLICAS = (("p0", "prefill", "node-a"), ("d1", "decode", "node-b"))
SLO = {"ttft_seconds": 0.5, "tpot_seconds": 0.05}


class Tick:
    def __init__(self) -> None:
        self.t = 0.0

    def __call__(self) -> float:
        return self.t


class ServingDriver:
    def __init__(self, client: TestClient, make_token: Any, clock: FakeClock, *,
                 attributes: dict[str, Any] | None = None):
        self.client, self.clock = client, clock
        self.agent, self.launcher = bearer(make_token("agent")), bearer(make_token("launcher"))
        self.viewer = bearer(make_token("viewer"))
        for node in ("node-a", "node-b"):
            assert client.post("/api/v1/nodes/register", json=registration(node, 1, 2.0),
                               headers=self.agent).status_code == 200
        attrs = {"slo": SLO, "model_bytes": 16e9} if attributes is None else attributes
        job = client.post("/api/v1/jobs", json={"name": "chat", "kind": "serving", "world_size": 2,
                                                "attributes": attrs}, headers=self.launcher)
        assert job.status_code == 201, job.text
        self.job = int(job.json()["id"])
        for rank, (_, _, node) in enumerate(REPLICAS):
            body = {"rank": rank, "node": node, "accelerators": [f"SIM-{node}-0"], "pid": 5000 + rank}
            assert client.post(f"/api/v1/jobs/{self.job}/tasks", json=body, headers=self.launcher).status_code == 201
        self.tick = Tick()
        self.recorders = [Requests(name, stage, clock=self.tick) for name, stage, _ in REPLICAS]
        self.seq = {"node-a": 0, "node-b": 0}

    def requests(self, rank: int, n: int, *, ttft: float, tpot: float, tokens: int = 8, kv: float = 0.0,
                 failure: str | None = None) -> None:
        """`n` requests through replica `rank`, each timed by the SDK recorder on the test's clock."""
        rec = self.recorders[rank]
        for _ in range(n):
            req = rec.start(prompt_tokens=32)
            if kv:  # a decode replica's KV cache comes from the prefill replica
                req.kv_transfer(kv, 4 << 20, peer=REPLICAS[0][0] if REPLICAS[rank][1] == "decode" else None)
            self.tick.t += ttft
            if failure != "empty":
                req.token()
                for _ in range(tokens - 1):
                    self.tick.t += tpot
                    req.token()
            if failure not in (None, "empty"):
                req.fail(failure)
            rec.finish(req)

    def report(self, rank: int, extra: dict[str, Any] | None = None) -> dict[str, Any]:
        node = REPLICAS[rank][2]
        self.seq[node] += 1
        serving = self.recorders[rank].take() | (extra or {})
        task = {"job_id": self.job, "rank": rank, "pid": 5000 + rank, "serving": serving}
        body = report(node, self.seq[node], accelerators=1, interval=2.0) | {"tasks": [task]}
        answer = self.client.post(f"/api/v1/nodes/{node}/reports", json=body, headers=self.agent)
        assert answer.status_code == 200, answer.text
        return dict(answer.json())

    def round(self, seconds: float = 2.0) -> None:
        self.clock.advance(seconds)
        for rank in range(len(REPLICAS)):
            self.report(rank)

    def serving(self) -> dict[str, Any]:
        answer = self.client.get(f"/api/v1/jobs/{self.job}/serving", headers=self.viewer)
        assert answer.status_code == 200, answer.text
        return dict(answer.json())
