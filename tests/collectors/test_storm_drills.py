"""Storm drills with real agents against a real server process: an application-XID storm across a 2-node
job drains nothing, and a driver repeating one XID a thousand times is one incident with the count and a
handful of stored events. The fault gauges on the agent's /metrics return to 0 once the server releases
the accelerator."""

from __future__ import annotations

import subprocess
import sys
import threading
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from collectors.agent import Agent, AgentConfig
from collectors.sim import SimCollector
from tests.live import LiveServer, wait_for

pytestmark = pytest.mark.slow


@pytest.fixture
def server(tmp_path: Path) -> Iterator[LiveServer]:
    live = LiveServer(tmp_path / "server", f"sqlite:///{tmp_path / 'server' / 'sentinel.db'}").start()
    yield live
    live.stop()


@pytest.fixture
def agents(server: LiveServer, tmp_path: Path) -> Iterator[dict[str, Agent]]:
    token = server.token("agent", "drill")
    started = {}
    for name in ("n1", "n2"):
        agent = Agent(AgentConfig(server_url=server.url, token=token, node=name, sources=["sim:2"],
                                  interval_seconds=1.0, listen_port=0, state_dir=tmp_path / "agents",
                                  command_poll_seconds=5))
        agent.start()
        threading.Thread(target=agent.run_forever, daemon=True).start()  # a report every second
        started[name] = agent
    api = server.api()
    for name in started:
        wait_for(lambda n=name: api.get(f"/nodes/{n}").status_code == 200, what=f"{name} registered")
    yield started
    for agent in started.values():
        agent.stop(drain_seconds=1)


def sim(agent: Agent) -> SimCollector:
    [source] = [s for s in agent.sources if isinstance(s, SimCollector)]
    return source


@pytest.fixture
def ranks() -> Iterator[list[subprocess.Popen[bytes]]]:
    procs = [subprocess.Popen([sys.executable, "-c", "import time; time.sleep(120)"]) for _ in range(4)]
    yield procs
    for proc in procs:
        proc.kill()
        proc.wait(10)


def start_job(server: LiveServer, ranks: list[subprocess.Popen[bytes]]) -> int:
    launcher = httpx.Client(base_url=server.url + "/api/v1", timeout=10,
                            headers={"authorization": f"Bearer {server.token('launcher', 'drill-launcher')}"})
    job = launcher.post("/jobs", json={"name": "moe", "world_size": 4}).json()
    placement = launcher.post(f"/jobs/{job['id']}/placement", json={}).json()
    assert {slot["node"] for slot in placement} == {"n1", "n2"}, placement
    for slot in placement:
        assert launcher.post(f"/jobs/{job['id']}/tasks", json={
            "rank": slot["rank"], "node": slot["node"], "accelerators": slot["accelerators"],
            "pid": ranks[slot["rank"]].pid}).status_code == 201
    return int(job["id"])


def test_an_xid_13_43_storm_across_a_two_node_job_is_one_incident_and_drains_nothing(server, agents, ranks):
    job = start_job(server, ranks)
    api = server.api()
    # the agents learn the placement from their next acks, as they would from any report
    wait_for(lambda: all(a.assignments for a in agents.values()), what="assignments on both agents")
    for agent in agents.values():
        for index in range(2):
            for code in (13, 43, 13):
                sim(agent).inject(index, "xid", code)
    found = wait_for(lambda: (i := api.get("/incidents", params={"detector": "hardware"}).json()["incidents"])
                     and sum(x["occurrences"] for x in i) >= 12 and i, what="the storm's incident")
    assert len(found) == 1, [i["title"] for i in found]
    [incident] = found
    assert incident["job_id"] == job and "4 accelerator(s) of 2 node(s)" in incident["title"]
    nodes = api.get("/nodes").json()
    assert {n["name"]: n["admin_state"] for n in nodes} == {"n1": "active", "n2": "active"}, "0 drained nodes"
    assert {a["health"] for a in api.get("/accelerators").json()} == {"healthy"}
    done = [(r["action"], r["result"], r["detail"]) for r in api.get("/remediations").json()]
    assert [d for d in done if d[1] == "done"] == [("restart_job", "done", done[-1][2])], done


def test_a_thousand_repeats_of_one_xid_are_one_incident_with_the_count(server, agents):
    agent, api = agents["n1"], server.api()
    for _ in range(1000):
        sim(agent).inject(0, "xid", 95)
    found = wait_for(lambda: (i := api.get("/incidents", params={"detector": "hardware"}).json()["incidents"])
                     and i[0]["occurrences"] >= 1000 and i, timeout=30, what="1000 occurrences")
    assert len(found) == 1 and found[0]["occurrences"] == 1000
    assert found[0]["accelerator_uuid"] == "SIM-n1-0" and "seen " in found[0]["seen"]
    events = api.get("/events", params={"kind": "xid", "limit": 1000}).json()
    assert sum(e["data"].get("count", 1) for e in events) == 1000, "every occurrence is counted once"
    assert len(events) < 20, f"{len(events)} stored events for one repeated XID"
    assert agent.folder.folded_total == 999

    labels = {"node": "n1", "accelerator": "0", "uuid": "SIM-n1-0", "model": "sim-h100-80gb", "kind": "xid",
              "xid": "95"}
    assert agent.registry.get_sample_value("sentinel_accelerator_fault_recent", labels) == 1.0
    assert api.post("/accelerators/SIM-n1-0/release", json={"reason": "reset and tested"}).status_code == 200
    wait_for(lambda: agent.registry.get_sample_value("sentinel_accelerator_fault_recent", labels) == 0.0,
             what="the recent-fault gauge back to 0 after the release")
    state = {"node": "n1", "accelerator": "0", "uuid": "SIM-n1-0", "model": "sim-h100-80gb", "state": "healthy"}
    assert agent.registry.get_sample_value("sentinel_accelerator_health", state) == 1.0
