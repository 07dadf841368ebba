"""Remediation: from an incident's recommended action to accelerators out of service and work moved.

Policy (from the fault catalog's action, DESIGN §4 and §6):

* `reset_accelerator` / `quarantine` — quarantine that accelerator; move the jobs on it.
* `restart_node` / `drain_node` — quarantine the node's accelerators and drain the node; move its jobs.
* `restart_task` — restart the job where it is (a new attempt), moving only ranks whose hardware is gone.
* `page` (a fleet-wide outage) — act on nothing; the circuit breaker decides whether to trip.

Moving a job is an order to its launcher: a new attempt with a placement from the placement policy
(training: restart from the recovery plan once checkpoints exist, else from the start; serving: replace
the replica — drain, start the replacement, stop the old). Configured executors (Slurm, Kubernetes)
drain nodes and requeue/evict in their own terms as well.

Safety: the circuit breaker stops every automatic action once too much was taken out at once; a job
restarted `max_migrations_per_hour` times is left for a person; dry-run mode records what it would do.
Work runs on one thread fed by the incident lifecycle, so detection is never held up.
"""

from __future__ import annotations

import importlib
import logging
import pkgutil
import threading
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any

from sqlalchemy import func, select
from sqlalchemy.orm import Session, sessionmaker

from sentinel.accelerators.models import Accelerator
from sentinel.accelerators.service import set_health
from sentinel.checkpoints.service import plan_recovery
from sentinel.clock import Clock, to_datetime
from sentinel.config import Settings
from sentinel.db import transaction
from sentinel.incidents.lifecycle import Incidents
from sentinel.incidents.models import Incident
from sentinel.incidents.schemas import IncidentOut
from sentinel.jobs.models import Job, Task
from sentinel.live.fleet import Fleet
from sentinel.live.jobs import JobTelemetry
from sentinel.nodes.commands import CommandQueue
from sentinel.nodes.models import Node
from sentinel.nodes.service import set_admin_state
from sentinel.remediation import executors as executor_pkg
from sentinel.remediation.breaker import Breaker
from sentinel.remediation.executors.base import EXECUTORS, Action, Executor, JobRef
from sentinel.remediation.models import Order, Remediation
from sentinel.remediation.orders import OrderBoard, create_order, latest_attempt
from sentinel.remediation.placement import Inventory, NoCapacity, PlacementRequest, load_policy
from sentinel.worker import QueueWorker

log = logging.getLogger("sentinel.remediation")

TAKE_ACCELERATOR = ("reset_accelerator", "quarantine")
TAKE_NODE = ("restart_node", "drain_node")
FINISHED = ("succeeded", "cancelled")
RESTART_GRACE_SECONDS = 300.0  # a failed job is what an order brings back


@dataclass
class Outcome:
    """What one handling did, said after its transaction committed."""

    lines: list[str] = field(default_factory=list)
    escalate: bool = False
    jobs: list[int] = field(default_factory=list)
    webhooks: list[tuple[str, dict[str, Any]]] = field(default_factory=list)
    actions: list[Action] = field(default_factory=list)


def load_executors(settings: Settings) -> list[Executor]:
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
                 jobs: JobTelemetry, incidents: Incidents, commands: CommandQueue | None = None):
        self._factory = factory
        self.settings = settings
        self.clock = clock
        self.fleet = fleet
        self.jobs = jobs
        self.incidents = incidents
        self.commands = commands
        self._probes: dict[str, tuple[int, float]] = {}  # accelerator → (incident, asked at): awaiting a result
        self.breaker = Breaker(settings)
        self.board = OrderBoard()
        self.policy = load_policy(settings.placement_policy)
        self.executors = load_executors(settings)
        self.counts: dict[tuple[str, str], int] = {}
        self.recovery_seconds: dict[int, float] = {}  # job → its last recovery, fault observed → stepping again
        self.recovery_total: dict[int, float] = {}  # job → all its recoveries, summed (for goodput)
        # job → (attempt ordered and not yet stepping, since when); forgotten after RESTART_GRACE_SECONDS so a
        # restart that never comes back cannot hide the job's later failures
        self._restarting: dict[int, tuple[int, float]] = {}
        self._counts_lock = threading.Lock()
        # incident ids to act on, and (accelerator, probe value) results
        self._worker: QueueWorker[int | tuple[str, float | None]] = QueueWorker("sentinel-remediation", self._work)
        self._act_lock = threading.Lock()

    # -- lifecycle ---------------------------------------------------------------------------------
    def load(self, session: Session) -> None:
        """The breaker and counters, and each job's recoveries (rebuilt from completed orders)."""
        self.breaker.load(session)
        for order, observed in session.execute(
                select(Order, Incident.observed_at).outerjoin(Incident, Incident.id == Order.incident_id)
                .where(Order.completed_at.is_not(None)).order_by(Order.completed_at)):
            assert order.completed_at is not None
            took = (order.completed_at - (observed or order.created_at)).total_seconds()
            self.recovery_seconds[order.job_id] = took
            self.recovery_total[order.job_id] = self.recovery_total.get(order.job_id, 0.0) + took
        # orders still under way: their jobs' old ranks are being stopped on purpose (no task_exit incident)
        for order in session.scalars(select(Order).where(Order.completed_at.is_(None),
                                                         Order.state.in_(("pending", "acknowledged", "done")))):
            if order.attempt > self._restarting.get(order.job_id, (-1, 0.0))[0]:
                self._restarting[order.job_id] = (order.attempt, order.created_at.timestamp())
        for action, result, count in session.execute(
                select(Remediation.action, Remediation.result, func.count()).group_by(Remediation.action,
                                                                                      Remediation.result)):
            self.counts[(action, result)] = int(count)

    def start(self) -> None:
        self._worker.start()

    def stop(self) -> None:
        self._worker.stop()

    def drain(self, timeout: float = 10.0) -> bool:
        return self._worker.drain(timeout)

    def on_incident(self, incident: IncidentOut, what: str) -> None:
        """Incident listener: a new incident, or a new occurrence of an open one, may need action."""
        if what in ("opened", "repeated") and self.settings.remediation_enabled:
            self._worker.put(incident.id)

    def _work(self, item: int | tuple[str, float | None]) -> None:
        try:
            if isinstance(item, tuple):
                with self._act_lock:
                    self.probe_result(*item)
            else:
                self.handle(item)
        except Exception:
            log.exception("remediation failed: item=%s", item)
            self._count("handle", "failed")

    def is_restarting(self, job_id: int, attempt: int) -> bool:
        """Did Sentinel order an attempt newer than `attempt` that is not stepping yet? Then the old attempt's
        ranks are being stopped on purpose."""
        ordered, since = self._restarting.get(job_id, (-1, 0.0))
        return ordered > attempt and self.clock.time() - since < RESTART_GRACE_SECONDS

    def _count(self, action: str, result: str) -> None:
        with self._counts_lock:
            self.counts[(action, result)] = self.counts.get((action, result), 0) + 1

    def snapshot(self) -> dict[tuple[str, str], int]:
        with self._counts_lock:
            return dict(self.counts)

    # -- deciding ----------------------------------------------------------------------------------
    def handle(self, incident_id: int) -> None:
        with self._factory() as session:
            incident = session.get(Incident, incident_id)
            if incident is None or incident.state == "resolved":
                return
            action, node, uuid, job_id = (incident.recommended_action, incident.node, incident.accelerator_uuid,
                                          incident.job_id)
            detector = incident.detector
            wide_nodes = list(incident.evidence.get("nodes", [])) if action == "page" else []
            uuids = ([a for (a,) in session.execute(select(Accelerator.uuid).join(Node).where(
                Node.name == node, Accelerator.present.is_(True)))] if node and action in TAKE_NODE else [])
            if wide_nodes:
                uuids = [a for (a,) in session.execute(select(Accelerator.uuid).join(Node).where(
                    Node.name.in_(wide_nodes), Accelerator.present.is_(True)))]
        with self._act_lock:
            if action in TAKE_ACCELERATOR and uuid:
                self.take_out(incident_id, [uuid], drain=None)
            elif action in TAKE_NODE and node:
                self.take_out(incident_id, uuids, drain=node)
            elif action == "page" and wide_nodes:
                self.fleet_wide(incident_id, uuids, wide_nodes)
            elif action == "probe" and uuid:
                self.probe(incident_id, uuid)
            elif action == "restart_task" and job_id is not None:
                self.restart_in_place(incident_id, job_id, after_failure=detector == "task_exit")

    def _now(self) -> datetime:
        return to_datetime(self.clock.time())

    def _node_states(self) -> dict[str, str]:
        return {n.name: n.state for n in self.fleet.all()}

    def _record(self, session: Session, incident_id: int | None, action: str, subject: str, result: str,
                detail: str, accelerators: int = 0) -> None:
        session.add(Remediation(incident_id=incident_id, action=action, subject=subject[:256], result=result,
                                detail=detail[:1024], accelerators=accelerators, created_at=self._now()))
        self._count(action, result)

    def _blocked_by_breaker(self, session: Session, incident_id: int, out: Outcome, what: str) -> bool:
        if not self.breaker.open:
            return False
        row = self.breaker.state(session)
        self._record(session, incident_id, what, f"incident/{incident_id}", "blocked", "circuit breaker open")
        out.lines.append(f"circuit breaker is open (since {row.opened_at:%H:%M:%S}Z: {row.reason}); no automatic "
                         "action — reset it with `POST /api/v1/breaker/reset` once the cause is understood")
        out.escalate = True
        return True

    def take_out(self, incident_id: int | None, uuids: list[str], *, drain: str | None, actor: str = "sentinel",
                 bypass_breaker: bool = False) -> Outcome:
        """Quarantine `uuids` (and drain node `drain`), then move every job on them. Automatic calls go
        through the breaker; a person's manual quarantine does not."""
        with transaction(self._factory) as session:
            out = self._take_out(session, incident_id, uuids, drain=drain, actor=actor,
                                 bypass_breaker=bypass_breaker)
        return self._finish(incident_id, out)

    def _take_out(self, session: Session, incident_id: int | None, uuids: list[str], *, drain: str | None,
                  actor: str = "sentinel", bypass_breaker: bool = False) -> Outcome:
        out = Outcome()
        now = self._now()
        ref = incident_id or 0
        source = session.get(Incident, incident_id) if incident_id else None
        title = source.title if source is not None else f"manual, by {actor}"
        accs = list(session.scalars(select(Accelerator).where(Accelerator.uuid.in_(uuids))))
        proposed = {a.uuid for a in accs if a.health != "quarantined"}
        jobs = self._jobs_on(session, set(uuids))
        node_row = session.scalar(select(Node).where(Node.name == drain)) if drain else None
        drain_needed = node_row is not None and node_row.admin_state not in ("draining", "cordoned")
        if not proposed and not jobs and not drain_needed:
            return out
        if not bypass_breaker and self._blocked_by_breaker(session, ref, out, "quarantine_accelerator"):
            return out
        inventory = Inventory.load(session, node_states=self._node_states())
        if not bypass_breaker and proposed:
            reason, domain = self.breaker.would_trip(session, proposed, inventory, now)
            if reason:
                self.breaker.trip(session, reason=reason, domain=domain, incident_id=incident_id, now=now)
                self._record(session, incident_id, "quarantine_accelerator", f"incident/{ref}", "blocked", reason,
                             accelerators=len(proposed))
                log.error("circuit breaker tripped: incident=%s %s", incident_id, reason)
                out.lines.append(f"circuit breaker tripped: {reason}. Nothing was quarantined or drained; "
                                 "automatic actions stay off until an operator resets it "
                                 "(`GET /api/v1/breaker`, `POST /api/v1/breaker/reset`)")
                out.escalate = True
                return out
        what = ", ".join(sorted(proposed)) or "nothing new"
        if self.settings.remediation_dry_run:
            self._record(session, incident_id, "quarantine_accelerator", what, "dry_run", title, len(proposed))
            out.lines.append(f"dry run: would quarantine {what}" + (f", drain node {drain}" if drain_needed else "")
                             + (f", restart job(s) {', '.join(str(j.id) for j in jobs)} elsewhere" if jobs else ""))
            return out
        for acc in accs:
            set_health(session, acc, health="quarantined", reason=f"incident #{ref}: {title}", actor=actor,
                       incident_id=incident_id)
        if proposed:
            self._record(session, incident_id, "quarantine_accelerator", what, "done", title, len(proposed))
            out.lines.append(f"quarantined accelerator(s) {what}: no new work is placed there")
        if drain_needed and node_row is not None:
            set_admin_state(session, node_row, admin_state="draining", reason=f"incident #{ref}: {title}",
                            actor=actor)
            session.flush()
            self.fleet.apply(node_row)
            self._record(session, incident_id, "drain_node", drain or "", "done", title)
            out.lines.append(f"drained node {drain}: it takes no new work; `sentinel uncordon {drain}` "
                             "after repair")
        session.flush()
        jobs = [j for j in jobs if not self._already_moving(session, j.id, set(uuids))]
        for job in jobs:
            self._move(session, job, set(uuids), incident_id, now, out)
        if drain_needed and drain:
            out.actions.append(Action("drain_node", drain, title, tuple(uuids), (), incident_id))
        if jobs:
            nodes = {inventory.slots[u].node for u in uuids if u in inventory.slots}
            for node in sorted(nodes):
                out.actions.append(Action("move_work", node, title, tuple(uuids),
                                          tuple(JobRef(j.id, j.name, j.kind, dict(j.attributes)) for j in jobs),
                                          incident_id))
        return out

    def fleet_wide(self, incident_id: int, uuids: list[str], nodes: list[str]) -> Outcome:
        """A fleet-wide outage: never drain it automatically; it trips the breaker when large enough."""
        with transaction(self._factory) as session:
            out = self._fleet_wide(session, incident_id, uuids, nodes)
        return self._finish(incident_id, out)

    def _fleet_wide(self, session: Session, incident_id: int, uuids: list[str], nodes: list[str]) -> Outcome:
        out = Outcome()
        now = self._now()
        if self._blocked_by_breaker(session, incident_id, out, "drain_node"):
            return out
        inventory = Inventory.load(session, node_states=self._node_states())
        reason, domain = self.breaker.would_trip(session, set(uuids), inventory, now)
        if reason:
            self.breaker.trip(session, reason=reason, domain=domain, incident_id=incident_id, now=now)
            self._record(session, incident_id, "drain_node", f"{len(nodes)} nodes", "blocked", reason, len(uuids))
            log.error("circuit breaker tripped: incident=%d %s", incident_id, reason)
            out.lines.append(f"circuit breaker tripped: {reason}. Nothing was quarantined or drained")
        else:
            self._record(session, incident_id, "drain_node", f"{len(nodes)} nodes", "skipped",
                         "a fleet-wide outage is a person's call")
            out.lines.append(f"{len(nodes)} nodes at once: not drained automatically; a fleet-wide outage is a "
                             "person's call")
        out.escalate = True
        return out

    def restart_in_place(self, incident_id: int, job_id: int, *, after_failure: bool = True) -> Outcome:
        """A task failed (or the job hung): restart the job as a new attempt, unless that is already ordered.
        After a failure, only when the failed task belongs to the latest attempt: exits of an attempt being
        replaced are expected."""
        with transaction(self._factory) as session:
            out = self._restart_in_place(session, incident_id, job_id, after_failure=after_failure)
        return self._finish(incident_id, out)

    def _restart_in_place(self, session: Session, incident_id: int, job_id: int, *,
                          after_failure: bool = True) -> Outcome:
        out = Outcome()
        now = self._now()
        job = session.get(Job, job_id)
        if job is None or job.state in FINISHED:
            return out
        latest = latest_attempt(session, job_id)
        if latest is None:
            return out
        failed = session.scalar(select(func.count()).select_from(Task).where(
            Task.job_id == job_id, Task.attempt == latest, Task.state == "failed")) or 0
        newer = session.scalar(select(func.count()).select_from(Order).where(
            Order.job_id == job_id, Order.attempt > latest, Order.state != "superseded")) or 0
        if (after_failure and not failed) or newer:
            return out  # exits of an attempt already being replaced, or a restart already ordered
        if self._blocked_by_breaker(session, incident_id, out, "restart_job"):
            return out
        if self.settings.remediation_dry_run:
            self._record(session, incident_id, "restart_job", f"job/{job_id}", "dry_run", "")
            out.lines.append(f"dry run: would restart job {job_id} as attempt {latest + 1}")
            return out
        self._move(session, job, set(), incident_id, now, out)
        return out

    @staticmethod
    def _already_moving(session: Session, job_id: int, bad: set[str]) -> bool:
        """An order in flight (not yet stepping) already takes the job off `bad`: a repeat changes nothing."""
        for order in session.scalars(select(Order).where(Order.job_id == job_id, Order.completed_at.is_(None),
                                                         Order.state.in_(("pending", "acknowledged", "done")))):
            if not any(set(slot.get("accelerators", [])) & bad for slot in order.placement):
                return True
        return False

    def _jobs_on(self, session: Session, uuids: set[str]) -> list[Job]:
        """Unfinished jobs whose latest attempt has a task on any of `uuids`."""
        found: dict[int, Job] = {}
        for task, job in session.execute(select(Task, Job).join(Job, Job.id == Task.job_id)
                                         .where(Job.state.not_in(FINISHED))):
            if set(task.accelerators) & uuids and task.attempt == latest_attempt(session, job.id):
                found[job.id] = job
        return [found[k] for k in sorted(found)]

    def _move(self, session: Session, job: Job, bad: set[str], incident_id: int | None, now: datetime,
              out: Outcome) -> None:
        """Order `job` restarted (a new attempt), its ranks on `bad` or on unusable hardware re-placed."""
        hour_ago = now - timedelta(hours=1)
        recent = session.scalar(select(func.count()).select_from(Order).where(
            Order.job_id == job.id, Order.created_at >= hour_ago, Order.state != "superseded")) or 0
        if recent >= self.settings.max_migrations_per_hour:
            self._record(session, incident_id, "restart_job", f"job/{job.id}", "skipped", "migration limit")
            out.lines.append(f"job {job.id} ({job.name}) was restarted {recent} times in the last hour, the limit "
                             f"(max_migrations_per_hour): not restarted again; look for a cause that follows it")
            out.escalate = True
            return
        latest = latest_attempt(session, job.id)
        tasks = list(session.scalars(select(Task).where(Task.job_id == job.id, Task.attempt == latest)))
        current = {t.rank: list(t.accelerators) for t in tasks}
        inventory = Inventory.load(session, job_id=job.id, node_states=self._node_states())
        unusable = {u for uuids in current.values() for u in uuids if u not in inventory.free}
        replace = frozenset(r for r, uuids in current.items() if set(uuids) & (bad | unusable))
        per_rank = max((len(u) for u in current.values()), default=1) or 1
        try:
            placement = self.policy.place(PlacementRequest(job.id, current, replace, per_rank), inventory)
        except NoCapacity as exc:
            self._record(session, incident_id, "restart_job", f"job/{job.id}", "failed", str(exc))
            out.lines.append(f"job {job.id} ({job.name}) cannot move: {exc}; free capacity or release a spare")
            out.escalate = True
            return
        rows = [{"rank": r, "node": n, "accelerators": u} for r, (n, u) in sorted(placement.items())]
        kind = "replace_replica" if job.kind == "serving" else "restart"
        order = create_order(session, job=job, kind=kind, placement=rows, incident_id=incident_id, now=now,
                             ack_seconds=self.settings.order_ack_seconds,
                             reason=f"incident #{incident_id}" if incident_id else "manual quarantine")
        moved = ", ".join(f"rank {r} → {n}:{','.join(u)}" for r, (n, u) in sorted(placement.items()) if r in replace)
        self._record(session, incident_id, "restart_job", f"job/{job.id}", "done", f"order {order.id}")
        plan = plan_recovery(session, job)
        order.checkpoint_step = plan.step
        how = ("replace the replica: drain it, start the replacement, then stop it" if kind == "replace_replica"
               else "restart")
        how += f" from checkpoint step {plan.step}" if plan.step is not None else f" ({plan.reason})"
        if plan.skipped:
            how += f" [passed over: {'; '.join(plan.skipped[:3])}]"
        out.lines.append(f"order {order.id}: job {job.id} ({job.name}) attempt {order.attempt}, {how}"
                         + (f"; {moved}" if moved else "; same placement"))
        out.jobs.append(job.id)
        self._restarting[job.id] = (order.attempt, self.clock.time())
        hook = job.attributes.get("order_webhook") if isinstance(job.attributes, dict) else None
        if hook:
            out.webhooks.append((str(hook), order_dict(order)))
        log.warning("order issued: order=%s job=%d attempt=%d kind=%s incident=%s %s", order.id, job.id,
                    order.attempt, kind, incident_id, moved or "same placement")

    def _finish(self, incident_id: int | None, out: Outcome) -> Outcome:
        """After the commit: the timeline, escalation, waiting launchers, webhooks and executors."""
        for job_id in out.jobs:
            self.board.announce(job_id)
        for url, order in out.webhooks:
            threading.Thread(target=self._push, args=(url, order), daemon=True).start()
        for action in out.actions:
            for executor in self.executors:
                result = executor.execute(action)
                out.lines.append(f"{executor.name}: {result.detail}")
                self._count(f"{executor.name}:{action.kind}", "done" if result.ok else "failed")
        if incident_id is not None:
            for line in out.lines:
                self.incidents.annotate(incident_id, line, severity="critical" if out.escalate else None)
        return out

    def _push(self, url: str, order: dict[str, Any]) -> None:
        problem = OrderBoard.push_webhook(url, self.settings.order_webhook_secret, order)
        if problem:
            log.warning("order webhook failed: order=%s job=%s %s (the launcher can still long-poll)", order["id"],
                        order["job_id"], problem)

    # -- periodic ------------------------------------------------------------------------------------
    def tick(self) -> None:
        """Escalate orders nobody acted on in time; notice jobs stepping again after an order."""
        now = self._now()
        late: list[tuple[int | None, str]] = []
        settled: list[tuple[int, str]] = []  # handled incidents that are not latched: resolved, so a new
        # occurrence of the same condition opens a new incident (and is acted on again)
        recovered: list[tuple[int | None, str]] = []
        with transaction(self._factory) as session:
            for order in session.scalars(select(Order).where(Order.state == "pending", Order.escalated.is_(False),
                                                             Order.deadline_at < now)):
                order.escalated = True
                late.append((order.incident_id, f"order {order.id} for job {order.job_id} was not acknowledged within "
                                                f"{self.settings.order_ack_seconds:g}s: is its launcher running?"))
            for order in session.scalars(select(Order).where(Order.state.in_(("acknowledged", "done")),
                                                             Order.completed_at.is_(None))):
                stepped = self._stepped(order.job_id, order.attempt)
                if stepped is None:
                    continue
                order.completed_at = to_datetime(stepped)
                if self._restarting.get(order.job_id, (-1, 0.0))[0] <= order.attempt:
                    self._restarting.pop(order.job_id, None)
                job = session.get(Job, order.job_id)
                if job is not None and job.state == "recovering":
                    job.state = "running"
                incident = session.get(Incident, order.incident_id) if order.incident_id else None
                since = incident.observed_at.timestamp() if incident else order.created_at.timestamp()
                self.recovery_seconds[order.job_id] = stepped - since
                order.recovery_seconds = stepped - since
                order.lost_steps = self._lost(order.job_id, order.attempt)
                self.recovery_total[order.job_id] = self.recovery_total.get(order.job_id, 0.0) + stepped - since
                order.result = f"stepping again {stepped - since:.1f}s after the fault was observed"
                if incident is not None and not incident.latched and incident.state != "resolved":
                    settled.append((incident.id, f"recovered: job {order.job_id} stepping again (attempt "
                                                 f"{order.attempt})"))
                redo = f"; {order.lost_steps} step(s) to recompute" if order.lost_steps else ""
                recovered.append((order.incident_id, f"job {order.job_id} is stepping again (attempt {order.attempt}), "
                                                     f"{stepped - since:.1f}s after the fault was observed{redo}"))
                log.warning("job recovered: job=%d attempt=%d order=%s recovery=%.2fs", order.job_id, order.attempt,
                            order.id, stepped - since)
        for uuid, (probed, asked) in list(self._probes.items()):
            if self.clock.time() - asked > self.settings.probe_timeout_seconds:
                self._probes.pop(uuid, None)
                late.append((probed, f"no probe result for {uuid} within "
                                     f"{self.settings.probe_timeout_seconds:g}s; it stays suspect"))
        for target, line in late:
            if target is not None:
                self.incidents.annotate(target, line, severity="critical")
        for target, line in recovered:
            if target is not None:
                self.incidents.annotate(target, line)
        for target, reason in settled:
            self.incidents.resolve(target, actor="sentinel", reason=reason)

    # -- verify before acting on statistical evidence ----------------------------------------------------
    def probe(self, incident_id: int, uuid: str) -> None:
        """Mark the accelerator suspect and ask its agent for a microbenchmark; act on the result."""
        out = Outcome()
        with transaction(self._factory) as session:
            acc = session.scalar(select(Accelerator).where(Accelerator.uuid == uuid))
            node = session.get(Node, acc.node_id) if acc is not None else None
            if acc is None or node is None or acc.health != "healthy" or uuid in self._probes:
                return
            if self._blocked_by_breaker(session, incident_id, out, "probe"):
                pass
            elif self.settings.remediation_dry_run:
                self._record(session, incident_id, "probe", uuid, "dry_run", "")
                out.lines.append(f"dry run: would mark {uuid} suspect and probe it")
            elif self.commands is None:
                out.lines.append(f"accelerator {uuid} is suspect; this server cannot reach agents to probe it")
            else:
                set_health(session, acc, health="suspect", reason=f"incident #{incident_id}: probing",
                           actor="sentinel", incident_id=incident_id)
                self.commands.push(node.name, kind="probe", accelerator_index=acc.index, fault="probe",
                                   argument=None)
                self._probes[uuid] = (incident_id, self.clock.time())
                self._record(session, incident_id, "probe", uuid, "done", f"asked {node.name}")
                out.lines.append(f"accelerator {uuid} is suspect: probing it (a short GEMM through the agent on "
                                 f"{node.name}) before acting; below {self.settings.probe_threshold:.0%} of its "
                                 "expected rate it is quarantined")
        self._finish(incident_id, out)

    def on_report(self, live: Any, report: Any, exits: Any) -> None:
        """Ingest listener: probe results go to the remediation thread."""
        for event in report.events:
            if event.kind == "probe" and event.accelerator_uuid in self._probes:
                self._worker.put((event.accelerator_uuid, event.value))

    def probe_result(self, uuid: str, value: float | None) -> None:
        incident_id, _ = self._probes.pop(uuid, (None, 0.0))
        if incident_id is None:
            return
        if value is not None and value < self.settings.probe_threshold:
            out = self.take_out(incident_id, [uuid], drain=None)
            self.incidents.annotate(incident_id, f"probe confirmed: {uuid} reached {value:.0%} of its expected rate"
                                    + ("" if out.lines else "; nothing else to do"))
            return
        with transaction(self._factory) as session:
            acc = session.scalar(select(Accelerator).where(Accelerator.uuid == uuid))
            if acc is not None and acc.health == "suspect":
                set_health(session, acc, health="healthy", reason="probe passed" if value is not None
                           else "probe unavailable", actor="sentinel", incident_id=incident_id)
        if value is None:
            line = (f"{uuid} could not be probed by its source; it stays in service — a person should run "
                    "`dcgmi diag -r 2` on it")
        else:
            line = (f"probe passed: {uuid} reached {value:.0%} of its expected rate; not quarantined — look "
                    "elsewhere: the rank's input pipeline, its network path, or the job itself")
        self.incidents.annotate(incident_id, line)

    def _lost(self, job_id: int, attempt: int) -> int | None:
        for stats in self.jobs.snapshot():
            if stats.job_id == job_id:
                return sum(v for a, v in stats.lost_by_attempt.items() if a >= attempt) if stats.lost_by_attempt else 0
        return None

    def _stepped(self, job_id: int, attempt: int) -> float | None:
        """When a rank of the job's `attempt` (or later) first made step progress, from job telemetry."""
        for stats in self.jobs.snapshot():
            if stats.job_id != job_id:
                continue
            times = [r.first_progress_at for r in stats.ranks.values()
                     if r.attempt >= attempt and r.first_progress_at is not None]
            return min(times) if times else None
        return None


def order_dict(order: Order) -> dict[str, Any]:
    return {"id": order.id, "job_id": order.job_id, "kind": order.kind, "attempt": order.attempt,
            "placement": order.placement, "reason": order.reason, "incident_id": order.incident_id,
            "state": order.state, "created_at": order.created_at.isoformat(),
            "deadline_at": order.deadline_at.isoformat()}

