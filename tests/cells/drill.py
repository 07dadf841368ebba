"""Two cells on this machine, on the engines SREs already run (docs/cells.md).

Each cell: a Sentinel server (`SENTINEL_CELL`) on its own PostgreSQL database, one sim agent, and a cell
Prometheus (`external_labels: {cell: …}`) scraping that server's and agent's /metrics. Across cells: one global
Prometheus scraping both cell Prometheus' `/federate`, and one Alertmanager cluster of two real
`prometheus-alertmanager` peers gossiping with each other; every server sends each alert to both peers, and
the peers' one webhook receiver counts pages. Every server also has a direct signed webhook receiver: the
baseline path (Sentinel alone) for the latency ratio.

Both agents report a node of the same name: the cell label alone keeps the two cells' alerts apart.
Used by tests/cells/test_cells_drill.py (behaviour) and benchmarks/cells.py (numbers).
"""

from __future__ import annotations

import json
import os
import subprocess
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import yaml

from tests.alerting.alerting_helpers import LoopbackReceiver
from tests.dashboards.test_dashboard_queries import Prometheus, stop
from tests.live import LiveServer, Receiver, free_port, sentinel_cmd, wait_for

NODE = "gpu-node-1"  # the same node name in every cell, on purpose
SECRET = "cells-drill"
PEER_TIMEOUT_SECONDS = 1.0  # how long the second Alertmanager peer waits for the first one's notification
FEDERATE_MATCH = ['{__name__=~"sentinel_(nodes|accelerators|incidents_open|job_.*)"}',
                  '{__name__="up",job=~"sentinel-.*"}']

ALERTMANAGER_CONFIG = """
route:
  receiver: pager
  group_by: ['cell', 'alertname', 'fingerprint']
  group_wait: 100ms
  group_interval: 1s
  repeat_interval: 1h
receivers:
  - name: pager
    webhook_configs:
      - url: {hook}
        send_resolved: false
"""


class AlertmanagerPeer:
    """One `prometheus-alertmanager` of a gossiping cluster, on loopback."""

    def __init__(self, binary: str, work: Path, name: str, hook_url: str, cluster_port: int, peers: list[int]):
        self.work, self.name = work / name, name
        self.work.mkdir(parents=True, exist_ok=True)
        config = self.work / "alertmanager.yml"
        config.write_text(ALERTMANAGER_CONFIG.format(hook=hook_url))
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.log = self.work / "alertmanager.log"
        argv = [binary, f"--config.file={config}", f"--web.listen-address=127.0.0.1:{self.port}",
                f"--storage.path={self.work / 'data'}", f"--cluster.listen-address=127.0.0.1:{cluster_port}",
                f"--cluster.advertise-address=127.0.0.1:{cluster_port}",
                f"--cluster.peer-timeout={PEER_TIMEOUT_SECONDS:g}s", "--cluster.gossip-interval=50ms",
                "--cluster.pushpull-interval=1s", "--cluster.settle-timeout=2s", "--log.level=warn",
                *(f"--cluster.peer=127.0.0.1:{p}" for p in peers)]
        self.proc = subprocess.Popen(argv, stdout=open(self.log, "ab"), stderr=subprocess.STDOUT,  # noqa: SIM115
                                     start_new_session=True)

    def status(self) -> dict[str, Any]:
        assert self.proc.poll() is None, self.log.read_text()[-2000:]
        try:
            return dict(httpx.get(self.url + "/api/v2/status", timeout=2).json())
        except (httpx.HTTPError, ValueError):
            return {}

    def alerts(self) -> list[dict[str, Any]]:
        return list(httpx.get(self.url + "/api/v2/alerts", timeout=5).json())


def alertmanager_cluster(binary: str, work: Path, hook_url: str, size: int = 2,
                         gossip: bool = True) -> list[AlertmanagerPeer]:
    """`size` peers, each told of all the others; returns once every peer sees the whole cluster ready.
    Without `gossip` (the control), each peer is told of none and is a cluster of one."""
    ports = [free_port() for _ in range(size)]
    peers = [AlertmanagerPeer(binary, work, f"am-{i}", hook_url, port,
                              [p for p in ports if p != port] if gossip else [])
             for i, port in enumerate(ports)]

    def formed() -> bool:
        for peer in peers:
            cluster = peer.status().get("cluster") or {}
            if cluster.get("status") != "ready" or len(cluster.get("peers") or []) != (size if gossip else 1):
                return False
        return True

    wait_for(formed, timeout=30, interval=0.1, what=f"{size} Alertmanager peers gossiping")
    return peers


class Stamped:
    """Arrival time of each request at a LoopbackReceiver (it keeps requests, not times)."""

    def __init__(self, receiver: LoopbackReceiver) -> None:
        self.receiver = receiver
        self.times: list[float] = []
        self._stop = threading.Event()
        threading.Thread(target=self._watch, daemon=True).start()

    def _watch(self) -> None:
        while not self._stop.is_set():
            try:
                self.receiver.wait_for(len(self.times) + 1, timeout=0.2)
            except AssertionError:
                continue
            self.times.append(time.time())

    def close(self) -> None:
        self._stop.set()


@dataclass
class CellRig:
    name: str
    server: LiveServer
    agent: subprocess.Popen[bytes]
    agent_port: int
    prometheus: Prometheus
    admin: httpx.Client
    faults: list[float] = field(default_factory=list)

    def inject_xid79(self, accelerator: int = 0) -> float:
        """The fault: XID 79 on an accelerator, as `sentinel inject` queues it; returns when it was asked for."""
        at = time.time()
        response = self.admin.post(f"/nodes/{NODE}/inject", json={"accelerator_index": accelerator, "fault": "xid",
                                                                   "argument": 79})
        assert response.status_code == 202, response.text
        self.faults.append(at)
        return at


def start_agent(server: LiveServer, token: str, work: Path, port: int, accelerators: int) -> subprocess.Popen[bytes]:
    log = open(work / "agent.log", "ab")  # noqa: SIM115 - the child keeps it
    return subprocess.Popen(sentinel_cmd("collector", "--server", server.url, "--token", token, "--node-name", NODE,
                                         "--source", f"sim:{accelerators}", "--interval", "1", "--listen",
                                         f"127.0.0.1:{port}", "--state-dir", str(work / "agent")),
                            env={**os.environ}, stdout=log, stderr=log, start_new_session=True)


def start_cell(name: str, database_url: str, work: Path, prometheus_bin: str, alertmanagers: list[AlertmanagerPeer],
               direct: Receiver, accelerators: int = 2) -> CellRig:
    work.mkdir(parents=True, exist_ok=True)
    # the direct receiver first: the dispatcher sends a new incident's notifications in order, and the baseline
    # must not wait for the Alertmanager sends
    receivers = [{"name": "direct", "kind": "webhook", "url": direct.url, "secret": SECRET}]
    receivers += [{"name": f"am-{i}", "kind": "alertmanager", "url": peer.url} for i, peer in enumerate(alertmanagers)]
    server = LiveServer(work / "server", database_url, {
        "SENTINEL_CELL": name, "SENTINEL_RECEIVERS": json.dumps(receivers),
        "SENTINEL_RESOLVE_AFTER_SECONDS": "600", "SENTINEL_SERVER_NAME": f"cell-{name}"}).start()
    admin = server.api()
    made = admin.post("/tokens", json={"name": f"agent-{name}", "role": "agent", "node": NODE})
    made.raise_for_status()
    port = free_port()
    agent = start_agent(server, made.json()["token"], work, port, accelerators)
    prometheus = Prometheus(prometheus_bin, work, server, [port])
    config = yaml.safe_load(prometheus.config.read_text())
    config["global"]["external_labels"] = {"cell": name}
    config["rule_files"] = []  # the rules are tested elsewhere; here they would only cost CPU
    prometheus.config.write_text(yaml.safe_dump(config))
    return CellRig(name, server, agent, port, prometheus, admin)


def start_global(prometheus_bin: str, work: Path, cells: list[CellRig]) -> Prometheus:
    """The global Prometheus: federates every cell Prometheus, keeping their `cell` label (honor_labels)."""
    work.mkdir(parents=True, exist_ok=True)
    prometheus = Prometheus(prometheus_bin, work, cells[0].server, [])
    config = {"global": {"scrape_interval": "1s", "scrape_timeout": "1s", "evaluation_interval": "1s"},
              "scrape_configs": [{"job_name": "federate", "honor_labels": True, "metrics_path": "/federate",
                                  "params": {"match[]": FEDERATE_MATCH},
                                  "static_configs": [{"targets": [f"127.0.0.1:{c.prometheus.port}" for c in cells]}]}]}
    prometheus.config.write_text(yaml.safe_dump(config))
    return prometheus.start()


@dataclass
class Drill:
    """Everything of one two-cell run; `close()` stops it all, by PID."""

    work: Path
    cells: list[CellRig] = field(default_factory=list)
    alertmanagers: list[AlertmanagerPeer] = field(default_factory=list)
    pager: LoopbackReceiver | None = None
    pages: Stamped | None = None
    direct: Receiver | None = None
    world: Prometheus | None = None

    def start(self, prometheus_bin: str, alertmanager_bin: str, databases: dict[str, str],
              accelerators: int = 2, gossip: bool = True) -> Drill:
        self.pager = LoopbackReceiver().__enter__()
        self.pages = Stamped(self.pager)
        self.direct = Receiver(SECRET)
        self.alertmanagers = alertmanager_cluster(alertmanager_bin, self.work, self.pager.url + "/pager",
                                                  gossip=gossip)
        for name, url in databases.items():
            self.cells.append(start_cell(name, url, self.work / f"cell-{name}", prometheus_bin, self.alertmanagers,
                                         self.direct, accelerators))
        for cell in self.cells:
            wait_for(lambda c=cell: c.admin.get(f"/nodes/{NODE}").status_code == 200, timeout=30,  # type: ignore[misc]
                     what=f"the agent of cell {cell.name} registered")
            cell.prometheus.start()
        self.world = start_global(prometheus_bin, self.work / "global", self.cells)
        return self

    def firing_pages(self) -> list[tuple[float, dict[str, Any]]]:
        assert self.pager is not None and self.pages is not None
        messages = [r.json() for r in self.pager.on("/pager")]
        return [(at, m) for at, m in zip(self.pages.times, messages, strict=False) if m["status"] == "firing"]

    def direct_pages(self, cell: str) -> list[tuple[float, dict[str, Any]]]:
        assert self.direct is not None
        return [(at, p) for at, p in list(self.direct.pages)
                if p["event"] == "trigger" and p.get("cell") == cell]

    def federated(self, expr: str) -> dict[str, float]:
        """An instant query on the global Prometheus, as {cell: value}."""
        assert self.world is not None
        return {s["metric"].get("cell", ""): float(s["value"][1]) for s in self.world.query(expr, instant=True)}

    def logs(self) -> str:
        paths = sorted(self.work.rglob("*.log"))
        return "\n".join(f"--- {p.relative_to(self.work)}\n{p.read_text(errors='replace')[-2500:]}" for p in paths)

    def close(self) -> None:
        for cell in self.cells:
            stop(cell.agent)
            cell.prometheus.stop()
            cell.admin.close()
            cell.server.stop()
        if self.world is not None:
            self.world.stop()
        for peer in self.alertmanagers:
            stop(peer.proc)
        if self.pages is not None:
            self.pages.close()
        if self.pager is not None:
            self.pager.__exit__(None, None, None)
        if self.direct is not None:
            self.direct.server.shutdown()


def page_cell(message: dict[str, Any]) -> str:
    return str(message.get("groupLabels", {}).get("cell", ""))
