"""The network tier through the real app on SQLite and PostgreSQL: probe targets on the ack (registered agents
only), the matrix route, an unreachable node paged in one report, a NIC port going down drained like a fatal
XID, the port rules, /metrics, and bad input refused at the edge."""

from __future__ import annotations

from typing import Any

import pytest
from fastapi.testclient import TestClient

from sentinel.config import Settings
from tests.conftest import FakeClock, bearer
from tests.factories import registration, report
from tests.remediation.conftest import rt, settle

NODES = ["n0", "n1", "n2", "n3", "n4"]


@pytest.fixture
def settings(tmp_path, database_url: str) -> Settings:  # type: ignore[no-untyped-def]
    return Settings(data_dir=tmp_path / "data", database_url=database_url, metrics_require_token=False,
                    probe_peers=3)


@pytest.fixture
def mesh(client: TestClient, make_token) -> dict[str, Any]:  # type: ignore[no-untyped-def]
    agent = bearer(make_token("agent"))
    for i, name in enumerate(NODES):
        body = registration(name, 1, 1.0) | {"labels": {"probe_addr": f"10.9.0.{i + 1}:9481", "rack": "r1"}}
        assert client.post("/api/v1/nodes/register", json=body, headers=agent).status_code == 200
    body = registration("quiet", 1, 1.0)  # no probe address: neither probes nor is probed
    assert client.post("/api/v1/nodes/register", json=body, headers=agent).status_code == 200
    return {"agent": agent, "seq": {n: 0 for n in [*NODES, "quiet"]}}


def post(client: TestClient, mesh: dict[str, Any], node: str, **extra: Any) -> dict[str, Any]:
    mesh["seq"][node] += 1
    body = report(node, mesh["seq"][node], accelerators=1, interval=1.0) | extra
    answer = client.post(f"/api/v1/nodes/{node}/reports", json=body, headers=mesh["agent"])
    assert answer.status_code == 200, answer.text
    return dict(answer.json())


def probe(target: str, clock: FakeClock, *, rtt: float = 0.0003, sent: int = 5, received: int | None = None) -> dict:
    got = sent if received is None else received
    return {"target": target, "sent": sent, "received": got, "rtt_p50_seconds": rtt if got else None,
            "rtt_p99_seconds": rtt * 2 if got else None, "started_at": clock.time() - 5, "ended_at": clock.time()}


def test_the_ack_names_k_registered_peers_and_nobody_else(client, mesh, clock):
    targets = {n: post(client, mesh, n)["probe_targets"] for n in NODES}
    for name, ts in targets.items():
        assert len(ts) == 3 and name not in {t["node"] for t in ts}
        assert {t["node"] for t in ts} <= set(NODES), "only registered agents with a probe address"
        assert all(t["address"] == f"10.9.0.{NODES.index(t['node']) + 1}:9481" for t in ts)
    assert post(client, mesh, "quiet")["probe_targets"] is None


def test_the_matrix_names_a_slow_link_and_pages_an_unreachable_node(client, mesh, clock, admin_token):
    slow = {frozenset(("n0", "n1"))}
    for src in NODES[:4]:  # n4 is down: its peers lose everything they send it, and it reports nothing
        probes = [probe(dst, clock, rtt=0.02 if frozenset((src, dst)) in slow else 0.0003,
                        received=0 if dst == "n4" else None) for dst in NODES if dst != src]
        post(client, mesh, src, probes=probes)
    settle(client)
    viewer = bearer(admin_token)
    m = client.get("/api/v1/network/matrix", headers=viewer).json()
    assert set(m["participants"]) == set(NODES) and m["peers_per_node"] == 3
    found = m["localisation"]
    assert [(n["node"], n["unreachable"]) for n in found["nodes"]] == [("n4", True)]
    assert [(link["a"], link["b"], link["confident"]) for link in found["links"]] == [("n0", "n1", True)]
    assert m["pairs"][0]["bad"] and len(m["pairs"]) == 16
    assert {p["target"] for p in client.get("/api/v1/network/matrix", params={"node": "n4"},
                                              headers=viewer).json()["pairs"]} == {"n4"}
    [page] = client.get("/api/v1/incidents", params={"detector": "probe_mesh"}, headers=viewer).json()["incidents"]
    assert page["severity"] == "critical" and page["layer"] == "interconnect"
    assert page["title"] == "node n4 unreachable on the probe mesh: 4 peers lost every probe"
    nodes = {n["name"]: n["state"] for n in client.get("/api/v1/nodes", headers=viewer).json()}
    assert nodes["n4"] == "active", "an unreachable node pages; it is not drained on the mesh's word alone"
    # the periodic round adds the slow link, and keeps the unreachable node
    rt(client).detection.evaluate("probe_mesh")
    settle(client)
    titles = sorted(i["title"] for i in client.get("/api/v1/incidents", params={"detector": "probe_mesh"},
                                                   headers=viewer).json()["incidents"])
    assert titles[0].startswith("node n4 unreachable") and titles[1].startswith("slow link n0↔n1: median RTT 20.00 ms")
    metrics = client.get("/metrics").text
    assert 'sentinel_network_probe_rtt_seconds{quantile="0.5"} 0.0003' in metrics
    assert 'sentinel_network_localised{kind="link"} 1.0' in metrics
    assert "sentinel_network_probe_participants 5.0" in metrics


def test_a_nic_port_going_down_drains_the_node_like_a_fatal_xid(client, mesh, clock, admin_token):
    event = {"kind": "link_down", "nic": "mlx5_0/1", "observed_at": clock.time(),
             "message": "mlx5_0 port 1: ACTIVE → DOWN (phys_state Disabled)"}
    post(client, mesh, "n2", events=[event])
    settle(client)
    viewer = bearer(admin_token)
    [incident] = client.get("/api/v1/incidents", params={"detector": "hardware"}, headers=viewer).json()["incidents"]
    assert incident["title"] == "RDMA port mlx5_0/1 left ACTIVE on n2" and incident["layer"] == "interconnect"
    assert incident["severity"] == "critical"
    nodes = {n["name"]: n["state"] for n in client.get("/api/v1/nodes", headers=viewer).json()}
    assert nodes["n2"] == "draining"
    # the same port coming back is recorded, not an incident
    post(client, mesh, "n2", events=[{"kind": "link_up", "nic": "mlx5_0/1", "observed_at": clock.time() + 1}])
    settle(client)
    assert len(client.get("/api/v1/incidents", headers=viewer).json()["incidents"]) == 1


def nic(symbol_errors: int, cnp_rate: float = 0.0) -> dict[str, Any]:
    return {"device": "mlx5_0", "port": 1, "state": "ACTIVE", "state_id": 4, "phys_state": "LinkUp",
            "phys_state_id": 5, "rate_bytes_per_second": 12.5e9, "link_layer": "Ethernet",
            "counters": {"symbol_error": symbol_errors, "port_xmit_data": 10**12},
            "rates": {"np_cnp_sent": cnp_rate}}


def test_the_port_rules_fire_on_counter_growth_and_cnp_storms(client, mesh, clock, admin_token):
    post(client, mesh, "n1", nics=[nic(5)])
    clock.advance(60)
    post(client, mesh, "n1", nics=[nic(5 + 250, cnp_rate=25_000.0)])
    rt(client).detection.evaluate("nic_counters")
    settle(client)
    viewer = bearer(admin_token)
    found = {i["title"]: i for i in client.get("/api/v1/incidents", params={"detector": "nic_counters"},
                                                headers=viewer).json()["incidents"]}
    assert set(found) == {"symbol errors on mlx5_0/1 of n1", "congestion on mlx5_0/1 of n1: 25000 CNPs sent per second"}
    [port] = client.get("/api/v1/network/nics", params={"node": "n1"}, headers=viewer).json()
    assert port["counters"]["symbol_error"] == 255 and port["rates"]["np_cnp_sent"] == 25_000.0


@pytest.mark.parametrize(("extra", "message"), [
    ({"probes": [{"target": "n1", "sent": 2, "received": 3, "started_at": 1.0, "ended_at": 2.0}]}, "received 3"),
    ({"probes": [{"target": "n1", "sent": 2, "received": 2, "rtt_p50_seconds": "NaN", "started_at": 1.0,
                  "ended_at": 2.0}]}, "rtt_p50_seconds"),
    ({"nics": [nic(1) | {"device": "../etc"}]}, "device"),
    ({"nics": [nic(1) | {"counters": {"symbol_error": -1}}]}, "counters"),
    ({"events": [{"kind": "link_down", "nic": "mlx5_0", "observed_at": 1.0}]}, "nic"),
])
def test_bad_network_input_is_refused_with_a_precise_422(client, mesh, extra, message):
    body = report("n0", 99, accelerators=1, interval=1.0) | extra
    answer = client.post("/api/v1/nodes/n0/reports", json=body, headers=mesh["agent"])
    assert answer.status_code == 422 and message in answer.text


def test_the_network_routes_need_a_token_and_check_their_parameters(client, mesh, make_token):
    assert client.get("/api/v1/network/matrix").status_code == 401
    viewer = bearer(make_token("viewer"))
    assert client.get("/api/v1/network/matrix", headers=viewer).status_code == 200
    assert client.get("/api/v1/network/matrix", params={"window": 0}, headers=viewer).status_code == 422
    assert client.get("/api/v1/network/nics", params={"node": "bad name!"}, headers=viewer).status_code == 422
