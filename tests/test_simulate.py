"""`sentinel simulate`: its reports are the real wire schema, its schedule is even, its retries lose nothing,
and against a live server a small fleet registers, reports and raises an incident."""

from __future__ import annotations

import asyncio
import itertools
import json
import subprocess
from pathlib import Path
from typing import Any

import pytest

from sentinel.simulate import Fleet, Options, Simulator, registration
from sentinel.telemetry.schemas import NodeReport
from tests.live import LiveServer, sentinel_cmd, wait_for


def options(**overrides: Any) -> Options:
    base: dict[str, Any] = {"nodes": 4, "accelerators": 8, "interval": 1.0, "duration": 1.0, "connections": 2,
                            "faults_per_hour": 0.0, "seed": 3, "prefix": "sim-", "token": "t", "servers": [],
                            "mint_agent_token": False, "max_backoff_seconds": 0.2}
    base.update(overrides)
    return Options(**base)


def test_a_report_is_the_wire_schema_and_names_the_registered_accelerators() -> None:
    import random

    fleet = Fleet(3, 8, 10.0, "sim-", random.Random(1))
    event = fleet.fault(2, 1000.0, [79], kind="xid", xid=79, accelerator=5)
    report = NodeReport.model_validate_json(fleet.body(2, 7, 1000.5, [event]))
    reg = registration("sim-00002", 8, 10.0)
    assert report.node == "sim-00002" and report.seq == 7 and report.interval_seconds == 10.0
    assert [s.uuid for s in report.accelerators] == [a.uuid for a in reg.accelerators]
    assert report.events[0].xid == 79 and report.events[0].accelerator_uuid == "SIM-sim-00002-5"
    assert report.accelerators[5].xid_errors_total == {"79": 1}  # the counter NVML would show, too
    assert all(0.0 < s.utilization_ratio <= 1.0 for s in report.accelerators)
    ecc = fleet.fault(2, 1001.0, [79], kind="ecc", accelerator=1)
    again = NodeReport.model_validate_json(fleet.body(2, 8, 1001.5, [ecc]))
    assert again.accelerators[1].ecc_uncorrected_total == 1 and again.accelerators[5].xid_errors_total == {"79": 1}


def test_reports_are_spread_evenly_over_the_interval() -> None:
    now = [100.0]

    def clock() -> float:
        now[0] += 0.01
        return now[0]

    sim = Simulator(options(nodes=50, interval=1.0, duration=2.0), clock=clock)
    asyncio.run(sim.schedule(100.0))
    items = []
    while not sim.queue.empty():
        items.append(sim.queue.get_nowait())
    assert 99 <= len(items) <= 101  # 50 nodes x 2 intervals
    first = items[:50]
    assert sorted(i for i, _, _ in first) == list(range(50))  # each node once per interval
    gaps = {round(b[1] - a[1], 6) for a, b in itertools.pairwise(items)}
    assert gaps == {0.02}  # S/N apart
    assert all(items[k][1] + 1.0 == pytest.approx(items[k + 50][1]) for k in range(len(items) - 50))


class FlakyServerDouble:
    """A loopback HTTP/1.1 server standing in for Sentinel: 503 for the first `fail` report posts, then 200;
    a `standby` answers 503 to everything. It notes the seqs it acknowledged per node, in order."""

    def __init__(self, fail: int, standby: bool = False):
        self.fail = fail
        self.standby = standby
        self.posts = 0
        self.acked: dict[str, list[int]] = {}
        self.port = 0
        self.server: asyncio.Server | None = None

    async def start(self) -> str:
        self.server = await asyncio.start_server(self.handle, "127.0.0.1", 0)
        self.port = self.server.sockets[0].getsockname()[1]
        return f"http://127.0.0.1:{self.port}"

    async def handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            while True:
                head = await reader.readuntil(b"\r\n\r\n")
                length = int(next(line.split(b":")[1] for line in head.split(b"\r\n")
                                  if line.lower().startswith(b"content-length")))
                body = await reader.readexactly(length)
                path = head.split(b" ")[1].decode()
                if self.standby:
                    status, answer = 503, b'{"detail": "standby"}'
                elif path.endswith("/register"):
                    status, answer = 200, b'{"last_seq": 0}'
                else:
                    self.posts += 1
                    report = json.loads(body)
                    if self.posts <= self.fail:
                        status, answer = 503, b'{"detail": "standby"}'
                    else:
                        self.acked.setdefault(report["node"], []).append(report["seq"])
                        status, answer = 200, b'{"status":"accepted"}'
                writer.write(b"HTTP/1.1 %d X\r\nContent-Length: %d\r\n\r\n%s" % (status, len(answer), answer))
                await writer.drain()
        except (asyncio.IncompleteReadError, ConnectionError):
            writer.close()


def test_failed_reports_are_retried_in_seq_order_and_none_is_lost() -> None:
    async def scenario() -> tuple[dict[str, Any], FlakyServerDouble]:
        server = FlakyServerDouble(fail=15)
        url = await server.start()
        summary = await Simulator(options(nodes=4, interval=0.2, duration=1.0, servers=[url])).run()
        return summary, server

    summary, server = asyncio.run(scenario())
    assert summary["lost"] == 0 and summary["unsent"] == 0
    assert summary["failed_attempts"] == 15 and summary["errors"] == {"503": 15}
    assert summary["acked"] == summary["offered"] == sum(len(s) for s in server.acked.values())
    for seqs in server.acked.values():
        assert seqs == list(range(1, len(seqs) + 1))  # every seq, each once, in order


def test_a_standby_answering_503_sends_the_fleet_to_the_next_server() -> None:
    async def scenario() -> tuple[dict[str, Any], FlakyServerDouble, FlakyServerDouble]:
        standby, leader = FlakyServerDouble(fail=0, standby=True), FlakyServerDouble(fail=0)
        urls = [await standby.start(), await leader.start()]
        summary = await Simulator(options(nodes=4, interval=0.2, duration=0.6, servers=urls)).run()
        return summary, standby, leader

    summary, standby, leader = asyncio.run(scenario())
    assert summary["failovers"] >= 1 and summary["lost"] == 0 and summary["unsent"] == 0
    assert standby.acked == {} and sum(len(s) for s in leader.acked.values()) == summary["offered"]


@pytest.mark.slow
def test_simulated_fleet_against_a_live_server(tmp_path: Path) -> None:
    server = LiveServer(tmp_path / "server", f"sqlite:///{tmp_path / 'server.db'}").start()
    try:
        summary_file = tmp_path / "summary.json"
        done = subprocess.run(
            sentinel_cmd("simulate", "--server", server.url, "--nodes", "50",
                         "--interval", "1", "--duration", "10", "--inject-xid79-at", "3", "--json", str(summary_file)),
            env={**server.env, "SENTINEL_TOKEN": server.admin_token}, capture_output=True, text=True, timeout=180,
            check=False)
        assert done.returncode == 0, done.stdout + done.stderr
        summary = json.loads(summary_file.read_text())
        assert summary["lost"] == 0 and summary["unsent"] == 0 and summary["registered"] == 50
        assert summary["offered"] >= 450 and summary["acked"] + summary["duplicates"] == summary["offered"] + 1
        assert "[simulate" in done.stdout and "reports accepted" in done.stdout
        with server.api() as api:
            nodes = [n for n in api.get("/nodes", params={"limit": 1000}).json() if n["name"].startswith("sim-")]
            assert len(nodes) == 50 and {n["state"] for n in nodes} <= {"active", "cordoned", "draining", "down"}
            accelerators = [a for a in api.get("/accelerators", params={"limit": 10_000}).json()
                            if a["uuid"].startswith("SIM-sim-")]
            assert len(accelerators) == 400

            def xid79() -> list[dict[str, Any]]:
                found = api.get("/incidents", params={"node": "sim-00000", "state": "all"}).json()["incidents"]
                return [i for i in found if i["fingerprint"].endswith("xid=79")]

            incident = wait_for(xid79, timeout=20, what="the XID 79 incident")[0]
            assert incident["accelerator_uuid"] == "SIM-sim-00000-0" and incident["severity"] == "critical"
            metrics = api.get(server.url + "/metrics").text
            stored = next(float(line.split()[-1]) for line in metrics.splitlines()
                          if line.startswith("sentinel_ingest_reports_total"))
            assert stored >= summary["acked"]
    finally:
        server.stop()
