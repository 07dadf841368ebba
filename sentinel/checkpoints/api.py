"""Checkpoint catalog routes: register steps and shards, the recovery plan, and checkpoint policy."""

from __future__ import annotations

import logging
from datetime import datetime
from typing import Annotated

from fastapi import APIRouter, Depends, HTTPException, Path, Query, Response
from sqlalchemy.orm import Session

from sentinel.auth.deps import LAUNCH, READ, allow
from sentinel.auth.service import Principal
from sentinel.checkpoints import service
from sentinel.checkpoints.schemas import (
    CheckpointCreate,
    CheckpointDetail,
    CheckpointOut,
    CheckpointPolicy,
    RecoveryPlan,
    RetiredStep,
    ShardAccepted,
    ShardCreate,
    ShardInvalid,
)
from sentinel.clock import to_datetime
from sentinel.db import transaction
from sentinel.deps import IdPath, not_found, runtime
from sentinel.errors import CONFLICT
from sentinel.jobs.models import Job
from sentinel.jobs.service import JobNotFound, get_job
from sentinel.nodes.service import fault_rates
from sentinel.runtime import Runtime

log = logging.getLogger("sentinel.checkpoints")
router = APIRouter(prefix="/jobs/{job_id}", tags=["checkpoints"])
RT = Annotated[Runtime, Depends(runtime)]
Rank = Annotated[int, Path(ge=0, le=100_000)]
StepPath = Annotated[int, Path(ge=0, le=2**62)]


def _job(session: Session, job_id: int) -> Job:
    try:
        return get_job(session, job_id)
    except JobNotFound as exc:
        raise not_found(exc) from exc


@router.post("/checkpoints", response_model=CheckpointOut, status_code=201,
             responses={200: {"description": "The step was already announced", "model": CheckpointOut}})
def create_checkpoint(job_id: IdPath, spec: CheckpointCreate, rt: RT, response: Response,
                      who: Annotated[Principal, Depends(allow(LAUNCH))]) -> CheckpointOut:
    """Announce a step (optional: a shard announces its step too). 200 when it already exists."""
    with transaction(rt.factory) as session:
        job = _job(session, job_id)
        row, created = service.create_checkpoint(session, job, spec.step, attempt=spec.attempt)
        out = CheckpointOut.model_validate(row)
    if not created:
        response.status_code = 200
    return out


@router.get("/checkpoints", response_model=list[CheckpointOut], dependencies=[Depends(allow(READ))])
def list_checkpoints(job_id: IdPath, rt: RT, limit: Annotated[int, Query(ge=1, le=1000)] = 100) -> list[CheckpointOut]:
    with rt.factory() as session:
        return service.list_checkpoints(session, _job(session, job_id), limit=limit)


@router.get("/checkpoints/{step}", response_model=CheckpointDetail, dependencies=[Depends(allow(READ))])
def get_checkpoint(job_id: IdPath, step: StepPath, rt: RT) -> CheckpointDetail:
    with rt.factory() as session:
        try:
            return service.checkpoint_detail(session, _job(session, job_id), step)
        except service.CheckpointNotFound as exc:
            raise not_found(exc) from exc


@router.put("/checkpoints/{step}/shards/{rank}", response_model=ShardAccepted, responses=CONFLICT)
def put_shard(job_id: IdPath, step: StepPath, rank: Rank, spec: ShardCreate, rt: RT,
              who: Annotated[Principal, Depends(allow(LAUNCH))]) -> ShardAccepted:
    """One rank's manifest is written; the step commits when every rank of the same attempt is in."""
    try:
        with transaction(rt.factory) as session:
            job = _job(session, job_id)
            accepted = service.register_shard(session, job, step, rank, spec, actor=who.actor)
            state, world_size = accepted.checkpoint.state, job.world_size
    except service.CheckpointRejected as exc:
        raise HTTPException(exc.status, str(exc)) from exc
    rt.checkpoints.shard(job_id, step, rank, world_size=world_size, committed=accepted.committed_now,
                         at=rt.clock.time())
    rt.jobs.saved(job_id, rank, spec.attempt, step)
    if accepted.committed_now:
        log.info("checkpoint committed: job=%d step=%d attempt=%d retired=%s", job_id, step, spec.attempt,
                 [s for s, _ in accepted.retired[-5:]])
    return ShardAccepted(step=step, rank=rank, state=state, committed=state == "committed",
                         retired_steps=[s for s, _ in accepted.retired],
                         retired=[RetiredStep(step=s, attempt=a) for s, a in accepted.retired])


@router.post("/checkpoints/{step}/shards/{rank}/invalid", response_model=RecoveryPlan)
def report_invalid(job_id: IdPath, step: StepPath, rank: Rank, body: ShardInvalid, rt: RT,
                   who: Annotated[Principal, Depends(allow(LAUNCH))]) -> RecoveryPlan:
    """A rank's restore found this shard damaged: the plan skips the step; answers the new plan."""
    try:
        with transaction(rt.factory) as session:
            job = _job(session, job_id)
            service.mark_invalid(session, job, step, rank, body.reason, actor=who.actor)
            plan = service.plan_recovery(session, job)
    except service.CheckpointNotFound as exc:
        raise not_found(exc) from exc
    log.warning("checkpoint shard invalid: job=%d step=%d rank=%d by=%s reason=%s; plan now step=%s", job_id, step,
                rank, who.actor, body.reason[:200], plan.step)
    return plan


@router.get("/recovery-plan", response_model=RecoveryPlan, dependencies=[Depends(allow(READ))])
def recovery_plan(job_id: IdPath, rt: RT) -> RecoveryPlan:
    with rt.factory() as session:
        plan = service.plan_recovery(session, _job(session, job_id))
    return with_progress(rt, plan)


def with_progress(rt: Runtime, plan: RecoveryPlan) -> RecoveryPlan:
    """Add how far the job had got (its telemetry) and so how many steps resuming from the plan recomputes."""
    last = rt.jobs.last_step(plan.job_id)
    if last is None:
        return plan
    redo = max(0, last - (plan.step or 0))
    return plan.model_copy(update={"last_step": last, "steps_to_recompute": redo})


def checkpoint_policy(rt: Runtime, session: Session, job: Job, *, failures_per_hour: float | None,
                      accelerators: int, step_seconds: float | None,
                      fleet_rate: float | None = None) -> CheckpointPolicy:
    """Costs from the catalog and the Young/Daly interval from the live failure rate."""
    costs = service.checkpoint_costs(session, job.id)
    if fleet_rate is None:
        fleet_rate = fleet_fault_rate_per_hour(session, to_datetime(rt.clock.time()))
    hardware = fleet_rate * max(1, accelerators)
    rate, basis = max((failures_per_hour or 0.0, "this job's task failures"), (hardware, "the fleet's hardware "
                      f"fault rate × {max(1, accelerators)} accelerator(s)"))
    interval = steps = None
    mtbf = 1.0 / rate if rate > 0 else None
    if mtbf is None:
        basis = "no failure observed yet, in this job or the fleet"
    elif costs.stall_seconds is not None:
        interval = service.young_daly_seconds(costs.stall_seconds, mtbf * 3600.0)
        steps = max(1, round(interval / step_seconds)) if step_seconds else None
    return CheckpointPolicy(last_committed_step=costs.last_step, last_committed_at=costs.last_at,
                            committed=costs.committed, stall_seconds=costs.stall_seconds,
                            write_seconds=costs.write_seconds, bytes_total=costs.bytes_total,
                            bytes_written_total=costs.bytes_written_total, mtbf_hours=mtbf, failure_basis=basis,
                            interval_recommended_seconds=interval, interval_recommended_steps=steps,
                            interval_observed_seconds=costs.interval_seconds)


def fleet_fault_rate_per_hour(session: Session, now: datetime) -> float:
    """Hardware faults per accelerator-hour across the fleet."""
    rates = fault_rates(session, now)
    days = sum(d for _, _, d in rates)
    return sum(f for _, f, _ in rates) / (days * 24.0) if days > 0 else 0.0

