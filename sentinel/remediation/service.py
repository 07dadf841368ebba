"""Remediation flows that change SQL: quarantine, drain, move a job (an order), restart in place, fleet-wide.

Each takes the caller's session and never commits; it returns an `Outcome` that says what was done, which
orders were issued and which actions the executors owe, for the engine to carry out after the commit
(remediation/engine.py). What to do is decided by policy.py; the circuit breaker gates every automatic
action that takes capacity away — a quarantine, a drain, a probe (it marks the accelerator suspect)
(breaker.py); restarts, moves off hardware already out of service, and a person's uncordon or release keep
working while it is open. A person's manual quarantine bypasses it. Before every restart the restart-storm
rule applies (storms.py).
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from sqlalchemy import func, select
from sqlalchemy.orm import Session

from sentinel.accelerators.models import Accelerator
from sentinel.accelerators.service import get_accelerator, set_health
from sentinel.checkpoints.service import plan_recovery
from sentinel.config import Settings
from sentinel.incidents.findings import Finding
from sentinel.incidents.models import Incident
from sentinel.jobs.models import Job, Task
from sentinel.live.fleet import Fleet
from sentinel.nodes.models import Node
from sentinel.nodes.service import set_admin_state
from sentinel.remediation import policy, storms
from sentinel.remediation.breaker import Breaker
from sentinel.remediation.executors.base import Action, JobRef
from sentinel.remediation.models import Order, Remediation
from sentinel.remediation.orders import create_order, latest_attempt, order_dict
from sentinel.remediation.placement import Inventory, NoCapacity, PlacementPolicy, PlacementRequest

log = logging.getLogger("sentinel.remediation")


class Counts:
    """Automatic actions by (action, result), for `sentinel_remediations_total`; safe across threads."""

    def __init__(self) -> None:
        self._counts: dict[tuple[str, str], int] = {}
        self._lock = threading.Lock()

    def add(self, action: str, result: str, n: int = 1) -> None:
        with self._lock:
            self._counts[(action, result)] = self._counts.get((action, result), 0) + n

    def snapshot(self) -> dict[tuple[str, str], int]:
        with self._lock:
            return dict(self._counts)

    def load(self, session: Session) -> None:
        for action, result, count in session.execute(
                select(Remediation.action, Remediation.result, func.count()).group_by(Remediation.action,
                                                                                      Remediation.result)):
            self.add(action, result, int(count))


@dataclass
class Context:
    """What the flows need besides the session."""

    settings: Settings
    breaker: Breaker
    placement: PlacementPolicy
    fleet: Fleet
    counts: Counts
    now: datetime
    # told of each order as it is issued, before the commit: from then on the job's old ranks stop on purpose
    on_order: Callable[[int, int, float], None] = lambda job_id, attempt, at: None
    # node → why the network tier keeps it out of placement (empty unless network_exclude_slow_nodes)
    excluded: Callable[[], dict[str, str]] = dict

    def node_states(self) -> dict[str, str]:
        """Each node's state for placement; an active node the network tier excludes reads "excluded"."""
        out = {n.name: n.state for n in self.fleet.all()}
        for name in self.excluded():
            if out.get(name) == "active":
                out[name] = "excluded"
        return out


@dataclass(frozen=True)
class Ordered:
    """An order issued in this transaction: its job and attempt, and what its launcher gets."""

    job_id: int
    attempt: int
    order: dict[str, Any]
    job: JobRef


@dataclass
class Outcome:
    """What one handling did, said after its transaction committed."""

    lines: list[str] = field(default_factory=list)
    escalate: bool = False
    orders: list[Ordered] = field(default_factory=list)
    actions: list[Action] = field(default_factory=list)  # node actions for the configured executors
    findings: list[Finding] = field(default_factory=list)  # incidents to open (a restart storm)


def record(session: Session, ctx: Context, incident_id: int | None, action: str, subject: str, result: str,
           detail: str, accelerators: int = 0) -> None:
    session.add(Remediation(incident_id=incident_id, action=action, subject=subject[:256], result=result,
                            detail=detail[:1024], accelerators=accelerators, created_at=ctx.now))
    ctx.counts.add(action, result)


def blocked_by_breaker(session: Session, ctx: Context, incident_id: int, out: Outcome, what: str) -> bool:
    if not ctx.breaker.open:
        return False
    row = ctx.breaker.state(session)
    record(session, ctx, incident_id, what, f"incident/{incident_id}", "blocked", "circuit breaker open")
    out.lines.append(f"circuit breaker is open (since {row.opened_at:%H:%M:%S}Z: {row.reason}); no automatic "
                     "action — reset it with `POST /api/v1/breaker/reset` once the cause is understood")
    out.escalate = True
    return True


def trips_breaker(session: Session, ctx: Context, incident_id: int | None, proposed: set[str], what: str,
                  subject: str) -> str:
    """Trip the breaker when taking `proposed` out would take too much at once; returns why, or ''."""
    inventory = Inventory.load(session, node_states=ctx.node_states())
    reason, domain = ctx.breaker.would_trip(session, proposed, inventory, ctx.now)
    if reason:
        ctx.breaker.trip(session, reason=reason, domain=domain, incident_id=incident_id, now=ctx.now)
        record(session, ctx, incident_id, what, subject, "blocked", reason, accelerators=len(proposed))
        log.error("circuit breaker tripped: incident=%s %s", incident_id, reason)
    return reason


def release_accelerator(session: Session, uuid: str, *, reason: str, actor: str) -> tuple[bool, list[int]]:
    """Back in service after repair: healthy again. Returns (whether it changed, the latched incidents about
    it, still open, for the caller to resolve once this commits). AcceleratorNotFound for an unknown uuid."""
    acc = get_accelerator(session, uuid)
    changed = set_health(session, acc, health="healthy", reason=reason, actor=actor)
    latched = [i for (i,) in session.execute(select(Incident.id).where(
        Incident.accelerator_uuid == uuid, Incident.state != "resolved", Incident.latched.is_(True)))]
    return changed, latched


# -- take out: quarantine accelerators, drain a node, move the jobs on them --------------------------------

@dataclass
class _Target:
    accelerators: list[Accelerator]
    proposed: set[str]  # not yet quarantined
    jobs: list[Job]
    node: Node | None  # to drain, when it is not draining or cordoned already
    title: str


def _target(session: Session, incident_id: int | None, uuids: list[str], drain: str | None, actor: str) -> _Target:
    source = session.get(Incident, incident_id) if incident_id else None
    accs = list(session.scalars(select(Accelerator).where(Accelerator.uuid.in_(uuids))))
    node = session.scalar(select(Node).where(Node.name == drain)) if drain else None
    return _Target(accelerators=accs, proposed={a.uuid for a in accs if a.health != "quarantined"},
                   jobs=jobs_on(session, set(uuids)),
                   node=node if node is not None and node.admin_state not in ("draining", "cordoned") else None,
                   title=source.title if source is not None else f"manual, by {actor}")


def take_out(session: Session, ctx: Context, incident_id: int | None, uuids: list[str], *, drain: str | None,
             actor: str = "sentinel", bypass_breaker: bool = False) -> Outcome:
    """Quarantine `uuids` (and drain node `drain`), then move every job on them. Automatic calls go through
    the breaker; a person's manual quarantine does not."""
    out = Outcome()
    target = _target(session, incident_id, uuids, drain, actor)
    if not target.proposed and not target.jobs and target.node is None:
        return out
    if not bypass_breaker and _gated(session, ctx, incident_id, target, out):
        return out
    if ctx.settings.remediation_dry_run:
        _dry_run(session, ctx, incident_id, target, drain, out)
        return out
    _quarantine(session, ctx, incident_id, target, actor, out)
    if target.node is not None:
        _drain(session, ctx, incident_id, target.node, target.title, actor, out)
    session.flush()
    moving = [j for j in target.jobs if not already_moving(session, j.id, set(uuids))]
    for job in moving:
        move_job(session, ctx, job, set(uuids), incident_id, out)
    if target.node is not None:
        out.actions.append(Action("drain_node", target.node.name, target.title, tuple(uuids), (), incident_id))
    if moving:
        slots = Inventory.load(session, node_states=ctx.node_states()).slots
        for node in sorted({slots[u].node for u in uuids if u in slots}):
            out.actions.append(Action("move_work", node, target.title, tuple(uuids),
                                      tuple(job_ref(j) for j in moving), incident_id))
    return out


def _gated(session: Session, ctx: Context, incident_id: int | None, target: _Target, out: Outcome) -> bool:
    """The breaker blocks taking capacity away (a new quarantine or drain), never moving a job off what is
    out of service already (NVSentinel PR #1852)."""
    ref = incident_id or 0
    takes_away = bool(target.proposed) or target.node is not None
    if takes_away and blocked_by_breaker(session, ctx, ref, out, "quarantine_accelerator"):
        return True
    if target.proposed:
        reason = trips_breaker(session, ctx, incident_id, target.proposed, "quarantine_accelerator",
                               f"incident/{ref}")
        if reason:
            out.lines.append(f"circuit breaker tripped: {reason}. Nothing was quarantined or drained; automatic "
                             "actions stay off until an operator resets it (`GET /api/v1/breaker`, "
                             "`POST /api/v1/breaker/reset`)")
            out.escalate = True
            return True
    return False


def _dry_run(session: Session, ctx: Context, incident_id: int | None, target: _Target, drain: str | None,
             out: Outcome) -> None:
    what = ", ".join(sorted(target.proposed)) or "nothing new"
    record(session, ctx, incident_id, "quarantine_accelerator", what, "dry_run", target.title, len(target.proposed))
    out.lines.append(f"dry run: would quarantine {what}" + (f", drain node {drain}" if target.node else "")
                     + (f", restart job(s) {', '.join(str(j.id) for j in target.jobs)} elsewhere"
                        if target.jobs else ""))


def _quarantine(session: Session, ctx: Context, incident_id: int | None, target: _Target, actor: str,
                out: Outcome) -> None:
    ref = incident_id or 0
    for acc in target.accelerators:
        set_health(session, acc, health="quarantined", reason=f"incident #{ref}: {target.title}", actor=actor,
                   incident_id=incident_id)
    if target.proposed:
        what = ", ".join(sorted(target.proposed))
        record(session, ctx, incident_id, "quarantine_accelerator", what, "done", target.title, len(target.proposed))
        out.lines.append(f"quarantined accelerator(s) {what}: no new work is placed there")


def _drain(session: Session, ctx: Context, incident_id: int | None, node: Node, title: str, actor: str,
           out: Outcome) -> None:
    set_admin_state(session, node, admin_state="draining", reason=f"incident #{incident_id or 0}: {title}",
                    actor=actor)
    session.flush()
    ctx.fleet.apply(node)
    record(session, ctx, incident_id, "drain_node", node.name, "done", title)
    out.lines.append(f"drained node {node.name}: it takes no new work; `sentinel uncordon {node.name}` after repair")


def fleet_wide(session: Session, ctx: Context, incident_id: int, uuids: list[str], nodes: list[str]) -> Outcome:
    """A fleet-wide outage: never drained automatically; it trips the breaker when large enough."""
    out = Outcome()
    if blocked_by_breaker(session, ctx, incident_id, out, "drain_node"):
        return out
    reason = trips_breaker(session, ctx, incident_id, set(uuids), "drain_node", f"{len(nodes)} nodes")
    if reason:
        out.lines.append(f"circuit breaker tripped: {reason}. Nothing was quarantined or drained")
    elif nodes:
        record(session, ctx, incident_id, "drain_node", f"{len(nodes)} nodes", "skipped",
               "a fleet-wide outage is a person's call")
        out.lines.append(f"{len(nodes)} nodes at once: not drained automatically; a fleet-wide outage is a "
                         "person's call")
    else:
        out.lines.append("many subjects at once: nothing is changed automatically; a shared cause is a person's call")
    out.escalate = True
    return out


def restart_in_place(session: Session, ctx: Context, incident_id: int, job_id: int, *,
                     after_failure: bool = True) -> Outcome:
    """A task failed (or the job hung): restart the job as a new attempt, unless that is already ordered.
    After a failure, only when the failed task belongs to the latest attempt: exits of an attempt being
    replaced are expected."""
    out = Outcome()
    job = session.get(Job, job_id)
    latest = latest_attempt(session, job_id) if job is not None else None
    if job is None or job.state in policy.FINISHED_JOB_STATES or latest is None:
        return out
    failed = session.scalar(select(func.count()).select_from(Task).where(
        Task.job_id == job_id, Task.attempt == latest, Task.state == "failed")) or 0
    newer = session.scalar(select(func.count()).select_from(Order).where(
        Order.job_id == job_id, Order.attempt > latest, Order.state != "superseded")) or 0
    if not policy.restart_wanted(after_failure=after_failure, failed_in_latest=failed, newer_orders=newer):
        return out
    # no breaker here: a restart takes no capacity away (it re-places only ranks on unusable hardware)
    if ctx.settings.remediation_dry_run:
        record(session, ctx, incident_id, "restart_job", f"job/{job_id}", "dry_run", "")
        out.lines.append(f"dry run: would restart job {job_id} as attempt {latest + 1}")
        return out
    # a serving replica is replaced alone: the incident's rank is the one to drain and replace, in place
    rank = session.scalar(select(Incident.rank).where(Incident.id == incident_id)) \
        if job.kind in policy.SERVING_KINDS else None
    move_job(session, ctx, job, set(), incident_id, out, also=frozenset() if rank is None else frozenset({rank}))
    return out


# -- moving a job: an order with a new placement ------------------------------------------------------------

def jobs_on(session: Session, uuids: set[str]) -> list[Job]:
    """Unfinished jobs whose latest attempt has a task on any of `uuids`."""
    found: dict[int, Job] = {}
    for task, job in session.execute(select(Task, Job).join(Job, Job.id == Task.job_id)
                                     .where(Job.state.not_in(policy.FINISHED_JOB_STATES))):
        if set(task.accelerators) & uuids and task.attempt == latest_attempt(session, job.id):
            found[job.id] = job
    return [found[k] for k in sorted(found)]


def already_moving(session: Session, job_id: int, bad: set[str]) -> bool:
    """An order in flight (not yet stepping) already takes the job off `bad`: a repeat changes nothing."""
    for order in session.scalars(select(Order).where(Order.job_id == job_id, Order.completed_at.is_(None),
                                                     Order.kind != "adjust",
                                                     Order.state.in_(("pending", "acknowledged", "done")))):
        if not any(set(slot.get("accelerators", [])) & bad for slot in order.placement):
            return True
    return False


def job_ref(job: Job) -> JobRef:
    return JobRef(job.id, job.name, job.kind, dict(job.attributes))


def move_job(session: Session, ctx: Context, job: Job, bad: set[str], incident_id: int | None,
             out: Outcome, also: frozenset[int] = frozenset()) -> None:
    """Order `job` restarted (a new attempt), its ranks on `bad` or on unusable hardware re-placed; `also`: ranks
    of a serving job to replace where they are."""
    if _storm_stops(session, ctx, job, incident_id, out):
        return
    latest = latest_attempt(session, job.id)
    current = {t.rank: list(t.accelerators) for t in session.scalars(
        select(Task).where(Task.job_id == job.id, Task.attempt == latest))}
    inventory = Inventory.load(session, job_id=job.id, node_states=ctx.node_states())
    replace = policy.ranks_to_replace(current, bad, inventory.free)
    per_rank = max((len(u) for u in current.values()), default=1) or 1
    placer = ctx.placement.prepare(session, ctx.now, incident_id=incident_id)
    try:
        placement = placer.place(PlacementRequest(job.id, current, replace, per_rank), inventory)
    except NoCapacity as exc:
        record(session, ctx, incident_id, "restart_job", f"job/{job.id}", "failed", str(exc))
        out.lines.append(f"job {job.id} ({job.name}) cannot move: {exc}; free capacity or release a spare")
        out.lines.extend(placer.explanation())
        out.escalate = True
        return
    _order(session, ctx, job, placement, replace | also, incident_id, out)
    out.lines.extend(placer.explanation())  # why these nodes (a learned policy, a shadow beside the active one)


def _storm_stops(session: Session, ctx: Context, job: Job, incident_id: int | None, out: Outcome) -> bool:
    """A job held by a restart-storm incident, or about to start one, is not restarted (storms.py)."""
    held = storms.held_by(session, job.id)
    if held is not None:
        record(session, ctx, incident_id, "restart_job", f"job/{job.id}", "skipped", f"held by incident #{held}")
        out.lines.append(f"job {job.id} ({job.name}) not restarted: automatic restarts are held by restart-storm "
                         f"incident #{held} until a person resolves it")
        return True
    reason, latest = storms.storm(session, ctx.settings, job, ctx.now)
    if not reason:
        return False
    record(session, ctx, incident_id, "restart_job", f"job/{job.id}", "skipped", f"restart storm: {reason}")
    out.lines.append(f"job {job.id} ({job.name}) not restarted: {reason}; a restart-storm incident holds its "
                     "automatic restarts until a person resolves it — look for a cause that follows the job")
    out.findings.append(storms.finding(job, reason, latest, incident_id, ctx.now.timestamp()))
    out.escalate = True
    log.error("restart storm: job=%d incident=%s %s", job.id, incident_id, reason)
    return True


def _order(session: Session, ctx: Context, job: Job, placement: dict[int, tuple[str, list[str]]],
           replace: frozenset[int], incident_id: int | None, out: Outcome) -> None:
    kind = policy.order_kind(job.kind)
    rows = [{"rank": r, "node": n, "accelerators": u, **({"replace": True} if kind == "replace_replica"
                                                          and r in replace else {})}
            for r, (n, u) in sorted(placement.items())]  # a replica marked `replace` is replaced; the others stay
    order = create_order(session, job=job, kind=kind, placement=rows, incident_id=incident_id, now=ctx.now,
                         ack_seconds=ctx.settings.order_ack_seconds,
                         reason=f"incident #{incident_id}" if incident_id else "manual quarantine")
    moved = ", ".join(f"rank {r} → {n}:{','.join(u)}" for r, (n, u) in sorted(placement.items()) if r in replace)
    record(session, ctx, incident_id, "restart_job", f"job/{job.id}", "done", f"order {order.id}")
    plan = plan_recovery(session, job)
    order.checkpoint_step = plan.step
    how = ("replace the replica: drain it, start the replacement, then stop it" if kind == "replace_replica"
           else "restart")
    how += f" from checkpoint step {plan.step}" if plan.step is not None else f" ({plan.reason})"
    if plan.skipped:
        how += f" [passed over: {'; '.join(plan.skipped[:3])}]"
    out.lines.append(f"order {order.id}: job {job.id} ({job.name}) attempt {order.attempt}, {how}"
                     + (f"; {moved}" if moved else "; same placement"))
    out.orders.append(Ordered(job.id, order.attempt, order_dict(order), job_ref(job)))
    ctx.on_order(job.id, order.attempt, ctx.now.timestamp())
    log.warning("order issued: order=%s job=%d attempt=%d kind=%s incident=%s %s", order.id, job.id,
                order.attempt, kind, incident_id, moved or "same placement")
