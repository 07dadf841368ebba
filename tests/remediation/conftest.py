"""The remediation tests' world: the real app on SQLite and PostgreSQL, two nodes, a 2-rank job."""

from __future__ import annotations

from typing import Any

import pytest
from fastapi.testclient import TestClient

from sentinel.config import Settings
from sentinel.runtime import Runtime
from tests.conftest import FakeClock, bearer
from tests.factories import registration, report


@pytest.fixture
def overrides() -> dict[str, Any]:
    return {}


@pytest.fixture
def settings(tmp_path, database_url: str, overrides: dict[str, Any]) -> Settings:  # type: ignore[no-untyped-def]
    return Settings(data_dir=tmp_path / "data", database_url=database_url, metrics_require_token=False,
                    **overrides)


def rt(client: TestClient) -> Runtime:
    runtime: Runtime = client.app.state.runtime  # type: ignore[attr-defined]
    return runtime


def settle(client: TestClient) -> None:
    assert rt(client).detection.drain() and rt(client).remediation.drain()


@pytest.fixture
def fleet(client: TestClient, make_token) -> dict[str, Any]:  # type: ignore[no-untyped-def]
    """Two nodes with two accelerators each, and a 2-rank job on node-a."""
    agent, launcher = bearer(make_token("agent")), bearer(make_token("launcher"))
    for name in ("node-a", "node-b"):
        assert client.post("/api/v1/nodes/register", json=registration(name, 2, 1.0), headers=agent).status_code == 200
    job = client.post("/api/v1/jobs", json={"name": "llm", "world_size": 2}, headers=launcher).json()
    placement = client.post(f"/api/v1/jobs/{job['id']}/placement", json={}, headers=launcher)
    assert placement.status_code == 200, placement.text
    for slot in placement.json():
        body = {"rank": slot["rank"], "node": slot["node"], "accelerators": slot["accelerators"],
                "pid": 1000 + slot["rank"]}
        assert client.post(f"/api/v1/jobs/{job['id']}/tasks", json=body, headers=launcher).status_code == 201
    return {"agent": agent, "launcher": launcher, "job": job["id"], "placement": placement.json(), "seq": [0]}


def xid(client: TestClient, fleet: dict[str, Any], code: int, uuid: str, clock: FakeClock) -> None:
    fleet["seq"][0] += 1
    node = uuid.rsplit("-", 1)[0].removeprefix("SIM-")
    body = report(node=node, seq=fleet["seq"][0], interval=1.0,
                  events=[{"kind": "xid", "accelerator_uuid": uuid, "xid": code, "observed_at": clock.time()}])
    assert client.post(f"/api/v1/nodes/{node}/reports", json=body, headers=fleet["agent"]).status_code == 200
    settle(client)


def health(client: TestClient, token: str) -> dict[str, str]:
    return {a["uuid"]: a["health"] for a in client.get("/api/v1/accelerators", headers=bearer(token)).json()}


def timeline(client: TestClient, token: str, detector: str = "hardware") -> str:
    [incident] = client.get("/api/v1/incidents", params={"detector": detector, "state": "all"},
                            headers=bearer(token)).json()["incidents"]
    return "\n".join(a["text"] for a in client.get(f"/api/v1/incidents/{incident['id']}",
                                                   headers=bearer(token)).json()["actions"])


