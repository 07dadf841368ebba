"""Runs the detectors and hands what they find to the incident lifecycle.

Fatal events and task exits: the ingest listener runs the event detectors (in memory, cheap) and
queues their findings for one worker thread, which opens incidents and rings the notifier — the
request that carried the event is not held up by that transaction. Statistical detectors run on
APScheduler. Auto-resolution: a non-latched incident whose detector says its condition no longer
holds is resolved once it has stayed clear for `resolve_after_seconds` (hysteresis).
"""

from __future__ import annotations

import importlib
import logging
import math
import pkgutil
import threading
from importlib.metadata import entry_points

from sqlalchemy.orm import Session

from sentinel.clock import to_datetime
from sentinel.config import Settings
from sentinel.detection import detectors as builtin
from sentinel.detection.base import DETECTORS, DetectionContext, Detector, Evaluation
from sentinel.detection.replay import REPLAY_SECONDS, last_seen, stored_reports
from sentinel.incidents.findings import Finding
from sentinel.incidents.lifecycle import Incidents
from sentinel.jobs.service import ClosedTask
from sentinel.live.faults import Fault
from sentinel.live.fleet import NodeLive
from sentinel.telemetry.schemas import NodeReport
from sentinel.worker import QueueWorker

log = logging.getLogger("sentinel.detection")


def load_detectors(settings: Settings) -> list[Detector]:
    """Built-ins, then plugins from the `sentinel.detectors` entry-point group; minus the disabled."""
    for info in pkgutil.iter_modules(builtin.__path__):
        importlib.import_module(f"{builtin.__name__}.{info.name}")
    for ep in entry_points(group="sentinel.detectors"):
        try:
            ep.load()
        except Exception:
            log.exception("detector plugin failed to load: entry_point=%s", ep.name)
    unknown = set(settings.disabled_detectors) - set(DETECTORS)
    if unknown:
        raise ValueError(f"disabled_detectors names unknown detector(s) {', '.join(sorted(unknown))}; "
                         f"known: {', '.join(sorted(DETECTORS))}")
    return [cls(settings) for name, cls in sorted(DETECTORS.items()) if name not in settings.disabled_detectors]


class DetectionEngine:
    def __init__(self, ctx: DetectionContext, detectors: list[Detector], incidents: Incidents,
                 errors: dict[str, int] | None = None):
        self.ctx = ctx
        self.detectors = {d.name: d for d in detectors}
        self.incidents = incidents
        self.errors = errors if errors is not None else {}
        self._clear_since: dict[str, float] = {}
        self._last_run: dict[str, float] = {}
        self._worker: QueueWorker[list[Finding]] = QueueWorker("sentinel-incidents", self._write)
        self._eval_lock = threading.Lock()
        self._early: set[str] = set()  # periodic detectors with an early evaluation under way

    # -- event-driven ---------------------------------------------------------------------------------
    def on_report(self, live: NodeLive, report: NodeReport, exits: list[ClosedTask]) -> None:
        """Ingest listener (runs on the event loop): remember faults, run event detectors, queue findings."""
        self._evaluate_early(live, report)
        placed = self.ctx.assignments().get(live.id, []) if report.events else []
        for event in report.events:
            entry = self.ctx.catalog.lookup(event)
            if entry.severity != "info":
                job = next((t.job_id for t in placed if event.accelerator_uuid in t.accelerators), None)
                self.ctx.history.add(Fault(event.observed_at, live.name, event.accelerator_uuid, event.kind,
                                           event.xid, entry.severity, job))
        if not report.events and not exits and not any(p.received == 0 for p in report.probes):
            return  # (a lost probe is news for the probe mesh: an unreachable node is paged at once)
        findings: list[Finding] = []
        for detector in self.detectors.values():
            try:
                findings.extend(detector.on_report(self.ctx, live, report, exits))
            except Exception:
                self._failed(detector.name)
        if findings:
            self._worker.put(findings)

    def _evaluate_early(self, live: NodeLive, report: NodeReport) -> None:
        """A periodic detector this report may have tripped runs now on its own thread (one at a time per
        detector), so a frozen replica waits for no turn of the schedule (`detection_interval_seconds`)."""
        for name, detector in self.detectors.items():
            if not detector.periodic or name in self._early:
                continue
            try:
                wanted = detector.wants_evaluation(self.ctx, live, report)
            except Exception:
                self._failed(name)
                continue
            if wanted:
                self._early.add(name)
                threading.Thread(target=self._early_run, args=(name,), name=f"sentinel-early-{name}",
                                 daemon=True).start()

    def _early_run(self, name: str) -> None:
        try:
            self.evaluate(only=name)
        finally:
            self._early.discard(name)

    def replay(self, session: Session) -> int:
        """On taking the lead: record what the stored agent events of the last minutes should have opened
        and no incident has seen since (the last leader died between the ack and the incident; replay.py).
        Returns how many findings were recorded."""
        since = to_datetime(self.ctx.clock.time() - REPLAY_SECONDS)
        missed: list[Finding] = []
        for stored in stored_reports(session, since):
            live = self.ctx.fleet.get(stored.node)
            if live is None:
                continue
            for detector in self.detectors.values():
                try:
                    found = detector.on_report(self.ctx, live, stored.report, [])
                except Exception:
                    self._failed(detector.name)
                    continue
                for finding in found:
                    seen = last_seen(session, finding.fingerprint)
                    if seen is not None and seen >= stored.recorded_at:
                        continue
                    finding.seen += (" Opened by the server that took the lead: the report was stored and "
                                     "acknowledged, but the previous leader stopped before opening this incident.")
                    log.warning("replaying a stored event: node=%s seq=%d fingerprint=%s recorded_at=%s: the "
                                "previous leader stopped before opening its incident", stored.node,
                                stored.report.seq, finding.fingerprint, stored.recorded_at.isoformat())
                    missed.append(finding)
        if missed:
            self.incidents.record(missed, repeat=True)
        return len(missed)

    def start(self) -> None:
        self._worker.start()

    def stop(self) -> None:
        self._worker.stop()

    def _write(self, findings: list[Finding]) -> None:
        try:
            self.incidents.record(findings, repeat=True)
        except Exception:
            # the events behind them are stored; log loudly, the next occurrence tries again
            self._failed("incident_writer")

    def drain(self, timeout: float = 5.0) -> bool:
        """Wait until the findings queued so far are written (tests, shutdown)."""
        return self._worker.drain(timeout)

    # -- periodic -------------------------------------------------------------------------------------
    def evaluate(self, only: str | None = None) -> list[Finding]:
        """Run the periodic detectors (or one of them), record what holds, resolve what cleared."""
        with self._eval_lock:
            now = self.ctx.clock.time()
            recorded: list[Finding] = []
            for detector in self.detectors.values():
                if not detector.periodic or (only is not None and detector.name != only):
                    continue
                if only is None and now - self._last_run.get(detector.name, float("-inf")) < detector.cadence:
                    continue
                self._last_run[detector.name] = now
                try:
                    evaluation = detector.evaluate(self.ctx, now)
                except Exception:
                    self._failed(detector.name)
                    continue
                findings = self._collapse(detector, evaluation)
                try:
                    self.incidents.record(findings, repeat=False)
                except Exception:
                    self._failed("incident_writer")
                recorded.extend(findings)
            if only is None:
                self.resolve_cleared(now)
            return recorded

    def _collapse(self, detector: Detector, evaluation: Evaluation) -> list[Finding]:
        """Many subjects at once → one fleet-wide finding (individual incidents already open are kept)."""
        findings = evaluation.findings
        settings = self.ctx.settings
        detector.active = {f.fingerprint for f in findings}
        limit = max(settings.fleet_wide_min_findings, math.ceil(settings.fleet_wide_share * evaluation.subjects))
        if len(findings) < limit:
            return findings
        wide = detector.fleet_wide(findings, evaluation.subjects)
        detector.active.add(wide.fingerprint)
        if not self.incidents.is_open(wide.fingerprint):
            log.warning("fleet-wide: detector=%s findings=%d subjects=%d: one incident instead of many",
                        detector.name, len(findings), evaluation.subjects)
        return [wide, *(f for f in findings if self.incidents.is_open(f.fingerprint))]

    def resolve_cleared(self, now: float) -> int:
        resolved = 0
        hysteresis = self.ctx.settings.resolve_after_seconds
        for incident in self.incidents.active():
            detector = self.detectors.get(incident.detector)
            if detector is None:
                continue
            try:
                holds = detector.holds(self.ctx, incident, now)
            except Exception:
                self._failed(detector.name)
                continue
            if holds is None:
                continue
            if holds:
                self._clear_since.pop(incident.fingerprint, None)
                continue
            since = self._clear_since.setdefault(incident.fingerprint, now)
            if now - since >= hysteresis:
                try:
                    self.incidents.resolve(incident.id, actor="sentinel",
                                           reason=f"condition clear for {now - since:.0f}s (auto-resolved)")
                    resolved += 1
                except Exception:
                    self._failed("incident_writer")
                self._clear_since.pop(incident.fingerprint, None)
        return resolved

    def _failed(self, name: str) -> None:
        self.errors[f"detector:{name}"] = self.errors.get(f"detector:{name}", 0) + 1
        log.exception("detector failed: detector=%s", name)
