"""`network_exclude_slow_nodes`: both ends of a slow link the mesh names take no new work while it holds;
off (the default), the same link pages and placement goes on as before."""

from __future__ import annotations

from typing import Any

import pytest
from fastapi.testclient import TestClient

from sentinel.config import Settings
from tests.conftest import FakeClock, bearer
from tests.network.test_network_api import NODES, mesh, post, probe  # noqa: F401 - `mesh` is a fixture
from tests.remediation.conftest import settle


@pytest.fixture(params=[True, False], ids=["exclude", "default"])
def settings(request: pytest.FixtureRequest, tmp_path, database_url: str) -> Settings:  # type: ignore[no-untyped-def]
    return Settings(data_dir=tmp_path / "data", database_url=database_url, metrics_require_token=False,
                    probe_peers=3, network_exclude_slow_nodes=request.param)


def test_a_slow_link_keeps_new_work_off_both_ends_when_asked(client: TestClient, mesh: dict[str, Any],  # noqa: F811
                                                             clock: FakeClock, settings: Settings,
                                                             make_token) -> None:  # type: ignore[no-untyped-def]
    for src in NODES:
        post(client, mesh, src, probes=[probe(dst, clock, rtt=0.03 if {src, dst} == {"n0", "n1"} else 0.0003)
                                        for dst in NODES if dst != src])
    settle(client)
    viewer = bearer(make_token("viewer"))
    m = client.get("/api/v1/network/matrix", headers=viewer).json()
    assert [(link["a"], link["b"]) for link in m["localisation"]["links"]] == [("n0", "n1")]
    launcher = bearer(make_token("launcher"))
    job = client.post("/api/v1/jobs", json={"name": "llm", "world_size": 2}, headers=launcher).json()["id"]
    placed = client.post(f"/api/v1/jobs/{job}/placement", json={}, headers=launcher)
    assert placed.status_code == 200, placed.text
    nodes = {slot["node"] for slot in placed.json()}
    if settings.network_exclude_slow_nodes:
        assert m["excluded"] == {"n0": "an end of slow link n0↔n1", "n1": "an end of slow link n0↔n1"}
        assert nodes.isdisjoint({"n0", "n1"}), nodes
    else:
        assert m["excluded"] == {}
        assert "n0" in nodes, "without the setting, placement is as before (best-fit takes n0 first)"
