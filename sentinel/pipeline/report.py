"""The report pipeline, declared in one place: what happens to an agent's report on its way to a page.

    agent     collectors/agent.py: Agent.cycle → collectors/push.py: Pusher.send (spooled when the server is away)
    edge      nodes/api.py: serve_report (pure ASGI, ahead of the middleware stack) → ingest_report →
              ReportPipeline.receive (below)
    1 store        pipeline/ingest.py: Ingest.accept: validate, dedup on (node, seq), group commit, fleet view
    2 live views   ReportPipeline.update_views: job telemetry, task exits, assignments (live/), the step-time
                   decomposition and experiment results (diagnosis/)
    3 detect       ReportPipeline.detect → detection/engine.py: DetectionEngine.on_report: event detectors;
                   findings are queued for the incident worker (the request is not held up)
    4 incidents    detection/engine.py: DetectionEngine._write → incidents/lifecycle.py: Incidents.record,
                   which owes notifications in the same transaction (Outbox: alerting/dispatcher.py)
    5 notify       alerting/dispatcher.py: Dispatcher.run_once → alerting/notifiers/ (Alertmanager, PagerDuty, …)
    5 remediate    remediation/engine.py: RemediationEngine.on_incident → handle → remediation/service.py →
                   executors (remediation/executors/: launcher orders, Slurm, Kubernetes)
    ack            ReportPipeline.ack: the node's assignments and pending commands ride back on the answer

Periodic detectors (APScheduler, scheduler.py) enter at 3 from the live views; they are not per report.
Stages 2 and 3 run on the event loop after the commit, in this order, each guarded: one failing stage is
logged and counted, and never loses the report (it is stored) or stops the next stage.
"""

from __future__ import annotations

import logging

from sqlalchemy.orm import Session

from sentinel.accelerators.models import Accelerator
from sentinel.clock import Clock
from sentinel.detection.engine import DetectionEngine
from sentinel.diagnosis.engine import Diagnoser
from sentinel.jobs.service import ClosedTask
from sentinel.live.fleet import NodeLive
from sentinel.live.view import LiveView
from sentinel.nodes import service as nodes
from sentinel.nodes.commands import CommandQueue
from sentinel.nodes.models import Node
from sentinel.pipeline.ingest import Ingest, Outcome
from sentinel.remediation.engine import RemediationEngine
from sentinel.telemetry.schemas import NodeRegistration, NodeReport, ReportAck

log = logging.getLogger("sentinel.pipeline")


class ReportPipeline:
    def __init__(self, *, ingest: Ingest, live: LiveView, detection: DetectionEngine,
                 remediation: RemediationEngine, commands: CommandQueue, clock: Clock,
                 errors: dict[str, int] | None = None, diagnosis: Diagnoser | None = None):
        self.ingest = ingest
        self.live = live
        self.detection = detection
        self.remediation = remediation
        self.commands = commands
        self.clock = clock
        self.errors = errors if errors is not None else {}
        self.diagnosis = diagnosis

    # -- before the first report ------------------------------------------------------------------------
    def register(self, session: Session, reg: NodeRegistration) -> tuple[Node, list[Accelerator], NodeLive]:
        """A node and its accelerators, in SQL and in the live views (inside the caller's transaction)."""
        node, accelerators = nodes.register_node(session, reg)
        present = {a.uuid for a in accelerators if a.present}
        live = self.live.fleet.apply(node, present, last_seen=self.clock.time())
        self.live.network.registered(reg.name, dict(reg.labels))  # its probe address and failure domains
        for acc in accelerators:
            self.live.jobs.accelerators[acc.uuid] = (acc.model, acc.peak_flops, acc.memory_total_bytes)
        return node, accelerators, live

    # -- one report -------------------------------------------------------------------------------------
    async def receive(self, report: NodeReport, path_node: str) -> Outcome:
        """Stage 1, then (for a report not seen before) stages 2 and 3. Raises IngestError for a refused one."""
        outcome = await self.ingest.accept(report, path_node)
        if not outcome.duplicate:
            self.after_store(outcome.live, report, outcome.exits)
        return outcome

    def after_store(self, live: NodeLive, report: NodeReport, exits: list[ClosedTask]) -> None:
        for name, stage in (("update_views", self.update_views), ("detect", self.detect),
                            ("probe_results", self.probe_results)):
            try:
                stage(live, report, exits)
            except Exception:
                self.errors[f"pipeline:{name}"] = self.errors.get(f"pipeline:{name}", 0) + 1
                log.exception("report stage failed: stage=%s node=%s seq=%d", name, live.name, report.seq)

    def update_views(self, live: NodeLive, report: NodeReport, exits: list[ClosedTask]) -> None:
        """Stage 2: the job views learn the tasks' telemetry and exits; an exit re-reads the assignments."""
        jobs = self.live.jobs
        tasks = [t for t in report.tasks if not self.live.assignments.elsewhere(live.id, t.job_id, t.rank)]
        if len(tasks) < len(report.tasks):  # an agent cannot vouch for a rank the server placed on another node
            self.ingest.drop("task_elsewhere", len(report.tasks) - len(tasks))
            log.warning("task telemetry dropped: node=%s seq=%d tasks=%s: placed on other nodes", live.name,
                        report.seq, " ".join(f"job{t.job_id}/rank{t.rank}" for t in report.tasks if t not in tasks))
        if tasks:
            jobs.add(live.name, tasks, self.clock.time())
            for task in tasks:
                if task.serving is not None:
                    self.live.serving.add(live.name, task.job_id, task.rank, task.serving, self.clock.time(),
                                          pid=task.pid)
        if report.probes or report.nics:
            self.live.network.reported(live.name, report.probes, report.nics, self.clock.time())
        if self.diagnosis is not None:  # the step decomposition, host memory, experiment results
            self.diagnosis.reported(live.name, tasks, report, self.clock.time())
        for closed in exits:
            jobs.mark_ended(closed.job_id, closed.rank, closed.pid, reason=closed.failure_reason or "",
                            at=self.clock.time())
            if closed.failure_reason:
                jobs.count_failure(closed.job_id, closed.failure_reason)
        if exits:
            self.live.assignments.refresh()

    def detect(self, live: NodeLive, report: NodeReport, exits: list[ClosedTask]) -> None:
        """Stage 3: the event detectors (hardware faults, task exits) on this report; 4 and 5 follow from there."""
        self.detection.on_report(live, report, exits)

    def probe_results(self, live: NodeLive, report: NodeReport, exits: list[ClosedTask]) -> None:
        """A probe result (a GEMM on a suspect accelerator) goes to remediation, which asked for it."""
        self.remediation.on_report(live, report, exits)

    def ack(self, outcome: Outcome, report: NodeReport, node: str) -> ReportAck:
        """What the agent gets back: kept or duplicate, its node's assignments, commands waiting for it, and
        the peers it is to probe this round (registered agents only: network/plan.py)."""
        return ReportAck(status="duplicate" if outcome.duplicate else "accepted", node=node, seq=report.seq,
                         assignments=self.live.assignments.of(outcome.live.id), commands=self.commands.take(node),
                         cleared=self.live.fleet.take_cleared(node),
                         probe_targets=self.live.network.targets(node, self.clock.time()))
