"""The server's /metrics: fleet, job and reliability series built fresh on each scrape from the parts
the composition root hands over (`Sources`), never from a router."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

from prometheus_client import CollectorRegistry
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector
from sqlalchemy.orm import Session, sessionmaker

from sentinel.accelerators.service import count_by_health
from sentinel.alerting.dispatcher import Dispatcher
from sentinel.auth.service import TokenCache
from sentinel.checkpoints.service import fleet_fault_rate_per_hour
from sentinel.clock import Clock, to_datetime
from sentinel.incidents.lifecycle import Incidents
from sentinel.jobs.service import JobNotFound, get_job
from sentinel.live.view import LiveView
from sentinel.network.metrics import network_families
from sentinel.nodes.service import fault_rates
from sentinel.pipeline.ingest import Ingest
from sentinel.remediation.engine import RemediationEngine
from sentinel.remediation.recovery import JobHealth
from sentinel.serving.metrics import ServingCollector


@dataclass(frozen=True)
class Sources:
    """What a scrape reads."""

    sessions: sessionmaker[Session]
    clock: Clock
    live: LiveView
    ingest: Ingest
    incidents: Incidents
    dispatcher: Dispatcher
    remediation: RemediationEngine
    tokens: TokenCache
    plugin_errors: dict[str, int]
    leading: Callable[[], bool]


def _counter(name: str, doc: str, labels: list[str], counts: dict[Any, int]) -> CounterMetricFamily:
    family = CounterMetricFamily(name, doc, labels=labels)
    for key, count in sorted(counts.items()):
        family.add_metric(list(key) if isinstance(key, tuple) else [key], count)
    return family


class FleetCollector(Collector):
    def __init__(self, sources: Sources):
        self._s = sources

    def collect(self) -> Iterator[Metric]:
        s = self._s
        nodes = GaugeMetricFamily("sentinel_nodes", "Nodes by state", labels=["state"])
        for state, count in s.live.fleet.count_by_state().items():
            nodes.add_metric([state], count)
        yield nodes
        accelerators = GaugeMetricFamily("sentinel_accelerators", "Present accelerators by health", labels=["health"])
        try:
            with s.sessions() as session:
                counts = count_by_health(session)
        except Exception:  # the database being away must not fail the scrape
            counts = {}
        for health, count in counts.items():
            accelerators.add_metric([health], count)
        yield accelerators
        yield from self._ingest()
        incidents = GaugeMetricFamily("sentinel_incidents_open", "Incidents not yet resolved, by severity",
                                      labels=["severity"])
        for severity, count in s.incidents.open_counts().items():
            incidents.add_metric([severity], count)
        yield incidents
        yield _counter("sentinel_notifications", "Notification deliveries by receiver, event and result",
                       ["receiver", "event", "result"], s.dispatcher.snapshot())
        yield _counter("sentinel_remediations", "Automatic actions by action and result", ["action", "result"],
                       s.remediation.snapshot())
        yield GaugeMetricFamily("sentinel_breaker_open", "1 while the circuit breaker stops automatic actions",
                                value=1.0 if s.remediation.breaker.open else 0.0)
        yield _counter("sentinel_plugin_errors", "Failures of scheduled jobs and plugins", ["plugin"],
                       dict(s.plugin_errors))
        yield from network_families(s.live.network, s.clock.time())

    def _ingest(self) -> Iterator[Metric]:
        ingest = self._s.ingest
        yield CounterMetricFamily("sentinel_ingest_reports", "Node reports accepted and stored",
                                  value=ingest.accepted_total)
        yield CounterMetricFamily("sentinel_ingest_duplicates", "Replayed reports acknowledged, not counted again",
                                  value=ingest.duplicates_total)
        yield _counter("sentinel_ingest_rejected", "Reports refused, by reason", ["reason"],
                       dict(ingest.rejected_total))
        yield _counter("sentinel_ingest_dropped", "Parts of accepted reports not taken, by reason (task_elsewhere: "
                       "telemetry for a rank placed on other nodes)", ["reason"], dict(ingest.dropped_total))


JOB_LABELS = ["job", "kind"]
JOB_GAUGES = (
    ("mfu_ratio", "Model FLOPs utilization over the recent window"),
    ("allreduce_time_ratio", "Share of step time in collectives, mean over ranks"),
    ("allreduce_exposed_time_ratio", "Share of step time waiting for collectives compute did not hide"),
    ("tokens_per_second", "Tokens per second, summed over ranks"),
    ("memory_peak_bytes", "Highest memory in use by any rank"),
    ("memory_capacity_bytes", "Memory of the accelerators a rank runs on"),
)
CHECKPOINT_GAUGES = (
    ("step", "Newest committed checkpoint step"),
    ("stall_seconds", "What a save blocks the training loop for (median of recent saves, slowest rank)"),
    ("write_seconds", "Background write time of a save (median of recent saves, slowest rank)"),
    ("size_bytes", "Size of the newest committed checkpoint, all ranks"),
    ("interval_seconds", "Observed time between committed checkpoints"),
    ("interval_recommended_seconds", "Recommended interval: the checkpoint interval policy's (Young/Daly by default)"),
)


class JobFamilies:
    """The `sentinel_job_*` families of one scrape, filled job by job."""

    def __init__(self) -> None:
        self.gauges = {name: GaugeMetricFamily(f"sentinel_job_{name}", doc, labels=JOB_LABELS)
                       for name, doc in JOB_GAUGES}
        self.step = Metric("sentinel_job_step_seconds", "Step time over the recent window", "summary")
        self.rank_step = GaugeMetricFamily("sentinel_job_rank_step_seconds", "Median step time per rank",
                                           labels=[*JOB_LABELS, "rank"])
        self.rank_share = GaugeMetricFamily("sentinel_job_rank_allreduce_time_ratio", "Collective share per rank",
                                            labels=[*JOB_LABELS, "rank"])
        self.failures = CounterMetricFamily("sentinel_job_task_failures", "Task failures by reason",
                                            labels=[*JOB_LABELS, "reason"])
        self.recovered = GaugeMetricFamily("sentinel_job_recovery_seconds",
                                           "Last recovery: fault observed to the job stepping again", labels=JOB_LABELS)
        self.lost = CounterMetricFamily("sentinel_job_lost_steps", "Steps recomputed after restarts", labels=JOB_LABELS)
        self.goodput = GaugeMetricFamily(
            "sentinel_job_goodput_ratio",
            "1 − (recovery time + recomputed steps × median step) ÷ time since the job started", labels=JOB_LABELS)
        self.checkpoint = {name: GaugeMetricFamily(f"sentinel_job_checkpoint_{name}", doc, labels=JOB_LABELS)
                           for name, doc in CHECKPOINT_GAUGES}
        self.checkpoint_written = CounterMetricFamily("sentinel_job_checkpoint_written_bytes",
                                                      "Bytes checkpoint saves wrote (only chunks a store lacked)",
                                                      labels=JOB_LABELS)

    def add(self, lv: list[str], health: JobHealth, recovery_seconds: float | None) -> None:
        self._checkpoints(lv, health)
        m = health.metrics
        for name, value in (("mfu_ratio", m.mfu_ratio), ("allreduce_time_ratio", m.allreduce_time_ratio),
                            ("allreduce_exposed_time_ratio", m.allreduce_exposed_ratio),
                            ("tokens_per_second", m.tokens_per_second), ("memory_peak_bytes", m.memory_peak_bytes),
                            ("memory_capacity_bytes", m.memory_capacity_bytes)):
            if value is not None:
                self.gauges[name].add_metric(lv, float(value))
        labels = {"job": lv[0], "kind": lv[1]}
        for q, value in (("0.5", m.step_seconds_p50), ("0.95", m.step_seconds_p95)):
            if value is not None:
                self.step.add_sample("sentinel_job_step_seconds", {**labels, "quantile": q}, value)
        if m.steps_in_window:
            self.step.add_sample("sentinel_job_step_seconds_count", labels, m.steps_in_window)
            self.step.add_sample("sentinel_job_step_seconds_sum", labels, m.step_seconds_sum)
        for r in m.ranks:
            if r.step_seconds_p50 is not None:
                self.rank_step.add_metric([*lv, str(r.rank)], r.step_seconds_p50)
            if r.allreduce_time_ratio is not None:
                self.rank_share.add_metric([*lv, str(r.rank)], r.allreduce_time_ratio)
        for reason, count in sorted(m.task_failures.items()):
            self.failures.add_metric([*lv, reason], count)
        if recovery_seconds is not None:
            self.recovered.add_metric(lv, recovery_seconds)
        self.lost.add_metric(lv, m.lost_steps_total)
        if m.goodput_ratio is not None:
            self.goodput.add_metric(lv, m.goodput_ratio)

    def _checkpoints(self, lv: list[str], health: JobHealth) -> None:
        policy = health.checkpoints
        for name, value in (("step", policy.last_committed_step), ("stall_seconds", policy.stall_seconds),
                            ("write_seconds", policy.write_seconds), ("size_bytes", policy.bytes_total),
                            ("interval_seconds", policy.interval_observed_seconds),
                            ("interval_recommended_seconds", policy.interval_recommended_seconds)):
            if value is not None:
                self.checkpoint[name].add_metric(lv, float(value))
        self.checkpoint_written.add_metric(lv, policy.bytes_written_total)

    def all(self) -> Iterator[Metric]:
        yield from self.gauges.values()
        yield from (self.step, self.rank_step, self.rank_share, self.failures, self.recovered, self.lost,
                    self.goodput, self.checkpoint_written)
        yield from self.checkpoint.values()


class JobCollector(Collector):
    """`sentinel_job_*` (label `job` is the job id; Prometheus scrape configs should set honor_labels)."""

    def __init__(self, sources: Sources):
        self._s = sources

    def collect(self) -> Iterator[Metric]:
        s = self._s
        families = JobFamilies()
        recovery = dict(s.remediation.recoveries.seconds)
        try:
            with s.sessions() as session:
                now = s.clock.time()
                fleet_rate = fleet_fault_rate_per_hour(session, to_datetime(now))
                jobs = []
                for job_id in s.live.jobs.job_ids():
                    try:
                        job = get_job(session, job_id)
                    except JobNotFound:
                        continue
                    jobs.append((job, s.remediation.recoveries.job_health(session, job, now, fleet_rate=fleet_rate)))
        except Exception:  # the database being away must not fail the scrape
            jobs = []
        for job, health in jobs:
            families.add([str(job.id), job.kind], health, recovery.get(job.id))
        yield from families.all()


class ReliabilityCollector(Collector):
    def __init__(self, sources: Sources):
        self._s = sources

    def collect(self) -> Iterator[GaugeMetricFamily]:
        try:
            with self._s.sessions() as session:
                rows = fault_rates(session, to_datetime(self._s.clock.time()))
        except Exception:
            return
        faults, days = sum(r[1] for r in rows), sum(r[2] for r in rows)
        if days > 0:
            yield GaugeMetricFamily("sentinel_fleet_hardware_fault_rate",
                                    "Hardware faults per 1,000 accelerator-days since registration (Meta's unit)",
                                    value=1000.0 * faults / days)
        per_node = GaugeMetricFamily("sentinel_node_hardware_faults", "Hardware faults recorded per node",
                                     labels=["node"])
        for node, count, _ in rows:
            per_node.add_metric([node], count)
        yield per_node


class ServerCollector(Collector):
    """This server's role. A standby exports only this: the fleet's series come from the leader alone,
    so a Prometheus scraping every server never counts a node twice."""

    def __init__(self, sources: Sources):
        self._s = sources

    def collect(self) -> Iterator[Metric]:
        yield GaugeMetricFamily("sentinel_server_leader", "1 on the server that leads, 0 on a standby",
                                value=1.0 if self._s.leading() else 0.0)


class LeaderOnly(Collector):
    def __init__(self, sources: Sources, inner: Collector):
        self._s = sources
        self._inner = inner

    def collect(self) -> Iterator[Metric]:
        if self._s.leading():
            yield from self._inner.collect()


class RateLimitCollector(Collector):
    """Requests refused with 429 by this server's per-token rate limits (auth/ratelimit.py), by role."""

    def __init__(self, sources: Sources):
        self._s = sources

    def collect(self) -> Iterator[Metric]:
        yield _counter("sentinel_rate_limited", "Requests refused for their token's rate limit", ["role"],
                       self._s.tokens.limiter.snapshot())


def build_registry(sources: Sources) -> CollectorRegistry:
    registry = CollectorRegistry(auto_describe=False)
    registry.register(RateLimitCollector(sources))  # every server, leader or not: each limits its own callers
    registry.register(ServerCollector(sources))
    for collector in (FleetCollector(sources), JobCollector(sources), ReliabilityCollector(sources),
                      ServingCollector(lambda: sources.live.serving, sources.clock)):
        registry.register(LeaderOnly(sources, collector))
    registry.register(sources.incidents.latency)
    return registry
