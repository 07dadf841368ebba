"""The agent against a real server process: registration, immediate fault push, spool and replay."""

from __future__ import annotations

import threading
import time
from pathlib import Path

import pytest

from collectors.agent import Agent, AgentConfig
from tests.live import LiveServer, wait_for

pytestmark = pytest.mark.slow


@pytest.fixture
def server(tmp_path: Path):  # type: ignore[no-untyped-def]
    live = LiveServer(tmp_path / "server", f"sqlite:///{tmp_path / 'server' / 'sentinel.db'}").start()
    yield live
    live.stop()


def make_agent(server: LiveServer, tmp_path: Path, interval: float = 30.0) -> Agent:
    config = AgentConfig(server_url=server.url, token=server.token("agent", "agent-1"), node="n1",
                         sources=["sim:2", "host", "nvml"], interval_seconds=interval, listen_port=0,
                         state_dir=tmp_path / "agent", command_poll_seconds=5)
    return Agent(config)


def test_agent_registers_reports_and_serves_metrics(server, tmp_path):
    agent = make_agent(server, tmp_path)
    assert agent.sources_up == {"sim": True, "host": True, "nvml": False}  # no GPU here: skipped, not fatal
    agent.start()
    try:
        seq = agent.report_now(agent.collect())
        api = server.api()
        node = wait_for(lambda: (n := api.get("/nodes/n1")).status_code == 200 and n.json()["last_seq"] >= seq
                        and n.json(), what="the report")
        assert [a["uuid"] for a in node["accelerators"]] == ["SIM-n1-0", "SIM-n1-1"]
        registry = agent.registry
        labels = {"node": "n1", "accelerator": "0", "uuid": "SIM-n1-0", "model": "sim-h100-80gb"}
        assert registry.get_sample_value("sentinel_accelerator_memory_total_bytes", labels) == 80 * 2**30
        assert registry.get_sample_value("sentinel_accelerator_health", {**labels, "state": "healthy"}) == 1.0
        assert registry.get_sample_value("sentinel_agent_spool_reports", {"node": "n1"}) == 0.0
    finally:
        agent.stop()


def test_an_injected_fault_reaches_the_server_at_once_not_at_the_next_interval(server, tmp_path):
    agent = make_agent(server, tmp_path, interval=60.0)
    agent.start()
    try:
        agent.report_now(agent.collect())
        api = server.api()
        wait_for(lambda: api.get("/nodes/n1").json().get("last_seq", 0) >= 1, what="registration")
        time.sleep(0.5)  # let the command long-poll begin
        started = time.monotonic()
        assert api.post("/nodes/n1/inject", json={"accelerator_index": 1, "fault": "xid", "argument": 79}
                        ).status_code == 202
        events = wait_for(lambda: api.get("/events", params={"kind": "xid"}).json(), timeout=10, what="xid event")
        assert time.monotonic() - started < 5.0  # the interval is 60 s
        assert events[0]["accelerator_uuid"] == "SIM-n1-1" and events[0]["data"]["xid"] == 79
        labels = {"node": "n1", "accelerator": "1", "uuid": "SIM-n1-1", "model": "sim-h100-80gb", "xid": "79"}
        assert agent.registry.get_sample_value("sentinel_accelerator_xid_errors_total", labels) is None
        agent.collect()
        assert agent.registry.get_sample_value("sentinel_accelerator_xid_errors_total", labels) == 1.0
    finally:
        agent.stop()


def test_inject_on_a_node_without_sim_is_409(server, tmp_path):
    config = AgentConfig(server_url=server.url, token=server.token("agent", "a2"), node="plain", sources=["host"],
                         listen_port=0, state_dir=tmp_path / "agent2")
    agent = Agent(config)
    assert agent.pusher.register()
    response = server.api().post("/nodes/plain/inject", json={"accelerator_index": 0, "fault": "ecc"})
    assert response.status_code == 409 and "sim" in response.json()["detail"]
    agent.stop(drain_seconds=0)


def test_reports_made_while_the_server_is_away_are_replayed_in_order(server, tmp_path):
    agent = make_agent(server, tmp_path)
    agent.start()
    try:
        agent.report_now(agent.collect())
        wait_for(lambda: len(agent.spool) == 0, what="first report")
        server.kill9()
        seqs = [agent.report_now(agent.collect()) for _ in range(5)]
        wait_for(lambda: not agent.pusher.connected, timeout=10, what="the agent to notice the server is gone")
        assert len(agent.spool) == 5
        server.start()
        wait_for(lambda: len(agent.spool) == 0, timeout=30, what="replay")
        receipts = server.api().get("/nodes/n1").json()["last_seq"]
        assert receipts == seqs[-1]
    finally:
        agent.stop()


def test_an_agent_stopped_on_purpose_says_goodbye_and_its_silence_pages_no_one(server, tmp_path):
    agent = make_agent(server, tmp_path, interval=1.0)
    agent.start()
    agent.report_now(agent.collect())
    api = server.api()
    wait_for(lambda: api.get("/nodes/n1").json().get("last_seq", 0) >= 1, what="the first report")
    agent.stop()  # as on SIGTERM: the last report says so, and it is sent before the stop ends
    assert len(agent.spool) == 0, "the goodbye reached the server"
    down = wait_for(lambda: (n := api.get("/nodes/n1").json())["state"] == "down" and n, timeout=15,
                    what="the node marked down after 3 silent intervals")
    assert "its agent stopped on purpose" in down["state_reason"]
    time.sleep(1.5)  # a detection round or more after it went down
    assert api.get("/incidents", params={"state": "all"}).json()["incidents"] == []


def test_two_agents_probe_each_other_as_the_server_assigns(server, tmp_path):
    """The probe mesh on loopback (the netns drill in tests/network/ does it on a real bridge): each agent
    registers its probe address, gets the other as its target in the ack, and the server's matrix fills."""
    token = server.token("agent", "mesh")
    agents = [Agent(AgentConfig(server_url=server.url, token=token, node=name, sources=["host"], interval_seconds=1.0,
                                listen_port=0, state_dir=tmp_path / "agents", probe_listen="127.0.0.1:0",
                                probe_interval_seconds=0.2, labels={"rack": "r1"}))
              for name in ("p1", "p2")]
    for agent in agents:
        agent.start()
    threads = [threading.Thread(target=a.run_forever, daemon=True) for a in agents]
    for t in threads:
        t.start()
    try:
        api = server.api()
        node = wait_for(lambda: (n := api.get("/nodes/p1")).status_code == 200 and n.json(), what="p1 registered")
        assert node["labels"]["probe_addr"] == agents[0].responder.address  # type: ignore[union-attr]
        assert node["labels"]["rack"] == "r1"
        def answered() -> dict[tuple[str, str], dict[str, float]] | None:
            got = {(p["source"], p["target"]): p for p in api.get("/network/matrix").json()["pairs"] if p["received"]}
            return got if len(got) >= 2 else None

        pairs = wait_for(answered, timeout=20, what="both directions probed")
        assert set(pairs) == {("p1", "p2"), ("p2", "p1")}
        assert all(p["rtt_p50_seconds"] < 0.1 for p in pairs.values())
        assert agents[0].prober is not None and set(agents[0].prober.targets()) == {"p2"}
        assert agents[0].registry.get_sample_value("sentinel_agent_probes_sent_total", {"node": "p1"}) > 0
    finally:
        for agent in agents:
            agent.stop()
        for t in threads:
            t.join(timeout=5)
