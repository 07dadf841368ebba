"""Kill -9 the server while two agents push every second, restart it: every sequence number the
agents sent is on the server, none twice. Real processes throughout, on SQLite and PostgreSQL."""

from __future__ import annotations

import os
import signal
import subprocess
import time
from pathlib import Path

import pytest
from sqlalchemy import create_engine, select

from sentinel.nodes.models import Node
from sentinel.telemetry.models import ReportReceipt
from tests.live import LiveServer, free_port, sentinel_cmd, wait_for

pytestmark = pytest.mark.slow


def start_agent(server: LiveServer, token: str, name: str, state_dir: Path) -> subprocess.Popen[bytes]:
    log = open(state_dir.parent / f"{name}.log", "ab")  # noqa: SIM115 - the child keeps it
    return subprocess.Popen(sentinel_cmd("collector", "--server", server.url, "--token", token, "--node-name", name,
                                         "--source", "sim:2", "--interval", "1", "--listen",
                                         f"127.0.0.1:{free_port()}", "--state-dir", str(state_dir)),
                            env={**os.environ}, stdout=log, stderr=log)


def test_kill9_server_under_load_loses_nothing_and_counts_nothing_twice(tmp_path, database_url):
    server = LiveServer(tmp_path / "server", database_url).start()
    token = server.token("agent", "fleet")
    names = ["node-1", "node-2"]
    agents = [start_agent(server, token, n, tmp_path / "agents") for n in names]
    try:
        api = server.api()
        wait_for(lambda: all(api.get(f"/nodes/{n}").status_code == 200 for n in names), what="both nodes")
        for _ in range(2):
            time.sleep(2.5)
            server.kill9()
            time.sleep(2.5)  # agents keep reporting into their spools
            server.start()
        time.sleep(3)
        # the agents back off up to 5 s between tries: let them empty their spools before they stop
        wait_for(lambda: not any(any((tmp_path / "agents" / n / "spool").glob("*.json")) for n in names), timeout=60,
                 what="both spools replayed")
    finally:
        for agent in agents:
            agent.send_signal(signal.SIGTERM)  # a clean stop drains the spool first
        for agent in agents:
            agent.wait(30)
        server.stop()

    engine = create_engine(database_url)
    with engine.connect() as conn:
        for name in names:
            sent = int((tmp_path / "agents" / name / "seq").read_text())
            left = list((tmp_path / "agents" / name / "spool").glob("*.json"))
            assert left == [], f"{name} still holds {len(left)} unsent reports"
            node_id = conn.scalar(select(Node.id).where(Node.name == name))
            stored = list(conn.scalars(select(ReportReceipt.seq).where(ReportReceipt.node_id == node_id)))
            assert sent >= 8, "the agents should have reported throughout"
            assert sorted(stored) == list(range(1, sent + 1)), f"{name}: gaps or extras in {sorted(stored)}"
    engine.dispose()
