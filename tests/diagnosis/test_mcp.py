"""The MCP server with the SDK's own client, over stdio and Streamable HTTP, against the real app served by
uvicorn on loopback (fake clock): an agent goes from "what is wrong with job 7?" to a confirmed cause with the
tools alone; bad arguments and refused roles are tool errors (refused actions audited), never a crash."""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import httpx2
import pytest
import uvicorn
from mcp import Client, StdioServerParameters
from mcp.client.streamable_http import streamable_http_client

from sentinel.app import create_app
from sentinel.config import Settings
from tests.conftest import FakeClock, bearer
from tests.diagnosis.jobdriver import JobDriver
from tests.live import free_port


class Served:
    def __init__(self, tmp_path: Path):
        self.clock = FakeClock(1_800_000_000.0)
        self.settings = Settings(data_dir=tmp_path / "data", database_url=f"sqlite:///{tmp_path / 'sentinel.db'}")
        app = create_app(self.settings, self.clock, run_scheduler=False)
        self.runtime = app.state.runtime
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=self.port, log_level="warning"))
        self.thread = threading.Thread(target=self.server.run, daemon=True)
        self.thread.start()
        deadline = time.monotonic() + 30
        while not self.server.started and time.monotonic() < deadline:
            time.sleep(0.05)
        assert self.server.started
        self.http = httpx.Client(base_url=self.url, timeout=10)
        self.admin = self.settings.admin_token_file.read_text().strip()

    def token(self, role: str) -> str:
        body = {"name": f"{role}-{time.monotonic_ns()}", "role": role, **({"node": "*"} if role == "agent" else {})}
        answer = self.http.post("/api/v1/tokens", json=body, headers=bearer(self.admin))
        assert answer.status_code == 201, answer.text
        return str(answer.json()["token"])

    def stop(self) -> None:
        self.http.close()
        self.server.should_exit = True
        self.thread.join(10)


@pytest.fixture
def served(tmp_path: Path) -> Iterator[Served]:
    s = Served(tmp_path)
    yield s
    s.stop()


@pytest.fixture
def job7(served: Served) -> JobDriver:
    """Job 7, two ranks, its baseline learnt and calibrated, then a slow collective path."""
    job = JobDriver(served.http, served.token, served.clock, runtime=served.runtime, job_id=7)
    job.run(34)
    job.answer_calibrations(1e9)
    job.cause = "communication"
    job.run(10)
    return job


class AgentPlayer:
    """node-a's agent: reports twice a second and answers a collective experiment with `value` bytes/s."""

    def __init__(self, job: JobDriver, value: float):
        self.job, self.value = job, value
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        while not self.stop.wait(0.2):
            self.job.post("node-a")
            pending, self.job.commands["node-a"] = self.job.commands["node-a"], []
            for command in pending:
                self.job.answer("node-a", command, self.value)

    def __enter__(self) -> AgentPlayer:
        self.thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop.set()
        self.thread.join(5)


def stdio(served: Served, token: str) -> Client:
    env = {**os.environ, "SENTINEL_TOKEN": token, "SENTINEL_DATA_DIR": str(served.settings.data_dir)}
    return Client(StdioServerParameters(command=sys.executable, args=["-m", "sentinel.cli", "mcp", "--server",
                                                                      served.url], env=env,
                                        cwd=str(Path(__file__).resolve().parents[2])), read_timeout_seconds=60)


def data(result: Any) -> Any:
    assert not result.is_error, result.content
    return result.structured_content.get("result", result.structured_content)


async def diagnose_job_7(served: Served, job: JobDriver) -> dict[str, Any]:
    async with stdio(served, served.token("operator")) as client:
        tools = {t.name: t for t in (await client.list_tools()).tools}
        assert {"fleet_health", "list_incidents", "get_incident", "job_diagnosis", "job_timeline", "compare_ranks",
                "recovery_plan", "run_experiment", "get_experiment", "silence", "cordon_node",
                "acknowledge_incident"} <= set(tools)
        schema = tools["run_experiment"].input_schema
        assert "ExperimentRequest" in str(schema) and "collective" in str(schema), "generated from the model"
        assert tools["job_diagnosis"].annotations.read_only_hint

        health = data(await client.call_tool("fleet_health", {}))
        assert health["nodes"] == {"active": 2} and health["open_incidents"] == {"warning": 1}
        [incident] = data(await client.call_tool("list_incidents", {"job_id": 7}))["incidents"]
        assert incident["detector"] == "slowdown" and incident["layer"] == "interconnect"
        found = data(await client.call_tool("get_incident", {"incident_id": incident["id"]}))
        assert found["evidence"]["attribution"]["proposed_experiment"]["kind"] == "collective"
        diagnosis = data(await client.call_tool("job_diagnosis", {"job_id": 7}))["diagnosis"]
        assert (diagnosis["layer"], diagnosis["component"]) == ("interconnect", "communication")
        ranks = data(await client.call_tool("compare_ranks", {"job_id": 7}))
        assert [r["rank"] for r in ranks] == [0, 1]
        with AgentPlayer(job, 0.3e9):
            result = data(await client.call_tool("run_experiment", {"job_id": 7, "wait_seconds": 30}))
        assert (result["state"], result["verdict"]) == ("done", "confirmed"), result
        after = data(await client.call_tool("job_diagnosis", {"job_id": 7}))["diagnosis"]
        return dict(after)


def test_an_agent_goes_from_what_is_wrong_with_job_7_to_a_confirmed_cause(served, job7):
    after = asyncio.run(diagnose_job_7(served, job7))
    assert after["status"] == "confirmed"
    assert "bus bandwidth node-a↔node-b 300.0 MB/s, 0.30×" in after["confirmation"]


async def bad_calls(served: Served) -> list[str]:
    errors = []
    async with stdio(served, served.token("viewer")) as client:
        for name, args in (("job_diagnosis", {"job_id": "seven"}), ("job_diagnosis", {"job_id": 999}),
                           ("run_experiment", {"job_id": 7, "request": {"kind": "reboot"}}),
                           ("run_experiment", {"job_id": 7}), ("cordon_node", {"node": "node-a"}),
                           ("no_such_tool", {})):
            result = await client.call_tool(name, args)
            assert result.is_error, (name, args, result)
            errors.append(result.content[0].text)
        assert data(await client.call_tool("job_diagnosis", {"job_id": 7}))["state"] == "slowdown", "still serving"
    return errors


def test_bad_arguments_and_refused_roles_are_tool_errors_and_refusals_are_audited(served, job7):
    errors = asyncio.run(bad_calls(served))
    assert "seven" in errors[0] or "integer" in errors[0]
    assert "404" in errors[1] and "job 999 not found" in errors[1]
    assert "reboot" in errors[2] or "kind" in errors[2]
    assert "403" in errors[3] and "403" in errors[4]
    audit = served.http.get("/api/v1/audit", params={"limit": 100}, headers=bearer(served.admin)).json()
    refused = [e for e in audit if e.get("detail", {}).get("status") == 403]
    assert {e["subject"] for e in refused} >= {"/api/v1/jobs/7/experiments", "/api/v1/nodes/node-a/cordon"}


async def over_http(url: str, token: str | None) -> tuple[Any, Any]:
    headers = {"authorization": f"Bearer {token}"} if token else {}
    async with httpx2.AsyncClient(headers=headers, timeout=30) as http, \
            Client(streamable_http_client(url, http_client=http)) as client:
        return await client.call_tool("job_diagnosis", {"job_id": 7}), await client.call_tool("fleet_health", {})


def test_streamable_http_uses_each_requests_own_token(served, job7, tmp_path):
    port = free_port()
    log = open(tmp_path / "mcp.log", "wb")  # noqa: SIM115 - the child keeps it
    proc = subprocess.Popen([sys.executable, "-m", "sentinel.cli", "mcp", "--http", f"127.0.0.1:{port}", "--server",
                             served.url], stdout=log, stderr=log, env={**os.environ, "SENTINEL_TOKEN": ""})
    try:
        url = f"http://127.0.0.1:{port}/mcp"
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            try:
                httpx.get(url, timeout=1)
                break
            except httpx.HTTPError:
                time.sleep(0.2)
        diagnosis, health = asyncio.run(over_http(url, served.token("viewer")))
        assert data(diagnosis)["diagnosis"]["layer"] == "interconnect" and data(health)["nodes"] == {"active": 2}
        anonymous, _ = asyncio.run(over_http(url, None))
        assert anonymous.is_error and "no Sentinel token" in anonymous.content[0].text
    finally:
        proc.terminate()
        proc.wait(10)
