"""Everything one server process holds: database handles, in-memory fleet view, ingest, scheduler.

Built from settings and an injected clock; nothing starts until `start()`.
"""

from __future__ import annotations

import logging
import os
import socket
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import datetime

from sqlalchemy import Engine
from sqlalchemy.orm import Session, sessionmaker

from sentinel.alerting.dispatcher import Dispatcher
from sentinel.auth.service import TokenCache, count_tokens, create_token
from sentinel.clock import Clock, SystemClock, to_datetime
from sentinel.config import Settings
from sentinel.db import make_engine, make_sessionmaker, migration_lock, transaction, upgrade
from sentinel.detection.base import DetectionContext
from sentinel.detection.catalog import FaultCatalog
from sentinel.detection.engine import DetectionEngine, load_detectors
from sentinel.ha.leader import Elector, make_lock
from sentinel.incidents.lifecycle import Incidents
from sentinel.jobs.service import assignments_by_node
from sentinel.live.checkpoints import CheckpointLedger
from sentinel.live.faults import FaultHistory
from sentinel.live.fleet import Fleet, NodeLive
from sentinel.live.jobs import JobTelemetry
from sentinel.live.liveness import flush_liveness
from sentinel.live.samples import SampleStore
from sentinel.nodes.commands import CommandQueue
from sentinel.pipeline.ingest import ClosedTask, Ingest
from sentinel.pipeline.writer import GroupCommitWriter
from sentinel.remediation.engine import RemediationEngine
from sentinel.telemetry.schemas import Assignment, NodeReport

log = logging.getLogger("sentinel.server")


@dataclass
class Runtime:
    settings: Settings
    clock: Clock
    engine: Engine
    factory: sessionmaker[Session]
    fleet: Fleet
    samples: SampleStore
    ingest: Ingest
    tokens: TokenCache
    commands: CommandQueue
    jobs: JobTelemetry
    history: FaultHistory
    incidents: Incidents
    detection: DetectionEngine
    dispatcher: Dispatcher
    remediation: RemediationEngine
    checkpoints: CheckpointLedger
    assignments: dict[int, list[Assignment]] = field(default_factory=dict)
    assignments_lock: threading.Lock = field(default_factory=threading.Lock)
    plugin_errors: dict[str, int] = field(default_factory=dict)
    ready: bool = False
    elector: Elector | None = None
    led: bool = False  # lead() finished: the in-memory view is loaded and the loops run
    on_lost_lead: Callable[[], None] = field(default=lambda: None)

    @classmethod
    def build(cls, settings: Settings, clock: Clock | None = None) -> Runtime:
        clock = clock or SystemClock()
        engine = make_engine(settings.effective_database_url)
        factory = make_sessionmaker(engine)
        fleet = Fleet()
        samples = SampleStore(settings.window_samples)
        ingest = Ingest(factory=factory, fleet=fleet, samples=samples, clock=clock,
                        writer=GroupCommitWriter(factory))
        jobs, history, checkpoints = JobTelemetry(), FaultHistory(), CheckpointLedger()
        dispatcher = Dispatcher(factory, settings, clock)
        incidents = Incidents(factory, settings, clock, outbox=dispatcher)
        holder: list[Runtime] = []
        ctx = DetectionContext(settings=settings, clock=clock, fleet=fleet, samples=samples, jobs=jobs,
                               catalog=FaultCatalog.load(settings.fault_catalog_file), history=history,
                               assignments=lambda: holder[0].assignments, checkpoints=checkpoints)
        errors: dict[str, int] = {}
        detection = DetectionEngine(ctx, load_detectors(settings), incidents, errors)
        commands = CommandQueue()
        remediation = RemediationEngine(factory=factory, settings=settings, clock=clock, fleet=fleet, jobs=jobs,
                                        incidents=incidents, commands=commands)
        incidents.listeners.append(remediation.on_incident)
        ctx.restarting = remediation.is_restarting
        runtime = cls(settings=settings, clock=clock, engine=engine, factory=factory, fleet=fleet,
                      samples=samples, ingest=ingest, tokens=TokenCache(factory), commands=commands,
                      jobs=jobs, history=history, incidents=incidents, detection=detection, dispatcher=dispatcher,
                      remediation=remediation, plugin_errors=errors, checkpoints=checkpoints)
        runtime.on_lost_lead = runtime._exit_on_lost_lead
        holder.append(runtime)
        return runtime

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
        """Become the leader: rebuild the in-memory view from SQL, then run detection, alerting, remediation."""
        started = time.monotonic()
        with self.factory() as session:
            self.fleet.load(session, now=self.clock.time())
            self.assignments = assignments_by_node(session)
            self.jobs.load(session)
            self.history.load(session, now=self.clock.time())
            self.checkpoints.load(session)
            self.incidents.load(session)
            self.remediation.load(session)
        self.ingest.listeners.append(self._on_report)
        self.ingest.listeners.append(self.detection.on_report)
        self.ingest.listeners.append(self.remediation.on_report)
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

    def _on_report(self, live: NodeLive, report: NodeReport, exits: list[ClosedTask]) -> None:
        if report.tasks:
            self.jobs.add(live.name, report.tasks, self.clock.time())
        for closed in exits:
            self.jobs.mark_ended(closed.job_id, closed.rank, closed.pid)
            if closed.failure_reason:
                self.jobs.count_failure(closed.job_id, closed.failure_reason)
        if exits:
            self.refresh_assignments()

    def refresh_assignments(self) -> None:
        """Re-read running tasks. Serialised, query included: two refreshes racing (a task exit and a task
        registration) must not let the older read overwrite the newer one."""
        with self.assignments_lock, self.factory() as session:
            self.assignments = assignments_by_node(session)

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
