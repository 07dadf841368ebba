"""The checkpoint catalog: commit a step when every rank's shard is in, plan recoveries, apply retention.

Functions take a session and never commit. The files themselves are on the ranks' stores; the catalog
holds what is in them (manifest digests) and where (tier, node, uri), and decides which steps live.
"""

from __future__ import annotations

import itertools
import statistics
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime

from sqlalchemy import case, func, select
from sqlalchemy.dialects.postgresql import insert as postgresql_insert
from sqlalchemy.dialects.sqlite import insert as sqlite_insert
from sqlalchemy.orm import Session

from sentinel.accelerators.models import Accelerator
from sentinel.audit.service import record
from sentinel.checkpoints.interval import CheckpointIntervalPolicy, IntervalAsk, YoungDaly
from sentinel.checkpoints.models import Checkpoint, CheckpointShard
from sentinel.checkpoints.schemas import (
    CheckpointDetail,
    CheckpointOut,
    CheckpointPolicy,
    PlanShard,
    RecoveryPlan,
    ShardCreate,
    ShardLocation,
    ShardOut,
)
from sentinel.db import utcnow
from sentinel.events.service import record_event
from sentinel.jobs.models import Job
from sentinel.nodes.models import Node
from sentinel.nodes.service import fault_rates
from sentinel.sdk.checkpoint import retained_steps

DEFAULT_KEEP_LAST = 3
GC_HINT_STEPS = 64  # how many retired steps an answer lists for the ranks to garbage-collect


class CheckpointRejected(ValueError):
    def __init__(self, message: str, status: int = 409):
        super().__init__(message)
        self.status = status


class CheckpointNotFound(LookupError):
    pass


@dataclass
class Accepted:
    checkpoint: Checkpoint
    committed_now: bool
    retired: list[tuple[int, int]]  # (step, attempt)


def retention(job: Job) -> tuple[int, int]:
    """(keep_last, keep_every) from the job's attributes `checkpoint_keep_last` / `checkpoint_keep_every`."""
    attrs = job.attributes or {}
    try:
        keep_last = max(1, int(attrs.get("checkpoint_keep_last", DEFAULT_KEEP_LAST)))
        keep_every = max(0, int(attrs.get("checkpoint_keep_every", 0)))
    except (TypeError, ValueError):
        return DEFAULT_KEEP_LAST, 0
    return keep_last, keep_every


def get_checkpoint(session: Session, job: Job, step: int) -> Checkpoint:
    row = session.scalar(select(Checkpoint).where(Checkpoint.job_id == job.id, Checkpoint.step == step))
    if row is None:
        raise CheckpointNotFound(f"job {job.id} has no checkpoint at step {step}")
    return row


def create_checkpoint(session: Session, job: Job, step: int, *, attempt: int = 0) -> tuple[Checkpoint, bool]:
    """The step's row, created pending if new, and locked for this transaction: ranks register their
    shards at the same moment, and each must see the others' before it counts them. Idempotent."""
    values = {"job_id": job.id, "step": step, "attempt": attempt, "state": "pending", "created_at": utcnow(),
              "shards_expected": 1 if job.kind == "serving" else job.world_size}
    dialect = session.get_bind().dialect.name
    insert = postgresql_insert if dialect == "postgresql" else sqlite_insert
    created = session.execute(insert(Checkpoint).values(**values)
                              .on_conflict_do_nothing(index_elements=["job_id", "step"])
                              .returning(Checkpoint.id)).first() is not None
    row = session.scalars(select(Checkpoint).where(Checkpoint.job_id == job.id, Checkpoint.step == step)
                          .with_for_update().execution_options(populate_existing=True)).one()
    return row, created


def register_shard(session: Session, job: Job, step: int, rank: int, spec: ShardCreate, *, actor: str) -> Accepted:
    if rank >= job.world_size:
        raise CheckpointRejected(f"rank {rank} is outside job {job.id}'s world size {job.world_size}", 422)
    checkpoint, _ = create_checkpoint(session, job, step, attempt=spec.attempt)
    if spec.attempt < checkpoint.attempt:
        raise CheckpointRejected(f"job {job.id} step {step} is being saved by attempt {checkpoint.attempt}; "
                                 f"attempt {spec.attempt} is stale")
    if spec.attempt > checkpoint.attempt:
        # a restarted job saved this step again (even one retention dropped): older shards no longer count
        for old in session.scalars(select(CheckpointShard).where(CheckpointShard.checkpoint_id == checkpoint.id)):
            session.delete(old)
        checkpoint.attempt, checkpoint.state = spec.attempt, "pending"
        checkpoint.committed_at = checkpoint.retired_at = None
        session.flush()
    elif checkpoint.state in ("retired", "abandoned"):
        raise CheckpointRejected(f"job {job.id} step {step} is {checkpoint.state}; save a newer step")
    shard = session.scalar(select(CheckpointShard).where(CheckpointShard.checkpoint_id == checkpoint.id,
                                                         CheckpointShard.rank == rank))
    if shard is None:
        shard = CheckpointShard(checkpoint_id=checkpoint.id, rank=rank)
        session.add(shard)
    shard.attempt, shard.manifest_digest = spec.attempt, spec.manifest_digest
    shard.bytes_total, shard.bytes_written = spec.bytes_total, spec.bytes_written
    shard.stall_seconds, shard.write_seconds = spec.stall_seconds, spec.write_seconds
    shard.locations = [loc.model_dump() for loc in spec.locations]
    shard.state, shard.invalid_reason, shard.created_at = "ok", "", utcnow()
    session.flush()
    committed_now = False
    if checkpoint.state == "pending" and (job.kind == "serving" or _shards_in(session, checkpoint) >= job.world_size):
        checkpoint.state, checkpoint.committed_at = "committed", utcnow()
        committed_now = True
        record(session, actor=actor, action="checkpoint.commit", subject=f"job/{job.id}/step/{step}",
               detail={"attempt": checkpoint.attempt, "shards": job.world_size})
        _retire(session, job, step)
    return Accepted(checkpoint, committed_now, _gc_hint(session, job))


def _shards_in(session: Session, checkpoint: Checkpoint) -> int:
    return session.scalar(select(func.count()).select_from(CheckpointShard).where(
        CheckpointShard.checkpoint_id == checkpoint.id, CheckpointShard.attempt == checkpoint.attempt,
        CheckpointShard.state == "ok")) or 0


def _retire(session: Session, job: Job, committed_step: int) -> None:
    """Abandon pending steps older than the one just committed; retire committed steps retention drops."""
    now = utcnow()
    rows = list(session.scalars(select(Checkpoint).where(Checkpoint.job_id == job.id,
                                                         Checkpoint.state.in_(("pending", "committed")))))
    if job.kind != "serving":
        for row in rows:
            if row.state == "pending" and row.step < committed_step:
                row.state, row.retired_at = "abandoned", now
    committed = [row for row in rows if row.state == "committed"]
    keep_last, keep_every = retention(job)
    keep = retained_steps([row.step for row in committed], keep_last=keep_last, keep_every=keep_every)
    # the persistent tier is saved less often: its newest steps stay too, or losing a node's local disk
    # would leave nothing to resume from
    keep |= retained_steps(_persistent_steps(session, committed), keep_last=keep_last)
    for row in committed:
        if row.step not in keep:
            row.state, row.retired_at = "retired", now


def _persistent_steps(session: Session, rows: list[Checkpoint]) -> list[int]:
    """Steps whose every shard has a copy on the persistent tier."""
    by_id = {row.id: row for row in rows}
    missing: set[int] = set()
    for checkpoint_id, attempt, locations in session.execute(
            select(CheckpointShard.checkpoint_id, CheckpointShard.attempt, CheckpointShard.locations)
            .where(CheckpointShard.checkpoint_id.in_(list(by_id)))):
        row = by_id[checkpoint_id]
        if attempt == row.attempt and not any(loc.get("tier") == "persistent" for loc in locations or []):
            missing.add(checkpoint_id)
    return [row.step for row in rows if row.id not in missing]


def _gc_hint(session: Session, job: Job) -> list[tuple[int, int]]:
    """(step, attempt) of the newest retired or abandoned steps: ranks delete those manifests (of that
    attempt or older, so a later attempt that saved the step again keeps its own)."""
    rows = session.execute(select(Checkpoint.step, Checkpoint.attempt).where(
        Checkpoint.job_id == job.id, Checkpoint.state.in_(("retired", "abandoned")))
        .order_by(Checkpoint.retired_at.desc(), Checkpoint.step.desc()).limit(GC_HINT_STEPS))
    return sorted((int(s), int(a)) for s, a in rows)


def mark_invalid(session: Session, job: Job, step: int, rank: int, reason: str, *, actor: str) -> CheckpointShard:
    """A rank could not verify its shard: recovery plans skip the step from now on."""
    checkpoint = get_checkpoint(session, job, step)
    shard = session.scalar(select(CheckpointShard).where(CheckpointShard.checkpoint_id == checkpoint.id,
                                                         CheckpointShard.rank == rank))
    if shard is None:
        raise CheckpointNotFound(f"job {job.id} step {step} has no shard for rank {rank}")
    if shard.state != "invalid":
        shard.state, shard.invalid_reason = "invalid", reason[:1024]
        record(session, actor=actor, action="checkpoint.invalid", subject=f"job/{job.id}/step/{step}/rank/{rank}",
               reason=reason[:512])
        record_event(session, kind="checkpoint_invalid", severity="warning", job_id=job.id,
                     message=f"job {job.id} step {step} rank {rank}: checkpoint shard failed verification: "
                             f"{reason[:400]}", data={"step": step, "rank": rank})
    return shard


def list_checkpoints(session: Session, job: Job, *, limit: int = 100) -> list[CheckpointOut]:
    rows = list(session.scalars(select(Checkpoint).where(Checkpoint.job_id == job.id)
                                .order_by(Checkpoint.step.desc()).limit(limit)))
    totals = _totals(session, [r.id for r in rows])
    return [CheckpointOut.model_validate(r).model_copy(update=totals.get(r.id, {})) for r in rows]


def checkpoint_detail(session: Session, job: Job, step: int) -> CheckpointDetail:
    row = get_checkpoint(session, job, step)
    shards = list(session.scalars(select(CheckpointShard).where(CheckpointShard.checkpoint_id == row.id)
                                  .order_by(CheckpointShard.rank)))
    out = CheckpointDetail.model_validate(row).model_copy(update=_totals(session, [row.id]).get(row.id, {}))
    return out.model_copy(update={"shards": [ShardOut.model_validate(s) for s in shards]})


def _totals(session: Session, ids: list[int]) -> dict[int, dict[str, int]]:
    query = (select(CheckpointShard.checkpoint_id, func.count(), func.sum(CheckpointShard.bytes_total),
                    func.sum(CheckpointShard.bytes_written))
             .where(CheckpointShard.checkpoint_id.in_(ids)).group_by(CheckpointShard.checkpoint_id))
    return {cid: {"shards_in": int(n), "bytes_total": int(total or 0), "bytes_written": int(written or 0)}
            for cid, n, total, written in session.execute(query)}


def unreachable_nodes(session: Session) -> dict[str, str]:
    """{node: why} for nodes whose local disk a recovery must not count on."""
    out = {name: state for name, state in session.execute(select(Node.name, Node.state))
           if state in ("down", "draining")}
    quarantined = func.sum(case((Accelerator.health == "quarantined", 1), else_=0))
    query = (select(Node.name, func.count(Accelerator.id), quarantined)
             .join(Accelerator, Accelerator.node_id == Node.id).group_by(Node.name))
    for name, total, held in session.execute(query):
        if total and (held or 0) >= total and name not in out:
            out[name] = "quarantined"
    return out


def plan_recovery(session: Session, job: Job) -> RecoveryPlan:
    """The newest committed step whose every shard verified and has a copy off failed hardware."""
    away = unreachable_nodes(session)
    skipped: list[str] = []
    rows = session.scalars(select(Checkpoint).where(Checkpoint.job_id == job.id, Checkpoint.state == "committed")
                           .order_by(Checkpoint.step.desc()))
    if job.kind == "serving":
        return _plan_replicas(job, session, list(rows), away)
    for checkpoint in rows:
        shards = list(session.scalars(select(CheckpointShard).where(
            CheckpointShard.checkpoint_id == checkpoint.id, CheckpointShard.attempt == checkpoint.attempt)
            .order_by(CheckpointShard.rank)))
        plan, why = _plan_step(job, checkpoint, shards, away)
        if plan is not None:
            plan.skipped = skipped
            return plan
        skipped.append(f"step {checkpoint.step}: {why}")
    reason = "no committed checkpoint" if not skipped else "no committed checkpoint is whole and reachable"
    return RecoveryPlan(job_id=job.id, step=None, reason=f"{reason}: the job starts from scratch", skipped=skipped)


def _plan_replicas(job: Job, session: Session, rows: list[Checkpoint], away: dict[str, str]) -> RecoveryPlan:
    """Serving replicas are independent: each gets its own newest verified, reachable shard."""
    chosen: dict[int, PlanShard] = {}
    skipped: list[str] = []
    for checkpoint in rows:
        for shard in session.scalars(select(CheckpointShard).where(CheckpointShard.checkpoint_id == checkpoint.id)
                                     .order_by(CheckpointShard.rank)):
            if shard.rank in chosen:
                continue
            plan, why = _plan_step(job, checkpoint, [shard], away)
            if plan is None:
                skipped.append(f"step {checkpoint.step}: {why}")
            else:
                chosen[shard.rank] = plan.ranks[0]
    if not chosen:
        return RecoveryPlan(job_id=job.id, step=None, reason="no replica has a usable checkpoint", skipped=skipped)
    newest = max(p.step for p in chosen.values())
    return RecoveryPlan(job_id=job.id, step=newest, reason=f"each replica's newest usable checkpoint "
                        f"({len(chosen)} of {job.world_size} replicas have one)",
                        ranks=[chosen[r] for r in sorted(chosen)], skipped=skipped)


def _plan_step(job: Job, checkpoint: Checkpoint, shards: list[CheckpointShard],
               away: dict[str, str]) -> tuple[RecoveryPlan | None, str]:
    by_rank = {s.rank: s for s in shards}
    ranks: list[PlanShard] = []
    wanted = sorted(by_rank) if job.kind == "serving" else list(range(job.world_size))
    for rank in wanted:
        shard = by_rank.get(rank)
        if shard is None:
            return None, f"rank {rank}'s shard is missing"
        if shard.state == "invalid":
            return None, f"rank {rank}'s shard failed verification ({shard.invalid_reason[:200]})"
        locations = [ShardLocation.model_validate(loc) for loc in shard.locations]
        usable = [loc for loc in locations if loc.tier == "persistent" or loc.node not in away]
        if not usable:
            held = ", ".join(f"{loc.node} ({away.get(loc.node, '?')})" for loc in locations)
            return None, f"rank {rank}'s shard is only on the local tier of {held} and not replicated"
        usable.sort(key=lambda loc: loc.tier == "persistent")  # a local copy first: it is the fast one
        ranks.append(PlanShard(rank=rank, step=checkpoint.step, manifest_digest=shard.manifest_digest,
                               locations=usable))
    reason = f"step {checkpoint.step} is committed and every shard has a reachable copy"
    return RecoveryPlan(job_id=job.id, step=checkpoint.step, reason=reason, committed_at=checkpoint.committed_at,
                        ranks=ranks), ""


@dataclass
class Costs:
    last_step: int | None
    last_at: datetime | None
    committed: int
    stall_seconds: float | None
    write_seconds: float | None
    bytes_total: int | None
    bytes_written_total: int
    interval_seconds: float | None


def checkpoint_costs(session: Session, job_id: int, *, recent: int = 10) -> Costs:
    """Median save costs over the recent committed steps (per step, the slowest rank)."""
    rows = list(session.execute(
        select(Checkpoint.id, Checkpoint.step, Checkpoint.committed_at).where(
            Checkpoint.job_id == job_id, Checkpoint.committed_at.is_not(None))
        .order_by(Checkpoint.step.desc()).limit(recent)))
    written = session.scalar(select(func.sum(CheckpointShard.bytes_written)).join(
        Checkpoint, Checkpoint.id == CheckpointShard.checkpoint_id).where(Checkpoint.job_id == job_id)) or 0
    committed = session.scalar(select(func.count()).select_from(Checkpoint).where(
        Checkpoint.job_id == job_id, Checkpoint.committed_at.is_not(None))) or 0
    if not rows:
        return Costs(None, None, 0, None, None, None, int(written), None)
    per_step = {cid: (0.0, 0.0, 0) for cid, _, _ in rows}
    for cid, stall, write, nbytes in session.execute(
            select(CheckpointShard.checkpoint_id, CheckpointShard.stall_seconds, CheckpointShard.write_seconds,
                   CheckpointShard.bytes_total).where(CheckpointShard.checkpoint_id.in_(list(per_step)))):
        s, w, b = per_step[cid]
        per_step[cid] = (max(s, stall), max(w, write), b + nbytes)
    times = sorted(at.timestamp() for _, _, at in rows if at is not None)
    gaps = [b - a for a, b in itertools.pairwise(times)]
    return Costs(last_step=int(rows[0][1]), last_at=rows[0][2], committed=int(committed),
                 stall_seconds=statistics.median(v[0] for v in per_step.values()),
                 write_seconds=statistics.median(v[1] for v in per_step.values()),
                 bytes_total=per_step[rows[0][0]][2], bytes_written_total=int(written),
                 interval_seconds=statistics.median(gaps) if gaps else None)


def with_progress(plan: RecoveryPlan, last_step: int | None) -> RecoveryPlan:
    """Add how far the job had got (`last_step`, from its telemetry) and so how many steps resuming from the
    plan recomputes."""
    if last_step is None:
        return plan
    redo = max(0, last_step - (plan.step or 0))
    return plan.model_copy(update={"last_step": last_step, "steps_to_recompute": redo})


def fleet_fault_rate_per_hour(session: Session, now: datetime) -> float:
    """Hardware faults per accelerator-hour across the fleet."""
    rates = fault_rates(session, now)
    days = sum(d for _, _, d in rates)
    return sum(f for _, f, _ in rates) / (days * 24.0) if days > 0 else 0.0


def checkpoint_policy(session: Session, job: Job, *, now: datetime, failures_per_hour: float | None,
                      accelerators: int, step_seconds: float | None, fleet_rate: float | None = None,
                      uuids: Sequence[str] = (), interval_policy: CheckpointIntervalPolicy | None = None
                      ) -> CheckpointPolicy:
    """Costs from the catalog and the live failure rate (the job's own task failures or the fleet's hardware
    fault rate over its accelerators, whichever is higher); the interval from `interval_policy` (default
    Young/Daly on that rate). `uuids` are the job's accelerators, for a policy that looks at its nodes."""
    costs = checkpoint_costs(session, job.id)
    if fleet_rate is None:
        fleet_rate = fleet_fault_rate_per_hour(session, now)
    hardware = fleet_rate * max(1, accelerators)
    rate, basis = max((failures_per_hour or 0.0, "this job's task failures"), (hardware, "the fleet's hardware "
                      f"fault rate × {max(1, accelerators)} accelerator(s)"))
    mtbf = 1.0 / rate if rate > 0 else None
    if mtbf is None:
        basis = "no failure observed yet, in this job or the fleet"
    policy = interval_policy or YoungDaly()
    interval = policy.interval_seconds(session, IntervalAsk(
        job_id=job.id, stall_seconds=costs.stall_seconds, mtbf_seconds=mtbf * 3600.0 if mtbf is not None else None,
        accelerators=tuple(uuids), now=now))
    steps = max(1, round(interval / step_seconds)) if interval is not None and step_seconds else None
    return CheckpointPolicy(last_committed_step=costs.last_step, last_committed_at=costs.last_at,
                            committed=costs.committed, stall_seconds=costs.stall_seconds,
                            write_seconds=costs.write_seconds, bytes_total=costs.bytes_total,
                            bytes_written_total=costs.bytes_written_total, mtbf_hours=mtbf, failure_basis=basis,
                            interval_recommended_seconds=interval, interval_recommended_steps=steps,
                            interval_observed_seconds=costs.interval_seconds, interval_policy=policy.name)
