"""The network tier on a real network: 16 agents, each in its own namespace on a bridge, probing each other
over UDP; a Sentinel server on the bridge. A link cut with `ip link set … down`, one pair slowed through the
TUN delay line, and a NIC port (a fixture sysfs tree) going down are real faults the server must place.
Timings are asserted loosely here; benchmarks/network.py measures them."""

from __future__ import annotations

import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.collectors.rdma_tree import HW_COUNTERS, RdmaTree
from tests.live import sentinel_cmd, wait_for
from tests.network.mesh import Mesh, node_name, opened_after, wait_incident
from tests.network.netlab import Lab

pytestmark = [pytest.mark.netns, pytest.mark.slow]
HOSTS = 16


@pytest.fixture(scope="module")
def tree(tmp_path_factory: pytest.TempPathFactory) -> RdmaTree:
    t = RdmaTree(tmp_path_factory.mktemp("sys"))
    t.add_port("mlx5_0", 1, hw_counters=dict(HW_COUNTERS))
    return t


@pytest.fixture(scope="module")
def mesh(tmp_path_factory: pytest.TempPathFactory, tree: RdmaTree) -> Iterator[Mesh]:
    reason = Lab.available()
    if reason is not None:
        pytest.skip(reason)
    # 16 namespaces of Python responders on a 2-core runner: a healthy pair's median RTT reached 8.4 ms in CI,
    # over the 5 ms default. The slowed pair below is 40 ms slower, so 15 ms still tells it from the rest.
    built = Mesh(Path(tmp_path_factory.mktemp("mesh")), HOSTS, rdma_roots={0: tree.root},
                 env={"SENTINEL_PROBE_RTT_SECONDS": "0.015"}).start()
    yield built
    built.close()


def test_every_agent_probes_only_registered_peers(mesh: Mesh) -> None:
    m = mesh.matrix(limit=10_000)
    names = {node_name(i) for i in range(HOSTS)}
    assert set(m["participants"]) == names
    assert {p["source"] for p in m["pairs"]} <= names and {p["target"] for p in m["pairs"]} <= names
    healthy = [p for p in m["pairs"] if p["received"]]
    assert healthy and all(p["rtt_p50_seconds"] < 0.05 for p in healthy)
    time.sleep(6)  # three probe rounds
    named = [i["title"] for i in opened_after(mesh.incidents(detector="probe_mesh"), mesh.ready_at)]
    assert named == [], "a healthy mesh names nothing"


def test_a_slowed_pair_is_localised_to_that_link(mesh: Mesh) -> None:
    assert mesh.lab is not None
    t0 = time.time()
    mesh.lab.degrade_pair(3, 10, delay_seconds=0.02)
    try:
        _, incident = wait_incident(mesh, t0, 60, title="slow link", detector="probe_mesh")
        assert incident["title"].startswith("slow link n03↔n10: median RTT"), incident["title"]
        others = [i["title"] for i in opened_after(mesh.incidents(detector="probe_mesh"), t0)]
        assert others == [incident["title"]], "nothing but the slowed pair is named"
    finally:
        mesh.lab.restore_pair(3, 10)


def test_a_cut_link_is_paged_unreachable_at_once_and_drains_nothing(mesh: Mesh) -> None:
    assert mesh.lab is not None
    t0 = time.time()
    mesh.lab.link_down(6)
    try:
        seconds, incident = wait_incident(mesh, t0, 20, title="unreachable", node="n06")
        assert incident["title"].startswith("node n06 unreachable on the probe mesh")
        assert incident["severity"] == "critical" and incident["layer"] == "interconnect"
        assert seconds < 10, f"took {seconds:.1f}s"
        assert mesh.nodes()["n06"]["state"] == "active", "a partition pages; it drains nothing on its own"
        fresh = opened_after(mesh.incidents(detector="probe_mesh"), t0)
        unreachable = [i for i in fresh if "unreachable" in i["title"]]
        assert [i["node"] for i in unreachable] == ["n06"], "its probers' own losses name nobody else"
    finally:
        mesh.lab.link_up(6)


def test_a_nic_port_going_down_is_an_incident_and_drains_the_node(mesh: Mesh, tree: RdmaTree) -> None:
    wait_for(lambda: any(p["device"] == "mlx5_0" for p in _ports(mesh)), timeout=20, what="n00's RDMA port")
    t0 = time.time()
    tree.set_state("mlx5_0", 1, "1: DOWN", "3: Disabled")
    seconds, incident = wait_incident(mesh, t0, 20, detector="hardware", node="n00")
    assert incident["title"] == "RDMA port mlx5_0/1 left ACTIVE on n00" and incident["severity"] == "critical"
    assert seconds < 10, f"took {seconds:.1f}s"
    wait_for(lambda: mesh.nodes()["n00"]["state"] in ("draining", "drained"), timeout=20, what="n00 drained")
    wait_for(lambda: any(p["state"] == "DOWN" for p in _ports(mesh)), timeout=20,
             what="the port reported DOWN")


def test_the_cli_shows_the_mesh_and_the_ports(mesh: Mesh) -> None:
    assert mesh.server is not None
    remote = ["--server", mesh.server.url, "--token", mesh.server.admin_token]
    shown = subprocess.run(sentinel_cmd("network", *remote), capture_output=True, text=True, timeout=60, check=True)
    assert shown.stdout.startswith(f"probe mesh: {HOSTS} agents, 6 peers each per 2s round"), shown.stdout
    assert "SOURCE" in shown.stdout and "RTT P50 MS" in shown.stdout
    ports = subprocess.run(sentinel_cmd("network", *remote, "nics"), capture_output=True, text=True, timeout=60,
                           check=True)
    assert "n00" in ports.stdout and "mlx5_0/1" in ports.stdout and "1 port(s)" in ports.stdout, ports.stdout


def _ports(mesh: Mesh) -> list[dict[str, object]]:
    with mesh.api() as api:
        return list(api.get("/network/nics", params={"node": "n00"}).json())
