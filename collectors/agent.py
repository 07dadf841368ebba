"""The node agent: collect every interval, push at once on a fault, spool when the server is away,
and serve per-accelerator /metrics on 127.0.0.1:9481.
"""

from __future__ import annotations

import logging
import socket
import threading
import time
from dataclasses import dataclass, field
from http.server import ThreadingHTTPServer
from pathlib import Path

import httpx
from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, generate_latest

from collectors.base import Collector, Readings, SourceUnavailable, create
from collectors.dedup import EventFolder
from collectors.endpoint import serve
from collectors.engines.watch import EngineWatch
from collectors.exits import ExitWatcher
from collectors.experiments import ExchangeListener, result_of
from collectors.jobs import TaskRelay
from collectors.metrics import AgentCollector, AgentSnapshot
from collectors.probes import Prober, ProbeResponder
from collectors.push import Pusher
from collectors.recent import RecentFaults, health_of
from collectors.sdk_gate import SdkGate, Sender
from collectors.sim import SimCollector
from collectors.spool import SeqCounter, Spool
from collectors.wire import ReportLink
from sentinel import __version__
from sentinel.auth.tls import client_ssl_context
from sentinel.ha.failover import failover_client
from sentinel.network.plan import split_address
from sentinel.telemetry.schemas import (
    AcceleratorSample,
    Assignment,
    ExperimentResult,
    HardwareEvent,
    NicPort,
    NodeCommand,
    NodeRegistration,
    NodeReport,
    ProbeResult,
    ReportAck,
    SdkBatch,
    TaskExit,
    TaskTelemetry,
)

log = logging.getLogger("sentinel.agent")
LOOPBACK_HOSTS = ("127.0.0.1", "localhost", "::1")


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
    fold_seconds: float = 60.0  # repeats of an identical event this close together are counted, not sent
    recent_fault_seconds: float = 300.0  # a fault's gauge reads 1 this long, unless it clears sooner
    # the probe mesh (collectors/probes.py): answer probes on this UDP host:port and probe the peers the server
    # assigns; None: take no part. Its address is registered as label `probe_addr`.
    probe_listen: str | None = None
    probe_interval_seconds: float = 1.0
    labels: dict[str, str] = field(default_factory=dict)  # e.g. rack, switch: failure domains for localisation
    engines: list[str] = field(default_factory=list)  # serving engines' /metrics, JOB/RANK=KIND@URL (engines/watch.py)
    canary_seconds: float = 15.0  # between canary completions per engine target (engines/canary.py); 0: none


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
        self.link = ReportLink(config.server_url, token=config.token, ssl_context=client_ssl_context())
        self.pusher = Pusher(client=self.client, link=self.link, node=config.node, spool=self.spool,
                             registration=self.registration, on_ack=self._on_ack, on_registered=self.seq.raise_to)
        self.assignments: list[Assignment] = []
        self.relay = TaskRelay()
        self.engines = EngineWatch(config.engines, config.canary_seconds)  # a bad target fails here, at start
        self.sdk_gate = SdkGate(config.node)  # which SDK batches count (collectors/sdk_gate.py)
        self.exits = ExitWatcher(self.on_task_exit)
        self.latest: dict[str, AcceleratorSample] = {}
        self.folder = EventFolder(config.fold_seconds)  # repeats of an event, counted (collectors/dedup.py)
        self.recent = RecentFaults(config.recent_fault_seconds)  # faults that are recent, for gauges that clear
        self.registry = CollectorRegistry(auto_describe=False)
        self.registry.register(AgentCollector(self.snapshot))
        self._stop = threading.Event()
        self._lock = threading.Lock()
        self._http: ThreadingHTTPServer | None = None
        self.url = ""  # where the SDK of tasks on this node reports, once serving (a label the server keeps)
        self.commands_applied = 0
        self.responder: ProbeResponder | None = None
        self.exchange: ExchangeListener | None = None
        self.prober: Prober | None = None
        self.latest_nics: list[NicPort] = []
        self._loss_pushed_at = 0.0
        if config.probe_listen:
            host, _, port = config.probe_listen.rpartition(":")
            self.responder = ProbeResponder(host.strip("[]") or "127.0.0.1", int(port or 0), node=config.node)
            self.responder.start()
            if split_address(self.responder.address) is None:
                log.warning("probe mesh: %s is not an address peers can probe (give this node's own IP, not a "
                            "wildcard): the server will not assign it as a target", self.responder.address)
            self.prober = Prober(config.node, interval_seconds=config.probe_interval_seconds,
                                 on_loss=self._on_probe_loss)
            try:  # peers' `collective` experiments are answered on the same port, over TCP
                self.exchange = ExchangeListener(*_host_port(self.responder.address))
                self.exchange.start()
            except OSError as exc:
                log.warning("experiment exchange listener unavailable on %s: %s", self.responder.address, exc)
                self.exchange = None

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
        labels = dict(self.config.labels)
        if self.url:
            labels["agent_url"] = self.url
        if self.responder is not None:
            labels["probe_addr"] = self.responder.address
        return NodeRegistration(
            name=self.config.node, hostname=socket.gethostname(), interval_seconds=self.config.interval_seconds,
            agent_version=__version__, sources=[s.name for s in self.sources],
            accelerators=[info for s in self.sources for info in s.accelerators()], labels=labels)

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
            merged.nics.extend(readings.nics)
        with self._lock:
            for sample in merged.accelerators:
                self.latest[sample.uuid] = sample
            self.latest_nics = list(merged.nics)
        return merged

    def task_telemetry(self) -> list[TaskTelemetry]:
        """The SDK's sums since the last report, with each task's device memory as NVML or sim saw it."""
        device_memory: dict[int, int] = {}
        with self._lock:
            for sample in self.latest.values():
                for proc in sample.processes:
                    device_memory[proc.pid] = device_memory.get(proc.pid, 0) + proc.used_bytes
            assignments = list(self.assignments)
        for batch in self.engines.poll(assignments):  # engines without the SDK: their /metrics, once per report
            self.relay.add(batch)
        return self.relay.drain(device_memory)

    def report_now(self, readings: Readings | None = None, events: list[HardwareEvent] | None = None,
                   tasks: list[TaskTelemetry] | None = None, task_exits: list[TaskExit] | None = None,
                   probes: list[ProbeResult] | None = None,
                   experiments: list[ExperimentResult] | None = None, leaving: bool = False) -> int:
        """Spool one report and wake the pusher; returns its seq. `leaving`: the last one, before a stop."""
        readings = readings or Readings()
        leaving = leaving or self._stop.is_set()  # one spooled while stopping must not take the goodbye back
        seq = self.seq.next()
        report = NodeReport(node=self.config.node, seq=seq, sent_at=time.time(),
                            interval_seconds=self.config.interval_seconds, host=readings.host,
                            accelerators=readings.accelerators, events=events or [], tasks=tasks or [],
                            task_exits=task_exits or [], nics=readings.nics, probes=probes or [],
                            experiments=experiments or [], leaving=leaving)
        self.spool.append(seq, report.model_dump_json(exclude_none=True).encode())
        self.pusher.wake()
        return seq

    def on_event(self, event: HardwareEvent) -> None:
        """A fault is pushed at once, not at the next interval; repeats of it are folded (collectors/dedup.py)
        and go with the next interval's report as one event with a count."""
        self.recent.seen(event)
        if self.folder.offer(event) is None:
            return
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

    def _on_probe_loss(self, target: str) -> None:
        """A peer stopped answering: its loss goes to the server now, not at the next interval (an unreachable
        node is an incident in seconds); at most one such push per half second."""
        now = time.monotonic()
        if self.prober is None or now - self._loss_pushed_at < 0.5:
            return
        self._loss_pushed_at = now
        log.warning("probe lost: node=%s peer=%s", self.config.node, target)
        self.report_now(probes=self.prober.drain())

    def drain_probes(self) -> list[ProbeResult]:
        return self.prober.drain() if self.prober is not None else []

    def accept_sdk_batch(self, batch: SdkBatch, sender: Sender) -> None:
        """Relay a batch sent by the process it names, for the task the server placed here as that process;
        raises BatchRefused (counted, logged: collectors/sdk_gate.py) for any other."""
        with self._lock:
            assignments = list(self.assignments)
        self.sdk_gate.admit(batch, sender, assignments)
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
        if ack.probe_targets is not None and self.prober is not None:
            self.prober.set_targets(ack.probe_targets)  # the server assigns only registered agents
        for uuid in ack.cleared:  # released or recovered on the server: its fault gauges return to 0
            self.recent.clear(uuid)
        for task in ack.assignments:
            if task.pid:
                self.exits.watch(task.pid, task.job_id, task.rank)
        for command in ack.commands:
            self.apply_command(command)

    def apply_command(self, command: NodeCommand) -> None:
        sims = [s for s in self.sources if isinstance(s, SimCollector)]
        if command.kind == "experiment":  # on its own thread: an experiment takes seconds
            threading.Thread(target=self._experiment, args=(command, sims), daemon=True).start()
            return
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

    def _experiment(self, command: NodeCommand, sims: list[SimCollector]) -> None:
        def probe(index: int) -> float | None:
            return sims[0].probe(index).value if sims else None

        result = result_of(command, probe=probe if sims else None)
        self.commands_applied += 1
        log.info("experiment done: node=%s id=%s kind=%s value=%s %s error=%s", self.config.node, result.id,
                 result.kind, result.value, result.unit, result.error)
        self.report_now(experiments=[result])

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
        recent = self.recent.snapshot(time.time())
        with self._lock:
            return AgentSnapshot(
                node=self.config.node, accelerators=[i for s in self.sources for i in s.accelerators()],
                samples=dict(self.latest), sources_up=dict(self.sources_up), recent=recent,
                nics=list(self.latest_nics),
                plugin_errors={f"{s.name}:{reason}": n for s in self.sources for reason, n in s.error_counts().items()},
                health={uuid: health_of(faults) for uuid, faults in recent.items()},
                counters={"reports_sent_total": self.pusher.sent_total,
                          "sdk_batches_refused_total": self.sdk_gate.refused_total,
                          "events_folded_total": self.folder.folded_total,
                          "reports_rejected_total": self.pusher.rejected_total,
                          "push_failures_total": self.pusher.failures_total,
                          "spool_dropped_total": self.spool.dropped_total,
                          "spool_reports": len(self.spool), "last_seq": self.seq.value,
                          **self._probe_counters(),
                          "server_connected": 1.0 if self.pusher.connected else 0.0})

    def _probe_counters(self) -> dict[str, float]:
        out: dict[str, float] = {}
        if self.prober is not None:
            out |= {"probes_sent_total": self.prober.sent_total, "probes_lost_total": self.prober.lost_total}
        if self.responder is not None:
            out |= {"probes_answered_total": self.responder.answered_total,
                    "probes_refused_total": self.responder.refused_total + self.responder.limited_total}
        return out

    def serve_http(self) -> int:
        """Serve /metrics and the SDK endpoint; batches are taken only from the process they name (sdk_gate.py)."""
        def metrics() -> tuple[bytes, str]:
            return generate_latest(self.registry), CONTENT_TYPE_LATEST

        host = self.config.listen_host
        self._http = serve(host, self.config.listen_port, metrics=metrics, identify=self.sdk_gate.identify,
                           accept=self.accept_sdk_batch)
        port = int(self._http.server_address[1])
        self.url = f"http://{host}:{port}"
        if host not in LOOPBACK_HOSTS:
            log.info("agent endpoint on %s:%d: /metrics for other hosts; SDK batches only from this node's processes, "
                     "each from the process it names", host, port)
        return port

    # -- lifecycle -----------------------------------------------------------------------------

    def start(self) -> None:
        for source in self.sources:
            source.start(self.on_event)
        self.exits.start()
        self.pusher.start()
        threading.Thread(target=self._poll_commands, name="sentinel-agent-commands", daemon=True).start()
        if self.prober is not None:
            self.prober.start()

    def run_forever(self) -> None:
        """Collect and report every interval until stopped; intervals are kept on a fixed grid."""
        next_at = time.monotonic()
        while not self._stop.is_set():
            try:
                self.report_now(self.collect(), events=self.folder.flush(time.time()), tasks=self.task_telemetry(),
                                probes=self.drain_probes())
            except Exception:
                log.exception("collection failed this interval: node=%s", self.config.node)
            next_at += self.config.interval_seconds
            self._stop.wait(max(0.0, next_at - time.monotonic()))

    def stop(self, drain_seconds: float = 2.0) -> None:
        """A stop on purpose: the last report (with any counted repeats: spooled, not lost) says so, and the
        server takes the silence that follows for no fault."""
        self._stop.set()
        self.report_now(events=self.folder.flush(time.time()), leaving=True)
        log.info("agent stopping: node=%s; the last report says so", self.config.node)
        for part in (self.prober, self.responder, self.exchange):
            if part is not None:
                part.close()
        self.pusher.stop(drain_seconds=drain_seconds)
        self.seq.close()
        for source in self.sources:
            source.close()
        self.exits.close()
        if self._http is not None:
            self._http.shutdown()
        self.link.close()
        self.client.close()


def _host_port(address: str) -> tuple[str, int]:
    host, _, port = address.rpartition(":")
    return host.strip("[]"), int(port)
