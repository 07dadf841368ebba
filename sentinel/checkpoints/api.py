"""Checkpoint catalog routes: register steps and shards, the recovery plan, and checkpoint policy."""

from __future__ import annotations

import logging
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
    RecoveryPlan,
    RetiredStep,
    ShardAccepted,
    ShardCreate,
    ShardInvalid,
)
from sentinel.db import transaction
from sentinel.deps import IdPath, Live, ServerClock, Sessions, not_found
from sentinel.errors import CONFLICT
from sentinel.jobs.models import Job
from sentinel.jobs.service import JobNotFound, get_job

log = logging.getLogger("sentinel.checkpoints")
router = APIRouter(prefix="/jobs/{job_id}", tags=["checkpoints"])
Rank = Annotated[int, Path(ge=0, le=100_000)]
StepPath = Annotated[int, Path(ge=0, le=2**62)]


def _job(session: Session, job_id: int) -> Job:
    try:
        return get_job(session, job_id)
    except JobNotFound as exc:
        raise not_found(exc) from exc


@router.post("/checkpoints", response_model=CheckpointOut, status_code=201,
             responses={200: {"description": "The step was already announced", "model": CheckpointOut}})
def create_checkpoint(job_id: IdPath, spec: CheckpointCreate, sessions: Sessions, response: Response,
                      who: Annotated[Principal, Depends(allow(LAUNCH))]) -> CheckpointOut:
    """Announce a step (optional: a shard announces its step too). 200 when it already exists."""
    with transaction(sessions) as session:
        job = _job(session, job_id)
        row, created = service.create_checkpoint(session, job, spec.step, attempt=spec.attempt)
        out = CheckpointOut.model_validate(row)
    if not created:
        response.status_code = 200
    return out


@router.get("/checkpoints", response_model=list[CheckpointOut], dependencies=[Depends(allow(READ))])
def list_checkpoints(job_id: IdPath, sessions: Sessions,
                     limit: Annotated[int, Query(ge=1, le=1000)] = 100) -> list[CheckpointOut]:
    with sessions() as session:
        return service.list_checkpoints(session, _job(session, job_id), limit=limit)


@router.get("/checkpoints/{step}", response_model=CheckpointDetail, dependencies=[Depends(allow(READ))])
def get_checkpoint(job_id: IdPath, step: StepPath, sessions: Sessions) -> CheckpointDetail:
    with sessions() as session:
        try:
            return service.checkpoint_detail(session, _job(session, job_id), step)
        except service.CheckpointNotFound as exc:
            raise not_found(exc) from exc


@router.put("/checkpoints/{step}/shards/{rank}", response_model=ShardAccepted, responses=CONFLICT)
def put_shard(job_id: IdPath, step: StepPath, rank: Rank, spec: ShardCreate, sessions: Sessions, live: Live,
              clock: ServerClock, who: Annotated[Principal, Depends(allow(LAUNCH))]) -> ShardAccepted:
    """One rank's manifest is written; the step commits when every rank of the same attempt is in."""
    try:
        with transaction(sessions) as session:
            job = _job(session, job_id)
            accepted = service.register_shard(session, job, step, rank, spec, actor=who.actor)
            state, world_size = accepted.checkpoint.state, job.world_size
    except service.CheckpointRejected as exc:
        raise HTTPException(exc.status, str(exc)) from exc
    live.shard_registered(job_id, step, rank, spec.attempt, world_size=world_size, committed=accepted.committed_now,
                          at=clock.time())
    if accepted.committed_now:
        log.info("checkpoint committed: job=%d step=%d attempt=%d retired=%s", job_id, step, spec.attempt,
                 [s for s, _ in accepted.retired[-5:]])
    return ShardAccepted(step=step, rank=rank, state=state, committed=state == "committed",
                         retired_steps=[s for s, _ in accepted.retired],
                         retired=[RetiredStep(step=s, attempt=a) for s, a in accepted.retired])


@router.post("/checkpoints/{step}/shards/{rank}/invalid", response_model=RecoveryPlan)
def report_invalid(job_id: IdPath, step: StepPath, rank: Rank, body: ShardInvalid, sessions: Sessions,
                   who: Annotated[Principal, Depends(allow(LAUNCH))]) -> RecoveryPlan:
    """A rank's restore found this shard damaged: the plan skips the step; answers the new plan."""
    try:
        with transaction(sessions) as session:
            job = _job(session, job_id)
            service.mark_invalid(session, job, step, rank, body.reason, actor=who.actor)
            plan = service.plan_recovery(session, job)
    except service.CheckpointNotFound as exc:
        raise not_found(exc) from exc
    log.warning("checkpoint shard invalid: job=%d step=%d rank=%d by=%s reason=%s; plan now step=%s", job_id, step,
                rank, who.actor, body.reason[:200], plan.step)
    return plan


@router.get("/recovery-plan", response_model=RecoveryPlan, dependencies=[Depends(allow(READ))])
def recovery_plan(job_id: IdPath, sessions: Sessions, live: Live) -> RecoveryPlan:
    with sessions() as session:
        plan = service.plan_recovery(session, _job(session, job_id))
    return service.with_progress(plan, live.jobs.last_step(plan.job_id))
