"""The node agent: collect every interval, push at once on a fault, spool when the server is away,
and serve per-accelerator /metrics on 127.0.0.1:9481.
"""

from __future__ import annotations

import json
import logging
import socket
import threading
import time
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import httpx
from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, generate_latest

from collectors.base import Collector, Readings, SourceUnavailable, create
from collectors.jobs import ExitWatcher, TaskRelay
from collectors.metrics import AgentCollector, AgentSnapshot
from collectors.push import Pusher
from collectors.sim import SimCollector
from collectors.spool import SeqCounter, Spool
from sentinel import __version__
from sentinel.auth.tls import client_ssl_context
from sentinel.ha.failover import failover_client
from sentinel.telemetry.schemas import (
    AcceleratorSample,
    Assignment,
    HardwareEvent,
    NodeCommand,
    NodeRegistration,
    NodeReport,
    ReportAck,
    SdkBatch,
    TaskExit,
    TaskTelemetry,
)

log = logging.getLogger("sentinel.agent")
MAX_SDK_BODY_BYTES = 8 * 2**20


@dataclass
class AgentConfig:
    server_url: str
    token: str
    node: str
    sources: list[str]
    interval_seconds: float = 5.0
    listen_host: str = "127.0.0.1"
    listen_port: int = 9481
    state_dir: Path = field(default_factory=lambda: Path.home() / ".local/share/sentinel/agent")
    spool_max_reports: int = 10_000
    command_poll_seconds: float = 25.0


class Agent:
    def __init__(self, config: AgentConfig, *, sources: list[Collector] | None = None,
                 client: httpx.Client | None = None):
        self.config = config
        state = config.state_dir / config.node
        self.spool = Spool(state / "spool", max_reports=config.spool_max_reports)
        self.seq = SeqCounter(state / "seq", floor=self.spool.highest_seq())
        self.sources_up: dict[str, bool] = {}
        self.sources = sources if sources is not None else self._start_sources(config.sources)
        self.client = client or failover_client(config.server_url, timeout=httpx.Timeout(10.0, connect=3.0),
                                                headers={"authorization": f"Bearer {config.token}"},
                                                verify=client_ssl_context())  # SENTINEL_CA_BUNDLE
        self.pusher = Pusher(client=self.client, node=config.node, spool=self.spool,
                             registration=self.registration, on_ack=self._on_ack, on_registered=self.seq.raise_to)
        self.assignments: list[Assignment] = []
        self.relay = TaskRelay()
        self.exits = ExitWatcher(self.on_task_exit)
        self.latest: dict[str, AcceleratorSample] = {}
        self.health: dict[str, str] = {}
        self.registry = CollectorRegistry(auto_describe=False)
        self.registry.register(AgentCollector(self.snapshot))
        self._stop = threading.Event()
        self._lock = threading.Lock()
        self._http: ThreadingHTTPServer | None = None
        self.url = ""  # where the SDK of tasks on this node reports, once serving (a label the server keeps)
        self.commands_applied = 0

    def _start_sources(self, specs: list[str]) -> list[Collector]:
        started = []
        for spec in specs:
            try:
                source = create(spec, self.config.node)
            except (SourceUnavailable, ValueError, OSError) as exc:
                log.error("source %s unavailable, going on without it: %s", spec, exc)
                self.sources_up[spec.partition(":")[0]] = False
                continue
            started.append(source)
            self.sources_up[source.name] = True
        return started

    def registration(self) -> NodeRegistration:
        return NodeRegistration(
            name=self.config.node, hostname=socket.gethostname(), interval_seconds=self.config.interval_seconds,
            agent_version=__version__, sources=[s.name for s in self.sources],
            accelerators=[info for s in self.sources for info in s.accelerators()],
            labels={"agent_url": self.url} if self.url else {})

    # -- collecting and reporting ------------------------------------------------------------

    def collect(self) -> Readings:
        merged = Readings()
        with self._lock:
            assignments = list(self.assignments)
        for source in self.sources:
            try:
                readings = source.collect(assignments)
            except OSError as exc:
                log.warning("source %s failed this interval: %s", source.name, exc)
                self.sources_up[source.name] = False
                continue
            self.sources_up[source.name] = True
            merged.host = readings.host or merged.host
            merged.accelerators.extend(readings.accelerators)
        with self._lock:
            for sample in merged.accelerators:
                self.latest[sample.uuid] = sample
        return merged

    def task_telemetry(self) -> list[TaskTelemetry]:
        """The SDK's sums since the last report, with each task's device memory as NVML or sim saw it."""
        device_memory: dict[int, int] = {}
        with self._lock:
            for sample in self.latest.values():
                for proc in sample.processes:
                    device_memory[proc.pid] = device_memory.get(proc.pid, 0) + proc.used_bytes
        return self.relay.drain(device_memory)

    def report_now(self, readings: Readings | None = None, events: list[HardwareEvent] | None = None,
                   tasks: list[TaskTelemetry] | None = None, task_exits: list[TaskExit] | None = None) -> int:
        """Spool one report and wake the pusher; returns its seq."""
        readings = readings or Readings()
        seq = self.seq.next()
        report = NodeReport(node=self.config.node, seq=seq, sent_at=time.time(),
                            interval_seconds=self.config.interval_seconds, host=readings.host,
                            accelerators=readings.accelerators, events=events or [], tasks=tasks or [],
                            task_exits=task_exits or [])
        self.spool.append(seq, report.model_dump_json(exclude_none=True).encode())
        self.pusher.wake()
        return seq

    def on_event(self, event: HardwareEvent) -> None:
        """A fault is pushed at once, not at the next interval."""
        with self._lock:
            if event.accelerator_uuid and event.kind != "probe":
                self.health[event.accelerator_uuid] = {"offline": "offline", "clear": "healthy"}.get(
                    event.kind, "degraded")
        log.warning("%s event: node=%s accelerator=%s kind=%s xid=%s value=%s",
                    "probe" if event.kind == "probe" else "fault", self.config.node, event.accelerator_uuid,
                    event.kind, event.xid, event.value)
        self.report_now(events=[event])

    def on_task_exit(self, exit: TaskExit) -> None:
        """A task's end is pushed at once, with whatever telemetry (an exception, last steps) came before it."""
        how = f"signal {exit.signal}" if exit.signal is not None else f"exit code {exit.exit_code}"
        log.warning("task ended: node=%s job=%s rank=%s pid=%d %s", self.config.node, exit.job_id, exit.rank,
                    exit.pid, how)
        self.report_now(tasks=self.task_telemetry(), task_exits=[exit])

    def accept_sdk_batch(self, batch: SdkBatch) -> None:
        self.relay.add(batch)
        self.exits.watch(batch.pid, batch.job_id, batch.rank)

    def _on_ack(self, ack: ReportAck) -> None:
        with self._lock:
            before = {(a.job_id, a.rank, a.pid) for a in self.assignments}
            self.assignments = list(ack.assignments)
        now = {(a.job_id, a.rank, a.pid) for a in ack.assignments}
        if now != before:
            log.info("assignments changed: node=%s seq=%d tasks=%s", self.config.node, ack.seq,
                     " ".join(f"job{j}/rank{r}/pid{p}" for j, r, p in sorted(now, key=str)) or "none")
        for task in ack.assignments:
            if task.pid:
                self.exits.watch(task.pid, task.job_id, task.rank)
        for command in ack.commands:
            self.apply_command(command)

    def apply_command(self, command: NodeCommand) -> None:
        sims = [s for s in self.sources if isinstance(s, SimCollector)]
        if not sims:
            log.error("command %s ignored: node %s has no sim source", command.id, self.config.node)
            return
        try:
            if command.kind == "probe":
                self.on_event(sims[0].probe(command.accelerator_index))
            else:
                sims[0].inject(command.accelerator_index, command.fault, command.argument)
            self.commands_applied += 1
        except ValueError as exc:
            log.error("command %s refused: %s", command.id, exc)

    def _poll_commands(self) -> None:
        while not self._stop.is_set():
            try:
                response = self.client.get(f"/api/v1/nodes/{self.config.node}/commands",
                                           params={"wait": self.config.command_poll_seconds},
                                           timeout=self.config.command_poll_seconds + 10)
                if response.status_code == 200:
                    for raw in response.json():
                        self.apply_command(NodeCommand.model_validate(raw))
                    continue
            except (httpx.HTTPError, ValueError):
                pass
            self._stop.wait(2.0)

    # -- serving /metrics ----------------------------------------------------------------------

    def snapshot(self) -> AgentSnapshot:
        with self._lock:
            return AgentSnapshot(
                node=self.config.node, accelerators=[i for s in self.sources for i in s.accelerators()],
                samples=dict(self.latest), health=dict(self.health), sources_up=dict(self.sources_up),
                counters={"reports_sent_total": self.pusher.sent_total,
                          "reports_rejected_total": self.pusher.rejected_total,
                          "push_failures_total": self.pusher.failures_total,
                          "spool_dropped_total": self.spool.dropped_total,
                          "spool_reports": len(self.spool), "last_seq": self.seq.value,
                          "server_connected": 1.0 if self.pusher.connected else 0.0})

    def serve_http(self) -> int:
        agent = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"  # keep-alive: each SDK keeps one connection open

            def do_GET(self) -> None:
                if self.path.split("?")[0] == "/metrics":
                    self._send(200, generate_latest(agent.registry), CONTENT_TYPE_LATEST)
                elif self.path == "/healthz":
                    self._send(200, b'{"status":"ok"}', "application/json")
                else:
                    self._send(404, b'{"detail":"not found"}', "application/json")

            def do_POST(self) -> None:
                if self.path.split("?")[0] != "/v1/telemetry":
                    self._send(404, b'{"detail":"not found"}', "application/json")
                    return
                length = int(self.headers.get("content-length") or 0)
                if length > MAX_SDK_BODY_BYTES:
                    self._send(413, b'{"detail":"telemetry batch too large"}', "application/json")
                    return
                try:
                    batch = SdkBatch.model_validate_json(self.rfile.read(length))
                except ValueError as exc:
                    self._send(422, json.dumps({"detail": str(exc)[:2000]}).encode(), "application/json")
                    return
                agent.accept_sdk_batch(batch)
                self._send(204, b"", "application/json")

            def _send(self, status: int, body: bytes, content_type: str) -> None:
                self.send_response(status)
                self.send_header("content-type", content_type)
                self.send_header("content-length", str(len(body)))
                if status >= 400:  # the request body may be unread: do not reuse this connection
                    self.send_header("connection", "close")
                    self.close_connection = True
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, format: str, *args: Any) -> None:
                return

        self._http = ThreadingHTTPServer((self.config.listen_host, self.config.listen_port), Handler)
        self._http.daemon_threads = True
        threading.Thread(target=self._http.serve_forever, name="sentinel-agent-http", daemon=True).start()
        port = int(self._http.server_address[1])
        self.url = f"http://{self.config.listen_host}:{port}"
        return port

    # -- lifecycle -----------------------------------------------------------------------------

    def start(self) -> None:
        for source in self.sources:
            source.start(self.on_event)
        self.exits.start()
        self.pusher.start()
        threading.Thread(target=self._poll_commands, name="sentinel-agent-commands", daemon=True).start()

    def run_forever(self) -> None:
        """Collect and report every interval until stopped; intervals are kept on a fixed grid."""
        next_at = time.monotonic()
        while not self._stop.is_set():
            try:
                self.report_now(self.collect(), tasks=self.task_telemetry())
            except Exception:
                log.exception("collection failed this interval: node=%s", self.config.node)
            next_at += self.config.interval_seconds
            self._stop.wait(max(0.0, next_at - time.monotonic()))

    def stop(self, drain_seconds: float = 2.0) -> None:
        self._stop.set()
        self.pusher.stop(drain_seconds=drain_seconds)
        for source in self.sources:
            source.close()
        self.exits.close()
        if self._http is not None:
            self._http.shutdown()
        self.client.close()
