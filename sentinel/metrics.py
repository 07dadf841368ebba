"""The server's /metrics: fleet series built fresh on each scrape from what the runtime holds."""

from __future__ import annotations

from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

from prometheus_client import CollectorRegistry
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from sentinel.accelerators.service import count_by_health
from sentinel.clock import to_datetime

if TYPE_CHECKING:
    from sentinel.checkpoints.schemas import CheckpointPolicy
    from sentinel.jobs.schemas import JobMetrics
    from sentinel.runtime import Runtime


class FleetCollector(Collector):
    def __init__(self, runtime: Runtime):
        self._rt = runtime

    def collect(self) -> Iterator[Metric]:
        nodes = GaugeMetricFamily("sentinel_nodes", "Nodes by state", labels=["state"])
        for state, count in self._rt.fleet.count_by_state().items():
            nodes.add_metric([state], count)
        yield nodes
        accelerators = GaugeMetricFamily("sentinel_accelerators", "Present accelerators by health", labels=["health"])
        try:
            with self._rt.factory() as session:
                counts = count_by_health(session)
        except Exception:  # the database being away must not fail the scrape
            counts = {}
        for health, count in counts.items():
            accelerators.add_metric([health], count)
        yield accelerators
        ingest = self._rt.ingest
        yield CounterMetricFamily("sentinel_ingest_reports", "Node reports accepted and stored",
                                  value=ingest.accepted_total)
        yield CounterMetricFamily("sentinel_ingest_duplicates", "Replayed reports acknowledged, not counted again",
                                  value=ingest.duplicates_total)
        rejected = CounterMetricFamily("sentinel_ingest_rejected", "Reports refused, by reason", labels=["reason"])
        for reason, count in sorted(ingest.rejected_total.items()):
            rejected.add_metric([reason], count)
        yield rejected
        incidents = GaugeMetricFamily("sentinel_incidents_open", "Incidents not yet resolved, by severity",
                                      labels=["severity"])
        for severity, count in self._rt.incidents.open_counts().items():
            incidents.add_metric([severity], count)
        yield incidents
        sent = CounterMetricFamily("sentinel_notifications", "Notification deliveries by receiver, event and result",
                                   labels=["receiver", "event", "result"])
        for (receiver, event, result), count in sorted(self._rt.dispatcher.snapshot().items()):
            sent.add_metric([receiver, event, result], count)
        yield sent
        remediations = CounterMetricFamily("sentinel_remediations", "Automatic actions by action and result",
                                           labels=["action", "result"])
        for (action, result), count in sorted(self._rt.remediation.snapshot().items()):
            remediations.add_metric([action, result], count)
        yield remediations
        yield GaugeMetricFamily("sentinel_breaker_open", "1 while the circuit breaker stops automatic actions",
                                value=1.0 if self._rt.remediation.breaker.open else 0.0)
        errors = CounterMetricFamily("sentinel_plugin_errors", "Failures of scheduled jobs and plugins",
                                     labels=["plugin"])
        for plugin, count in sorted(self._rt.plugin_errors.items()):
            errors.add_metric([plugin], count)
        yield errors


class JobCollector(Collector):
    """`sentinel_job_*` (label `job` is the job id; Prometheus scrape configs should set honor_labels)."""

    def __init__(self, runtime: Runtime):
        self._rt = runtime

    def collect(self) -> Iterator[Metric]:
        from sentinel.checkpoints.api import checkpoint_policy, fleet_fault_rate_per_hour
        from sentinel.jobs.api import job_metrics
        from sentinel.jobs.service import JobNotFound, current_placement, get_job

        labels = ["job", "kind"]
        g = {name: GaugeMetricFamily(f"sentinel_job_{name}", doc, labels=labels) for name, doc in (
            ("mfu_ratio", "Model FLOPs utilization over the recent window"),
            ("allreduce_time_ratio", "Share of step time in collectives, mean over ranks"),
            ("allreduce_exposed_time_ratio", "Share of step time waiting for collectives compute did not hide"),
            ("tokens_per_second", "Tokens per second, summed over ranks"),
            ("memory_peak_bytes", "Highest memory in use by any rank"),
            ("memory_capacity_bytes", "Memory of the accelerators a rank runs on"),
        )}
        step = Metric("sentinel_job_step_seconds", "Step time over the recent window", "summary")
        rank_step = GaugeMetricFamily("sentinel_job_rank_step_seconds", "Median step time per rank",
                                      labels=[*labels, "rank"])
        rank_share = GaugeMetricFamily("sentinel_job_rank_allreduce_time_ratio", "Collective share per rank",
                                       labels=[*labels, "rank"])
        failures = CounterMetricFamily("sentinel_job_task_failures", "Task failures by reason",
                                       labels=[*labels, "reason"])
        recovered = GaugeMetricFamily("sentinel_job_recovery_seconds",
                                      "Last recovery: fault observed to the job stepping again", labels=labels)
        recovery = dict(self._rt.remediation.recovery_seconds)
        lost = CounterMetricFamily("sentinel_job_lost_steps", "Steps recomputed after restarts", labels=labels)
        goodput = GaugeMetricFamily("sentinel_job_goodput_ratio",
                                    "1 − (recovery time + recomputed steps × median step) ÷ time since the job started",
                                    labels=labels)
        ckpt = {name: GaugeMetricFamily(f"sentinel_job_checkpoint_{name}", doc, labels=labels) for name, doc in (
            ("step", "Newest committed checkpoint step"),
            ("stall_seconds", "What a save blocks the training loop for (median of recent saves, slowest rank)"),
            ("write_seconds", "Background write time of a save (median of recent saves, slowest rank)"),
            ("size_bytes", "Size of the newest committed checkpoint, all ranks"),
            ("interval_seconds", "Observed time between committed checkpoints"),
            ("interval_recommended_seconds", "Young/Daly interval √(2·stall·MTBF) from the live failure rate"),
        )}
        ckpt_written = CounterMetricFamily("sentinel_job_checkpoint_written_bytes",
                                           "Bytes checkpoint saves wrote (only chunks a store lacked)", labels=labels)
        jobs: list[tuple[Any, dict[int, list[str]], JobMetrics, CheckpointPolicy]] = []
        try:
            with self._rt.factory() as session:
                fleet_rate = fleet_fault_rate_per_hour(session, to_datetime(self._rt.clock.time()))
                for job_id in self._rt.jobs.job_ids():
                    try:
                        job = get_job(session, job_id)
                    except JobNotFound:
                        continue
                    placement = current_placement(session, job_id)
                    m = job_metrics(self._rt, job.id, job.created_at, placement)
                    policy = checkpoint_policy(self._rt, session, job, failures_per_hour=m.failures_per_hour,
                                               accelerators=sum(len(a) for a in placement.values()) or job.world_size,
                                               step_seconds=m.step_seconds_p50, fleet_rate=fleet_rate)
                    jobs.append((job, placement, m, policy))
        except Exception:  # the database being away must not fail the scrape
            jobs = []
        for job, _, m, policy in jobs:
            lv = [str(job.id), job.kind]
            for name, value in (("step", policy.last_committed_step), ("stall_seconds", policy.stall_seconds),
                                ("write_seconds", policy.write_seconds), ("size_bytes", policy.bytes_total),
                                ("interval_seconds", policy.interval_observed_seconds),
                                ("interval_recommended_seconds", policy.interval_recommended_seconds)):
                if value is not None:
                    ckpt[name].add_metric(lv, float(value))
            ckpt_written.add_metric(lv, policy.bytes_written_total)
            for name, value in (("mfu_ratio", m.mfu_ratio), ("allreduce_time_ratio", m.allreduce_time_ratio),
                                ("allreduce_exposed_time_ratio", m.allreduce_exposed_ratio),
                                ("tokens_per_second", m.tokens_per_second), ("memory_peak_bytes", m.memory_peak_bytes),
                                ("memory_capacity_bytes", m.memory_capacity_bytes)):
                if value is not None:
                    g[name].add_metric(lv, float(value))
            for q, value in (("0.5", m.step_seconds_p50), ("0.95", m.step_seconds_p95)):
                if value is not None:
                    step.add_sample("sentinel_job_step_seconds", {"job": lv[0], "kind": lv[1], "quantile": q}, value)
            if m.steps_in_window:
                step.add_sample("sentinel_job_step_seconds_count", {"job": lv[0], "kind": lv[1]}, m.steps_in_window)
                step.add_sample("sentinel_job_step_seconds_sum", {"job": lv[0], "kind": lv[1]}, m.step_seconds_sum)
            for r in m.ranks:
                if r.step_seconds_p50 is not None:
                    rank_step.add_metric([*lv, str(r.rank)], r.step_seconds_p50)
                if r.allreduce_time_ratio is not None:
                    rank_share.add_metric([*lv, str(r.rank)], r.allreduce_time_ratio)
            for reason, count in sorted(m.task_failures.items()):
                failures.add_metric([*lv, reason], count)
            if job.id in recovery:
                recovered.add_metric(lv, recovery[job.id])
            lost.add_metric(lv, m.lost_steps_total)
            if m.goodput_ratio is not None:
                goodput.add_metric(lv, m.goodput_ratio)
        yield from g.values()
        yield from (step, rank_step, rank_share, failures, recovered, lost, goodput, ckpt_written)
        yield from ckpt.values()


class ReliabilityCollector(Collector):
    def __init__(self, runtime: Runtime):
        self._rt = runtime

    def collect(self) -> Iterator[GaugeMetricFamily]:
        from sentinel.clock import to_datetime
        from sentinel.nodes.service import fault_rates

        try:
            with self._rt.factory() as session:
                rows = fault_rates(session, to_datetime(self._rt.clock.time()))
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

    def __init__(self, runtime: Runtime):
        self._rt = runtime

    def collect(self) -> Iterator[Metric]:
        yield GaugeMetricFamily("sentinel_server_leader", "1 on the server that leads, 0 on a standby",
                                value=1.0 if self._rt.leading else 0.0)


class LeaderOnly(Collector):
    def __init__(self, runtime: Runtime, inner: Collector):
        self._rt = runtime
        self._inner = inner

    def collect(self) -> Iterator[Metric]:
        if self._rt.leading:
            yield from self._inner.collect()


class RateLimitCollector(Collector):
    """Requests refused with 429 by this server's per-token rate limits (auth/ratelimit.py), by role."""

    def __init__(self, runtime: Runtime):
        self._rt = runtime

    def collect(self) -> Iterator[Metric]:
        limited = CounterMetricFamily("sentinel_rate_limited", "Requests refused for their token's rate limit",
                                      labels=["role"])
        for role, count in sorted(self._rt.tokens.limiter.snapshot().items()):
            limited.add_metric([role], count)
        yield limited


def build_registry(runtime: Runtime) -> CollectorRegistry:
    registry = CollectorRegistry(auto_describe=False)
    registry.register(RateLimitCollector(runtime))  # every server, leader or not: each limits its own callers
    registry.register(ServerCollector(runtime))
    for collector in (FleetCollector(runtime), JobCollector(runtime), ReliabilityCollector(runtime)):
        registry.register(LeaderOnly(runtime, collector))
    registry.register(runtime.incidents.latency)
    return registry
