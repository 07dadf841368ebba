"""A launcher whose task registration was committed by a leader that stopped before it answered.

The retry on the next leader gets 409 ("already registered"). When the registered task is this very process
(same rank, attempt, node and pid) the launcher goes on; a task of another process is still a conflict. CI saw
the first case in tests/ha/test_failover_live.py: the launcher exited on the 409 and the job was lost.
A real app under uvicorn on a loopback port and a real client; the leader's stop is stood in for by
registering the task before the launcher does, which is what the stopped leader left behind.
"""

from __future__ import annotations

import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import httpx
import pytest
import uvicorn

from sentinel.app import create_app
from sentinel.client import ApiError, SentinelClient
from sentinel.config import Settings
from sentinel.launcher.launcher import Launcher
from sentinel.launcher.local import Rank
from tests.factories import registration
from tests.live import free_port


@pytest.fixture
def served(tmp_path: Path) -> Any:
    settings = Settings(data_dir=tmp_path / "data", database_url=f"sqlite:///{tmp_path / 'sentinel.db'}")
    port = free_port()
    server = uvicorn.Server(uvicorn.Config(create_app(settings, run_scheduler=False), host="127.0.0.1", port=port,
                                           log_level="warning"))
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    deadline = time.monotonic() + 30
    while not server.started and time.monotonic() < deadline:
        time.sleep(0.05)
    assert server.started
    url = f"http://127.0.0.1:{port}"
    token = settings.admin_token_file.read_text().strip()
    httpx.post(f"{url}/api/v1/nodes/register", json=registration("node-a", accelerators=2),
               headers={"authorization": f"Bearer {token}"}, timeout=10).raise_for_status()
    sleeper = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    yield url, token, sleeper
    sleeper.kill()
    sleeper.wait()
    server.should_exit = True
    thread.join(10)


def launcher_for(url: str, token: str) -> tuple[Launcher, SentinelClient, int]:
    client = SentinelClient(url, token)
    job = client.post("/jobs", {"name": "retried", "kind": "training", "world_size": 1})
    launcher = Launcher(client, name="retried", nproc=1, argv=["true"])
    launcher.local.job_id = job["id"]
    return launcher, client, job["id"]


def test_a_registration_committed_before_the_answer_is_not_a_conflict(served: Any) -> None:
    url, token, sleeper = served
    launcher, client, job_id = launcher_for(url, token)
    rank = Rank(rank=0, node="node-a", accelerators=["SIM-node-a-0"], agent_url=None, proc=sleeper)
    client.post(f"/jobs/{job_id}/tasks", {"rank": 0, "node": "node-a", "accelerators": ["SIM-node-a-0"],
                                          "pid": sleeper.pid, "attempt": 1})
    launcher._register_tasks([rank], 1)  # the retry: 409 from the server, and this process is the one registered
    tasks = client.get(f"/jobs/{job_id}")["tasks"]
    assert [(t["rank"], t["attempt"], t["pid"]) for t in tasks] == [(0, 1, sleeper.pid)]


def test_another_process_in_the_same_place_is_still_a_conflict(served: Any) -> None:
    url, token, sleeper = served
    launcher, client, job_id = launcher_for(url, token)
    rank = Rank(rank=0, node="node-a", accelerators=["SIM-node-a-0"], agent_url=None, proc=sleeper)
    client.post(f"/jobs/{job_id}/tasks", {"rank": 0, "node": "node-a", "accelerators": ["SIM-node-a-0"],
                                          "pid": sleeper.pid + 1, "attempt": 1})
    with pytest.raises(ApiError) as refused:
        launcher._register_tasks([rank], 1)
    assert refused.value.status == 409 and "already registered" in str(refused.value.detail)
