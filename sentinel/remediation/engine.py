"""Remediation: from an incident's recommended action to accelerators out of service and work moved.

The engine is the loop; the rest lives in its own module:
- policy.py — what to do about an incident (the decision table, pure);
- service.py — the flows that change SQL: quarantine, drain, move a job (an order), restart in place;
- recovery.py — which restarts are awaited, recovery times, goodput;
- probes.py — verify before acting on statistical evidence;
- executors/ — carrying it out: orders to launchers, Slurm, Kubernetes.

Work runs on one thread fed by the incident lifecycle (`on_incident`) and by probe results in reports
(`on_report`), so detection is never held up. Each handling is one transaction; what it owes the
executors and the incident's timeline is done after the commit (`_finish`). `tick` runs every second:
orders nobody took are escalated, jobs stepping again are recorded as recovered, probes time out.
Safety: the circuit breaker stops every automatic action once too much was taken out at once; a job
restarted `max_migrations_per_hour` times is left for a person; dry-run mode records what it would do.
"""

from __future__ import annotations

import importlib
import logging
import pkgutil
import threading
from collections.abc import Callable
from typing import Any

from sqlalchemy import select
from sqlalchemy.orm import Session, sessionmaker

from sentinel.accelerators.models import Accelerator
from sentinel.checkpoints.interval import CheckpointIntervalPolicy, load_interval_policy
from sentinel.clock import Clock, to_datetime
from sentinel.config import Settings
from sentinel.db import transaction
from sentinel.incidents.lifecycle import Incidents
from sentinel.incidents.models import Incident
from sentinel.incidents.schemas import IncidentOut
from sentinel.live.fleet import Fleet
from sentinel.live.jobs import JobTelemetry
from sentinel.nodes.commands import CommandQueue
from sentinel.nodes.models import Node
from sentinel.remediation import executors as executor_pkg
from sentinel.remediation import instruct, orders, policy, service
from sentinel.remediation.breaker import Breaker
from sentinel.remediation.executors.base import EXECUTORS, Action, Executor
from sentinel.remediation.executors.launcher import LauncherExecutor, OrderBoard
from sentinel.remediation.placement import PlacementPolicy, load_policy
from sentinel.remediation.probes import Probes, clear_suspect
from sentinel.remediation.recovery import Recoveries
from sentinel.remediation.service import Context, Counts, Ordered, Outcome
from sentinel.worker import QueueWorker

log = logging.getLogger("sentinel.remediation")

Flow = Callable[[Session, Context], Outcome]


def load_executors(settings: Settings) -> list[Executor]:
    """The executors named in `settings.executors` (Slurm, Kubernetes, plugins), beyond the launcher's."""
    for info in pkgutil.iter_modules(executor_pkg.__path__):
        if info.name in settings.executors:
            importlib.import_module(f"{executor_pkg.__name__}.{info.name}")
    unknown = [n for n in settings.executors if n not in EXECUTORS]
    if unknown:
        raise ValueError(f"executors names unknown executor(s) {', '.join(unknown)}; known: "
                         f"{', '.join(sorted(EXECUTORS)) or 'none installed'}")
    return [EXECUTORS[name](settings.executor_options.get(name, {})) for name in settings.executors]


class RemediationEngine:
    def __init__(self, *, factory: sessionmaker[Session], settings: Settings, clock: Clock, fleet: Fleet,
                 jobs: JobTelemetry, incidents: Incidents, commands: CommandQueue | None = None,
                 placement: PlacementPolicy | None = None, interval_policy: CheckpointIntervalPolicy | None = None,
                 excluded: Callable[[], dict[str, str]] | None = None):
        """`placement` and `interval_policy` as the composition root built them (sentinel/policy/wiring.py: the
        learned policy, a shadow); by default the ones `settings` name, from the registries."""
        self._factory = factory
        self.settings = settings
        self.clock = clock
        self.fleet = fleet
        self.incidents = incidents
        self.breaker = Breaker(settings)
        self.placement = placement or load_policy(settings.placement_policy)
        self.board = OrderBoard()
        self.launcher = LauncherExecutor(board=self.board, secret=lambda: settings.order_webhook_secret)
        self.executors = load_executors(settings)
        self.counts = Counts()
        self.recoveries = Recoveries(jobs, interval_policy or load_interval_policy(settings.checkpoint_interval_policy))
        self.probes = Probes(settings, commands)
        self.excluded = excluded or dict  # nodes the network tier puts out of placement (network_exclude_slow_nodes)
        # incident ids to act on, and (accelerator, probe value) results
        self._worker: QueueWorker[int | tuple[str, float | None]] = QueueWorker("sentinel-remediation", self._work)
        self._act_lock = threading.Lock()

    # -- lifecycle ---------------------------------------------------------------------------------
    def load(self, session: Session) -> None:
        """The breaker, the counters, and each job's recoveries (rebuilt from completed orders)."""
        self.breaker.load(session)
        self.recoveries.load(session)
        self.counts.load(session)

    def start(self) -> None:
        self._worker.start()

    def stop(self) -> None:
        self._worker.stop()

    def drain(self, timeout: float = 10.0) -> bool:
        return self._worker.drain(timeout)

    def snapshot(self) -> dict[tuple[str, str], int]:
        return self.counts.snapshot()

    def is_restarting(self, job_id: int, attempt: int) -> bool:
        """Did Sentinel order an attempt newer than `attempt` that is not stepping yet? Then the old attempt's
        ranks are being stopped on purpose (detectors read this)."""
        return self.recoveries.is_restarting(job_id, attempt, self.clock.time())

    # -- what feeds the worker -----------------------------------------------------------------------
    def on_incident(self, incident: IncidentOut, what: str) -> None:
        """Incident listener: a new incident, or a new occurrence of an open one, may need action."""
        if what in ("opened", "repeated") and self.settings.remediation_enabled:
            self._worker.put(incident.id)
        elif what == "resolved" and incident.accelerator_uuid:
            self.fleet.mark_cleared(incident.accelerator_uuid)  # recovered: its fault gauges return to 0

    def on_report(self, live: Any, report: Any, exits: Any) -> None:
        """Probe results in a report go to the remediation thread."""
        for event in report.events:
            if event.kind == "probe" and self.probes.awaits(event.accelerator_uuid):
                self._worker.put((event.accelerator_uuid, event.value))

    def _work(self, item: int | tuple[str, float | None]) -> None:
        try:
            if isinstance(item, tuple):
                with self._act_lock:
                    self.probe_result(*item)
            else:
                self.handle(item)
        except Exception:
            log.exception("remediation failed: item=%s", item)
            self.counts.add("handle", "failed")

    # -- deciding and acting -------------------------------------------------------------------------
    def handle(self, incident_id: int) -> None:
        with self._factory() as session:
            facts = _facts(session, incident_id, self.clock.time(), self.settings.breaker_window_seconds)
        if facts is None:
            return
        decision = policy.decide(facts)
        if decision.flow == "stale":
            log.warning("not acted on: incident=%d observed %.0fs ago, older than the breaker window", incident_id,
                        facts.age_seconds)
            self.incidents.annotate(incident_id, f"not acted on automatically: observed {facts.age_seconds:.0f}s ago, "
                                    f"older than the breaker window ({facts.max_age_seconds:.0f}s) — a replayed or "
                                    "late event; check the hardware and quarantine or drain by hand if it is still "
                                    "faulty", severity="critical")
            return
        with self._act_lock:
            self._carry_out(incident_id, decision)

    def _carry_out(self, incident_id: int, d: policy.Decision) -> None:
        if d.flow in ("take_out_accelerator", "take_out_node"):
            self.take_out(incident_id, list(d.accelerators), drain=d.drain)
        elif d.flow == "fleet_wide":
            self._run(incident_id, lambda s, ctx: service.fleet_wide(s, ctx, incident_id, list(d.accelerators),
                                                                     list(d.nodes)))
        elif d.flow == "probe":
            self._run(incident_id, lambda s, ctx: self.probes.ask(s, ctx, incident_id, d.accelerators[0],
                                                                  self.clock.time()))
        elif d.flow == "restart_job" and d.job_id is not None:
            job_id = d.job_id
            self._run(incident_id, lambda s, ctx: service.restart_in_place(s, ctx, incident_id, job_id,
                                                                           after_failure=d.after_failure))
        elif d.flow == "instruct_engine" and d.job_id is not None:
            job = d.job_id
            self._run(incident_id, lambda s, ctx: instruct.instruct_engine(s, ctx, incident_id, job))

    def take_out(self, incident_id: int | None, uuids: list[str], *, drain: str | None, actor: str = "sentinel",
                 bypass_breaker: bool = False) -> Outcome:
        """Quarantine `uuids` (and drain node `drain`) and move the jobs on them (service.take_out). A
        person's manual quarantine calls this too, with `bypass_breaker`."""
        return self._run(incident_id, lambda s, ctx: service.take_out(s, ctx, incident_id, uuids, drain=drain,
                                                                      actor=actor, bypass_breaker=bypass_breaker))

    def _run(self, incident_id: int | None, flow: Flow) -> Outcome:
        with transaction(self._factory) as session:
            out = flow(session, self._context())
        return self._finish(incident_id, out)

    def node_states(self) -> dict[str, str]:
        """Each node's state for placement, "excluded" for one the network tier keeps out (when that is on)."""
        return self._context().node_states()

    def _context(self) -> Context:
        return Context(settings=self.settings, breaker=self.breaker, placement=self.placement, fleet=self.fleet,
                       counts=self.counts, now=to_datetime(self.clock.time()), on_order=self.recoveries.ordered,
                       excluded=self.excluded if self.settings.network_exclude_slow_nodes else dict)

    def _finish(self, incident_id: int | None, out: Outcome) -> Outcome:
        """After the commit: orders delivered, node actions carried out, incidents it found opened (a restart
        storm), the incident's timeline written."""
        if out.findings:
            self.incidents.record(out.findings, repeat=False)
        for ordered in out.orders:
            self._deliver(ordered, incident_id)
        for action in out.actions:
            for executor in self.executors:
                if action.kind in executor.handles:
                    result = executor.execute(action)
                    out.lines.append(f"{executor.name}: {result.detail}")
                    self.counts.add(f"{executor.name}:{action.kind}", "done" if result.ok else "failed")
        if incident_id is not None:
            for line in out.lines:
                self.incidents.annotate(incident_id, line, severity="critical" if out.escalate else None)
        return out

    def adjust(self, job_id: int, params: dict[str, Any], reason: str) -> str | None:
        """An `adjust` order to a serving job's launcher (the batching controller's batch limit); its id, or None
        for a job that is gone or finished."""
        from sentinel.jobs.models import Job

        with transaction(self._factory) as session:
            job = session.get(Job, job_id)
            if job is None or job.state in policy.FINISHED_JOB_STATES:
                return None
            order = orders.create_adjust(session, job=job, params=params, reason=reason, now=to_datetime(
                self.clock.time()), ack_seconds=self.settings.order_ack_seconds)
            ordered = Ordered(job.id, order.attempt, orders.order_dict(order), service.job_ref(job))
        self._deliver(ordered, None)
        return str(ordered.order["id"])

    def _deliver(self, ordered: Ordered, incident_id: int | None) -> None:
        """Every order goes through the executors that handle orders: the launcher's first. The order's own
        line is already on the timeline; delivery is logged (the launcher's ack adds its own line)."""
        placement = ordered.order.get("placement") or [{}]
        action = Action("order", str(placement[0].get("node", "")), str(ordered.order.get("reason", "")),
                        jobs=(ordered.job,), incident_id=incident_id, order=ordered.order)
        for executor in (self.launcher, *(e for e in self.executors if "order" in e.handles)):
            result = executor.execute(action)
            log.log(logging.INFO if result.ok else logging.WARNING, "order delivered: executor=%s order=%s job=%d "
                    "ok=%s %s", executor.name, ordered.order["id"], ordered.job_id, result.ok, result.detail)

    # -- periodic ------------------------------------------------------------------------------------
    def tick(self) -> None:
        """Escalate orders nobody acted on in time; notice jobs stepping again after an order; time out probes."""
        with transaction(self._factory) as session:
            late = orders.late_orders(session, to_datetime(self.clock.time()), self.settings.order_ack_seconds)
            settled = self.recoveries.settle(session, self.clock.time())
        for target, line in [*late, *self.probes.expired(self.clock.time())]:
            if target is not None:
                self.incidents.annotate(target, line, severity="critical")
        for target, line in settled.recovered:
            if target is not None:
                self.incidents.annotate(target, line)
        for incident_id, reason in settled.resolved:
            self.incidents.resolve(incident_id, actor="sentinel", reason=reason)

    def probe_result(self, uuid: str, value: float | None) -> None:
        incident_id = self.probes.take(uuid)
        if incident_id is None:
            return
        if policy.probe_verdict(value, self.settings.probe_threshold) == "quarantine":
            out = self.take_out(incident_id, [uuid], drain=None)
            self.incidents.annotate(incident_id, f"probe confirmed: {uuid} reached {value:.0%} of its expected rate"
                                    + ("" if out.lines else "; nothing else to do"))
            return
        with transaction(self._factory) as session:
            line = clear_suspect(session, incident_id, uuid, value)
        self.incidents.annotate(incident_id, line)


def _facts(session: Session, incident_id: int, now: float, max_age: float) -> policy.Facts | None:
    """What remediation decides on: the incident's action and subjects, and the accelerators they cover."""
    incident = session.get(Incident, incident_id)
    if incident is None or incident.state == "resolved":
        return None
    flow = policy.DECISIONS.get(incident.recommended_action, "nothing")
    wide = tuple(incident.evidence.get("nodes", [])) if flow == "fleet_wide" else ()

    def present(nodes: tuple[str, ...]) -> tuple[str, ...]:
        return tuple(a for (a,) in session.execute(select(Accelerator.uuid).join(Node).where(
            Node.name.in_(nodes), Accelerator.present.is_(True))))

    node = incident.node
    return policy.Facts(action=incident.recommended_action, detector=incident.detector, node=node,
                        accelerator=incident.accelerator_uuid, job_id=incident.job_id,
                        node_accelerators=present((node,)) if node and flow == "take_out_node" else (),
                        wide_nodes=wide, wide_accelerators=present(wide) if wide else (),
                        age_seconds=max(0.0, now - _latest_event(incident, now)), max_age_seconds=max_age)


def _latest_event(incident: Incident, now: float) -> float:
    """When the agent last saw the event an incident is about (`now` for statistical incidents: a lemon's
    evidence is days old by design, and it is judged afresh at every evaluation)."""
    event = incident.evidence.get("event") if isinstance(incident.evidence, dict) else None
    if isinstance(event, dict):
        at = event.get("last_observed_at") or event.get("observed_at")
        if isinstance(at, int | float):
            return float(at)
    return now
