"""A real probe mesh: a Sentinel server on the lab's bridge and one agent per network namespace
(tests/network/netlab.py), each answering and sending UDP probes over its veth. Shared by the netns drill
(test_network_live.py) and benchmarks/network.py.
"""

from __future__ import annotations

import os
import subprocess
import time
from datetime import datetime
from pathlib import Path
from typing import Any

import httpx

from tests.live import LiveServer, sentinel_cmd, wait_for
from tests.network.netlab import Lab

PROBE_PORT = 9600
METRICS_PORT = 9481


def node_name(i: int) -> str:
    return f"n{i:02d}"


class Mesh:
    def __init__(self, work: Path, hosts: int, *, probe_interval: float = 0.5, report_interval: float = 2.0,
                 env: dict[str, str] | None = None, rdma_roots: dict[int, Path] | None = None, rack_size: int = 4):
        self.work = work
        self.hosts = hosts
        self.probe_interval = probe_interval
        self.report_interval = report_interval
        self.env = {"SENTINEL_PROBE_ROUND_SECONDS": "2", "SENTINEL_PROBE_WINDOW_SECONDS": "12",
                    "SENTINEL_PROBE_PEERS": "6", "SENTINEL_DETECTION_INTERVAL_SECONDS": "1", **(env or {})}
        self.rdma_roots = rdma_roots or {}
        self.rack_size = rack_size
        self.lab: Lab | None = None
        self.server: LiveServer | None = None
        self.agents: dict[int, subprocess.Popen[bytes]] = {}
        self.ready_at = 0.0  # when every agent was on the mesh and the startup's windows had aged out

    def start(self) -> Mesh:
        self.work.mkdir(parents=True, exist_ok=True)
        self.lab = Lab(self.hosts)
        try:
            self.server = LiveServer(self.work / "server", f"sqlite:///{self.work / 'server.db'}", self.env,
                                     host=self.lab.gateway).start()
            token = self.server.token("agent", "mesh")
            for i in range(self.hosts):
                self.agents[i] = self._agent(i, token)
            wait_for(self._all_measured, timeout=90, interval=0.5, what="every agent on the probe mesh")
            # 16 agents starting at once on a small machine answer slowly for a while: let those windows age out
            time.sleep(float(self.env["SENTINEL_PROBE_WINDOW_SECONDS"]))
            self.ready_at = time.time()
        except BaseException:
            self.close()
            raise
        return self

    def _agent(self, i: int, token: str) -> subprocess.Popen[bytes]:
        assert self.lab is not None and self.server is not None
        address = self.lab.hosts[i].address
        sources = ["--source", "host"]
        if i in self.rdma_roots:
            sources += ["--source", "rdma", "--sysfs-root", str(self.rdma_roots[i])]
        log = open(self.work / f"agent-{node_name(i)}.log", "ab")  # noqa: SIM115 - the child keeps it
        argv = sentinel_cmd("collector", "--server", self.server.url, "--token", token, "--node-name", node_name(i),
                            *sources, "--interval", str(self.report_interval),
                            "--listen", f"{address}:{METRICS_PORT}", "--probe", f"{address}:{PROBE_PORT}",
                            "--probe-interval", str(self.probe_interval),
                            "--label", f"rack=r{i // self.rack_size}", "--state-dir", str(self.work / "agents"))
        return self.lab.popen(i, argv, env={**os.environ}, stdout=log, stderr=log)

    def api(self) -> httpx.Client:
        assert self.server is not None
        return self.server.api()

    def matrix(self, **params: Any) -> dict[str, Any]:
        with self.api() as api:
            return dict(api.get("/network/matrix", params=params).json())

    def _all_measured(self) -> bool:
        for i, proc in self.agents.items():
            if proc.poll() is not None:
                raise RuntimeError(f"agent {node_name(i)} exited: "
                                   f"{(self.work / f'agent-{node_name(i)}.log').read_text()[-2000:]}")
        try:
            m = self.matrix(limit=10_000)
        except httpx.HTTPError:
            return False
        sources = {p["source"] for p in m.get("pairs", []) if p["received"]}
        return len(m.get("participants", [])) == self.hosts and len(sources) == self.hosts

    def incidents(self, **params: Any) -> list[dict[str, Any]]:
        with self.api() as api:
            return list(api.get("/incidents", params={"limit": 200, **params}).json()["incidents"])

    def nodes(self) -> dict[str, dict[str, Any]]:
        with self.api() as api:
            return {n["name"]: n for n in api.get("/nodes").json()}

    def close(self) -> None:
        for proc in self.agents.values():
            if proc.poll() is None:
                proc.terminate()
        for proc in self.agents.values():
            try:
                proc.wait(10)
            except subprocess.TimeoutExpired:
                proc.kill()
        if self.server is not None:
            self.server.stop()
        if self.lab is not None:
            self.lab.close()


def opened_after(incidents: list[dict[str, Any]], t0: float) -> list[dict[str, Any]]:
    return [i for i in incidents if datetime.fromisoformat(i["opened_at"]).timestamp() >= t0 - 1]


def wait_incident(mesh: Mesh, t0: float, timeout: float, title: str = "",
                  **params: Any) -> tuple[float, dict[str, Any]]:
    """(seconds from t0 until an incident opened since t0, matching `params` and with `title` in its title, was
    seen by polling, the incident)."""
    def found() -> dict[str, Any] | None:
        fresh = [i for i in opened_after(mesh.incidents(**params), t0) if title in i["title"]]
        return fresh[0] if fresh else None
    incident = wait_for(found, timeout=timeout, interval=0.05, what=f"an incident {params}")
    return time.time() - t0, incident
