"""The composition root: everything one server process holds, built from settings and an injected clock.

`build` wires the parts once, in the order the report path runs (pipeline/report.py tells that path):
the live layer (live/view.py), ingest and the pipeline, detection → incidents → the dispatcher (their
outbox) and remediation (an incident listener). Nothing starts until `start()`; the loops run only on
the leader (`lead()`, once the lock is held). Routers get their parts through typed dependencies
(sentinel/deps.py), never this object.
"""

from __future__ import annotations

import logging
import os
import socket
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import datetime

from sqlalchemy import Engine
from sqlalchemy.orm import Session, sessionmaker

from sentinel.accelerators.service import out_of_service
from sentinel.alerting.dispatcher import Dispatcher
from sentinel.auth.service import TokenCache, count_tokens, create_token
from sentinel.clock import Clock, SystemClock, to_datetime
from sentinel.config import Settings
from sentinel.db import make_engine, make_sessionmaker, migration_lock, transaction, upgrade
from sentinel.detection.base import DetectionContext
from sentinel.detection.catalog import FaultCatalog
from sentinel.detection.engine import DetectionEngine, load_detectors
from sentinel.diagnosis.components import ComponentStore
from sentinel.diagnosis.engine import Diagnoser
from sentinel.diagnosis.wiring import annotate_incident, job_attributes
from sentinel.ha.leader import Elector, make_lock
from sentinel.incidents.lifecycle import Incidents
from sentinel.live.checkpoints import CheckpointLedger
from sentinel.live.faults import FaultHistory
from sentinel.live.fleet import Fleet
from sentinel.live.jobs import JobTelemetry
from sentinel.live.liveness import check_liveness, flush_liveness, prune_receipts
from sentinel.live.samples import SampleStore
from sentinel.live.view import LiveView
from sentinel.network.view import NetworkView
from sentinel.nodes.commands import CommandQueue
from sentinel.pipeline.ingest import Ingest
from sentinel.pipeline.report import ReportPipeline
from sentinel.pipeline.writer import GroupCommitWriter
from sentinel.policy.scheduled import FLUSH_SECONDS, PRUNE_SECONDS, flush_decisions, prune_decisions
from sentinel.policy.wiring import LivePolicies, build_policies
from sentinel.remediation.engine import RemediationEngine
from sentinel.scheduler import Periodic
from sentinel.serving.batching import BatchingController

log = logging.getLogger("sentinel.server")


@dataclass
class Runtime:
    settings: Settings
    clock: Clock
    engine: Engine
    factory: sessionmaker[Session]
    live: LiveView
    ingest: Ingest
    pipeline: ReportPipeline
    tokens: TokenCache
    commands: CommandQueue
    incidents: Incidents
    detection: DetectionEngine
    dispatcher: Dispatcher
    remediation: RemediationEngine
    policies: LivePolicies
    diagnosis: Diagnoser
    plugin_errors: dict[str, int] = field(default_factory=dict)
    ready: bool = False
    elector: Elector | None = None
    led: bool = False  # lead() finished: the in-memory view is loaded and the loops run
    on_lost_lead: Callable[[], None] = field(default=lambda: None)
    batching: BatchingController | None = None  # serving jobs' batch limits (sentinel/serving/batching.py)

    @classmethod
    def build(cls, settings: Settings, clock: Clock | None = None) -> Runtime:
        clock = clock or SystemClock()
        engine = make_engine(settings.effective_database_url)
        factory = make_sessionmaker(engine)
        errors: dict[str, int] = {}
        live = LiveView.empty(factory, window_samples=settings.window_samples,
                              network=NetworkView.from_settings(settings))
        ingest = Ingest(factory=factory, fleet=live.fleet, samples=live.samples, clock=clock,
                        writer=GroupCommitWriter(factory))
        ingest.in_flight = live.serving.in_flight  # a serving task's exit 0 with requests in flight is a failure
        dispatcher = Dispatcher(factory, settings, clock)
        incidents = Incidents(factory, settings, clock, outbox=dispatcher)  # 4 → 5 notify
        commands = CommandQueue()
        policies = build_policies(settings, errors)  # placement and checkpoint interval, their shadows
        remediation = RemediationEngine(factory=factory, settings=settings, clock=clock, fleet=live.fleet,
                                        jobs=live.jobs, incidents=incidents, commands=commands,
                                        placement=policies.placement, interval_policy=policies.interval,
                                        excluded=lambda: live.network.excluded(clock.time()))
        incidents.listeners.append(remediation.on_incident)  # 4 → 5 remediate
        diagnosis = Diagnoser(ComponentStore(), commands, attributes=job_attributes(factory))
        diagnosis.on_verdict.append(annotate_incident(factory, incidents))
        ctx = DetectionContext(settings=settings, clock=clock, fleet=live.fleet, samples=live.samples, jobs=live.jobs,
                               catalog=FaultCatalog.load(settings.fault_catalog_file), history=live.faults,
                               assignments=live.assignments.snapshot, checkpoints=live.checkpoints,
                               restarting=remediation.is_restarting, network=live.network, diagnosis=diagnosis,
                               serving=live.serving, open_incidents=incidents.active,
                               out_of_service=lambda uuids: _out_of_service(factory, uuids))
        detection = DetectionEngine(ctx, load_detectors(settings), incidents, errors)  # 3 → 4
        pipeline = ReportPipeline(ingest=ingest, live=live, detection=detection, remediation=remediation,
                                  commands=commands, clock=clock, errors=errors,
                                  diagnosis=diagnosis)  # 1 → 2 → 3
        runtime = cls(settings=settings, clock=clock, engine=engine, factory=factory, live=live, ingest=ingest,
                      pipeline=pipeline, tokens=TokenCache(factory), commands=commands, incidents=incidents,
                      detection=detection, dispatcher=dispatcher, remediation=remediation, policies=policies,
                      diagnosis=diagnosis, plugin_errors=errors)
        runtime.on_lost_lead = runtime._exit_on_lost_lead
        if settings.batching_interval_seconds > 0:
            runtime.batching = BatchingController(live.serving, remediation.adjust, dry_run=settings.batching_dry_run)
        return runtime

    # the live layer's parts, by the names the rest of the server (and its tests) use
    @property
    def fleet(self) -> Fleet:
        return self.live.fleet

    @property
    def samples(self) -> SampleStore:
        return self.live.samples

    @property
    def jobs(self) -> JobTelemetry:
        return self.live.jobs

    @property
    def checkpoints(self) -> CheckpointLedger:
        return self.live.checkpoints

    @property
    def history(self) -> FaultHistory:
        return self.live.faults

    @property
    def leading(self) -> bool:
        return self.elector is not None and self.elector.leading and self.led

    @property
    def role(self) -> str:
        return "leader" if self.leading else "standby"

    def start(self, migrate: bool = True) -> None:
        """Migrate, then take the lead if it is free; otherwise stand by (serve reads, try the lock each check)."""
        s = self.settings
        url = s.effective_database_url
        if migrate:
            with migration_lock(self.engine):
                upgrade(url)
        self.bootstrap_admin_token()
        name = s.server_name or f"{socket.gethostname()}:{s.port}"
        self.elector = Elector(make_lock(url, key_name=s.ha_lock_name, server_name=name),
                               check_seconds=s.leader_check_seconds, on_lead=self.lead,
                               on_lost=lambda: self.on_lost_lead(), server_name=name)
        self.elector.step()
        if not self.elector.leading:
            log.warning("standing by: server=%s; another server holds the lead (%s). Reads are served here; "
                        "writes get 503 until this server takes over", name, self.elector.lock.holder() or "?")
        self.elector.start()
        self.ready = True

    def lead(self) -> None:
        """Become the leader: rebuild the live layer from SQL, then run ingest, detection, alerting, remediation."""
        started = time.monotonic()
        with self.factory() as session:
            self.live.load(session, now=self.clock.time())
            self.incidents.load(session)
            self.remediation.load(session)
        self.ingest.writer.start()
        self.detection.start()
        self.remediation.start()
        self.dispatcher.start()
        try:
            with self.factory() as session:
                replayed = self.detection.replay(session)
        except Exception:  # leading without the replay beats not leading
            log.exception("replaying stored events failed: events the last leader acknowledged but never "
                          "opened may lack an incident; check GET /api/v1/events for the last two minutes")
            replayed = 0
        self.led = True
        log.info("leading: nodes=%d open_incidents=%d replayed_events=%d loaded in %.2fs", len(self.fleet.all()),
                 len(self.incidents.active()), replayed, time.monotonic() - started)

    def stop(self) -> None:
        self.ready = False
        if self.leading:
            flush_liveness(self.factory, self.fleet)
        self.ingest.writer.stop()
        self.detection.stop()
        self.remediation.stop()
        self.dispatcher.stop()
        if self.elector is not None:
            self.elector.stop()  # last: the lock frees only once this server has stopped acting
        self.led = False
        self.engine.dispose()

    def _exit_on_lost_lead(self) -> None:
        """Fail-stop: another server may lead already, and this one's threads must not act beside it.
        Reports acknowledged so far are committed; a supervisor restarts this process as a standby."""
        self.led = False
        log.critical("exiting: this server can no longer prove it holds the lead; restart it to stand by")
        logging.shutdown()
        os._exit(75)

    def clock_now(self) -> datetime:
        return to_datetime(self.clock.time())

    def periodic(self) -> list[Periodic]:
        """The leader's periodic work (scheduler.py runs it)."""
        s = self.settings
        return [
            Periodic("liveness", s.liveness_check_seconds, self.check_liveness),
            Periodic("detect", s.detection_interval_seconds, self.detection.evaluate),
            Periodic("remediation", 1.0, self.remediation.tick),
            Periodic("alert_refresh", s.alert_resend_seconds,
                     lambda: self.dispatcher.refresh_alertmanager(self.clock_now())),
            Periodic("liveness_flush", s.liveness_flush_seconds, lambda: flush_liveness(self.factory, self.fleet)),
            Periodic("receipt_prune", 300.0,
                     lambda: prune_receipts(self.factory, self.clock, s.receipt_retention_seconds)),
            Periodic("policy_decisions", FLUSH_SECONDS, lambda: flush_decisions(self.factory, self.policies.pending)),
            Periodic("policy_decision_prune", PRUNE_SECONDS,
                     lambda: prune_decisions(self.factory, self.clock_now(), s.policy_decision_retention_days)),
            *([Periodic("batching", s.batching_interval_seconds, self.adjust_batching)] if self.batching else []),
        ]

    def adjust_batching(self) -> None:
        if self.batching is not None:
            self.batching.tick(self.clock.time())

    def check_liveness(self) -> None:
        """Mark silent nodes down; when some went down, judge heartbeat loss now rather than at the next round."""
        if check_liveness(self.ingest.writer.submit, self.fleet, self.clock, self.settings.missed_intervals_down):
            self.detection.evaluate(only="heartbeat")

    def bootstrap_admin_token(self) -> None:
        """On an empty database, make the first admin token and say once where it is. No default secret exists."""
        path = self.settings.admin_token_file
        with transaction(self.factory) as session:
            if count_tokens(session) > 0:
                return
            secret = create_token(session, name="bootstrap-admin", role="admin")
            path.parent.mkdir(parents=True, exist_ok=True)
            fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
            with os.fdopen(fd, "w") as fh:
                fh.write(secret + "\n")
        log.warning("first start: created an admin token; read it with `cat %s` (mode 0600), store it, "
                    "then delete the file. Make narrower tokens with `sentinel token create`.", path)


def _out_of_service(factory: sessionmaker[Session], uuids: list[str]) -> dict[str, str]:
    """For the engine_fault detector: which of these accelerators are quarantined or suspect (one short read)."""
    with factory() as session:
        return out_of_service(session, uuids)
