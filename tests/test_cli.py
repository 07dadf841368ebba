"""The CLI against a real server process: tables, fault drills, the embedded-default demo."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest

from collectors.agent import Agent, AgentConfig
from tests.live import LiveServer, free_port, sentinel_cmd, wait_for

pytestmark = pytest.mark.slow


def run_cli(server: LiveServer, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(sentinel_cmd(*args, "--server", server.url), env=server.env, capture_output=True, text=True,
                          timeout=60)


def test_status_jobs_and_inject(tmp_path: Path):
    server = LiveServer(tmp_path / "server", f"sqlite:///{tmp_path / 'server.db'}").start()
    agent = Agent(AgentConfig(server_url=server.url, token=server.token("agent", "a"), node="gpu-07",
                              sources=["sim:3"], interval_seconds=30, listen_port=0, state_dir=tmp_path / "agent",
                              command_poll_seconds=5))
    agent.start()
    try:
        agent.report_now(agent.collect())
        wait_for(lambda: len(agent.spool) == 0, what="first report")
        job = server.api().post("/jobs", json={"name": "bert-large", "world_size": 8}).json()["id"]
        for rank in range(8):
            shard = {"manifest_digest": "ab" * 16, "stall_seconds": 0.25,
                     "locations": [{"tier": "persistent", "uri": "/shared/ckpt"}]}
            assert server.api().put(f"/jobs/{job}/checkpoints/100/shards/{rank}", json=shard).status_code == 200
        status = run_cli(server, "status")
        assert status.returncode == 0, status.stderr
        lines = status.stdout.splitlines()
        assert any(line.split()[:3] == ["gpu-07", "active", "1"] and line.endswith("HHH") for line in lines)
        assert any(line.split()[:2] == ["healthy", "3"] for line in lines)
        assert any("bert-large" in line and "pending" in line for line in lines)

        jobs = run_cli(server, "jobs")
        assert jobs.returncode == 0, jobs.stderr
        header, _, row = jobs.stdout.splitlines()[:3]
        assert header.split() == ["JOB", "NAME", "KIND", "STATE", "WORLD", "MFU", "ALLREDUCE", "STEP", "p50/p95",
                                  "TOKENS/S", "PEAK", "MEM", "FAILURES", "CKPT", "STEP", "CKPT", "STALL", "CKPT",
                                  "EVERY", "(REC.)"]
        assert row.split()[1:] == ["bert-large", "training", "pending", "8", "-", "-", "-/-", "-", "-", "0", "100",
                                   "250ms", "-", "(no", "MTBF", "yet)"]

        drill = run_cli(server, "inject", "--node", "gpu-07", "--accelerator", "2", "ecc")
        assert drill.returncode == 0, drill.stderr
        wait_for(lambda: agent.commands_applied == 1, timeout=10, what="the drill to reach the agent")

        bad = run_cli(server, "inject", "--node", "nowhere", "--accelerator", "0", "ecc")
        assert bad.returncode == 1 and "404" in bad.stderr and "nowhere" in bad.stderr
    finally:
        agent.stop()
        server.stop()


def test_status_without_a_server_says_so(tmp_path: Path):
    env = {**os.environ, "SENTINEL_DATA_DIR": str(tmp_path)}
    result = subprocess.run(sentinel_cmd("status", "--server", f"http://127.0.0.1:{free_port()}", "--token", "x"),
                            env=env, capture_output=True, text=True, timeout=60)
    assert result.returncode == 1 and "cannot reach the server" in result.stderr
