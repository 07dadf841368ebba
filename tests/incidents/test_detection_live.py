"""Real processes end to end: an agent's simulated XID 79 reaches a webhook receiver as a page within a
second, an acknowledgement and a resolve follow it, and a killed agent is paged as heartbeat loss."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import time
from datetime import datetime
from pathlib import Path

import pytest

from tests.live import LiveServer, Receiver, free_port, sentinel_cmd, wait_for

pytestmark = pytest.mark.slow
SECRET = "test-secret"


def start_agent(server: LiveServer, token: str, name: str, state_dir: Path) -> subprocess.Popen[bytes]:
    log = open(state_dir.parent / f"{name}.log", "ab")  # noqa: SIM115 - the child keeps it
    return subprocess.Popen(sentinel_cmd("collector", "--server", server.url, "--token", token, "--node-name", name,
                                         "--source", "sim:2", "--interval", "1", "--listen",
                                         f"127.0.0.1:{free_port()}", "--state-dir", str(state_dir)),
                            env={**os.environ}, stdout=log, stderr=log, start_new_session=True)


def test_an_agent_fault_pages_within_a_second_and_a_dead_agent_is_heartbeat_loss(tmp_path, database_url):
    receiver = Receiver(SECRET)
    receivers = [{"name": "oncall", "kind": "webhook", "url": receiver.url, "secret": SECRET}]
    server = LiveServer(tmp_path / "server", database_url, {"SENTINEL_RECEIVERS": json.dumps(receivers),
                                                            "SENTINEL_RESOLVE_AFTER_SECONDS": "1"}).start()
    agent = start_agent(server, server.token("agent", "a"), "gpu-1", tmp_path / "agents")
    try:
        api = server.api()
        wait_for(lambda: api.get("/nodes/gpu-1").status_code == 200, what="node registered")
        assert api.post("/nodes/gpu-1/inject", json={"accelerator_index": 1, "fault": "xid",
                                                      "argument": 79}).status_code == 202
        [(at, page)] = wait_for(lambda: receiver.find("trigger", "hardware"), timeout=10, what="the XID page")
        incident = page["incident"]
        assert incident["accelerator_uuid"] == "SIM-gpu-1-1" and incident["severity"] == "critical"
        assert "XID 79 fell off the bus" in incident["title"] and "What to check next" in incident["text"]
        latency = at - datetime.fromisoformat(incident["observed_at"]).timestamp()
        assert 0 <= latency < 1.0, f"paged {latency:.3f}s after the agent saw it"
        assert receiver.bad_signatures == 0

        assert api.post(f"/incidents/{incident['id']}/ack", json={"note": "on it"}).status_code == 200
        assert api.post(f"/incidents/{incident['id']}/resolve", json={"note": "reseated"}).status_code == 200
        wait_for(lambda: receiver.find("acknowledge", "hardware") and receiver.find("resolve", "hardware"),
                 what="ack and resolve pages")

        os.killpg(agent.pid, signal.SIGKILL)
        killed = time.time()
        agent.wait(10)
        [(at, page)] = wait_for(lambda: receiver.find("trigger", "heartbeat"), timeout=15, what="heartbeat page")
        assert page["incident"]["node"] == "gpu-1"
        assert at - killed < 3 * 1.0 + 2.0, "3 missed 1 s intervals, plus the 1 s liveness check and slack"
        incident_id = page["incident"]["id"]

        def states() -> list[str]:
            return [n["state"] for n in api.get(f"/incidents/{incident_id}").json()["notifications"]]

        # The receiver holds the page a moment before the server commits its delivery.
        wait_for(lambda: states() != ["pending"], timeout=5, what="the delivery to be recorded")
        assert states() == ["delivered"]
    finally:
        if agent.poll() is None:
            os.killpg(agent.pid, signal.SIGKILL)
        server.stop()
        receiver.server.shutdown()
