from __future__ import annotations

import logging
from typing import Annotated

from fastapi import APIRouter, Depends, HTTPException, Query

from sentinel.auth.deps import LAUNCH, READ, allow
from sentinel.auth.service import Principal
from sentinel.checkpoints.schemas import CheckpointPolicy
from sentinel.db import transaction
from sentinel.deps import IdPath, Live, Offset, Remediation, ServerClock, Sessions, not_found
from sentinel.errors import CONFLICT
from sentinel.jobs import service
from sentinel.jobs.schemas import JobCreate, JobFinish, JobMetrics, JobOut, TaskCreate, TaskOut
from sentinel.remediation import orders
from sentinel.serving.signals import Slo

log = logging.getLogger("sentinel.jobs")
router = APIRouter(prefix="/jobs", tags=["jobs"])


# `GET /jobs/{id}` answers with three domains' data (the job, its tasks, its checkpoint policy): the composite is
# assembled, and its schema declared, here at the edge.
class JobDetail(JobOut):
    tasks: list[TaskOut] = []
    checkpoints: CheckpointPolicy | None = None


@router.post("", response_model=JobOut, status_code=201)
def create_job(spec: JobCreate, sessions: Sessions, live: Live,
               who: Annotated[Principal, Depends(allow(LAUNCH))]) -> JobOut:
    with transaction(sessions) as session:
        job = service.create_job(session, spec, actor=who.actor)
        session.flush()
        out = JobOut.model_validate(job)
    if out.kind == "serving":
        live.serving.set_slo(out.id, Slo.of(out.attributes))
    log.info("job registered: job=%d name=%s kind=%s world_size=%d by=%s", out.id, out.name, out.kind,
             out.world_size, who.actor)
    return out


@router.get("", response_model=list[JobOut], dependencies=[Depends(allow(READ))])
def list_jobs(sessions: Sessions, state: str | None = None, limit: Annotated[int, Query(ge=1, le=1000)] = 100,
              offset: Offset = 0) -> list[JobOut]:
    with sessions() as session:
        return [JobOut.model_validate(j) for j in service.list_jobs(session, state=state, limit=limit, offset=offset)]


@router.get("/{job_id}", response_model=JobDetail, dependencies=[Depends(allow(READ))])
def get_job(job_id: IdPath, sessions: Sessions, remediation: Remediation, clock: ServerClock) -> JobDetail:
    with sessions() as session:
        try:
            job = service.get_job(session, job_id)
        except service.JobNotFound as exc:
            raise not_found(exc) from exc
        health = remediation.recoveries.job_health(session, job, clock.time())
        return JobDetail.model_validate(job).model_copy(update={"tasks": service.job_tasks(session, job_id),
                                                                "checkpoints": health.checkpoints})


@router.get("/{job_id}/metrics", response_model=JobMetrics, dependencies=[Depends(allow(READ))])
def get_job_metrics(job_id: IdPath, sessions: Sessions, remediation: Remediation, clock: ServerClock) -> JobMetrics:
    """The job's four signals over the recent window, job-wide and per rank."""
    with sessions() as session:
        try:
            job = service.get_job(session, job_id)
        except service.JobNotFound as exc:
            raise not_found(exc) from exc
        placement = service.current_placement(session, job_id)
    return remediation.recoveries.job_metrics(job_id, job.created_at, placement, clock.time())


@router.post("/{job_id}/finish", response_model=JobOut)
def finish_job(job_id: IdPath, spec: JobFinish, sessions: Sessions,
               who: Annotated[Principal, Depends(allow(LAUNCH))]) -> JobOut:
    """The job ended as its launcher says: `succeeded` (every rank finished) or `cancelled` (stopped on purpose;
    the exits that follow are recorded as no failure). Its pending orders are superseded. A job that ended
    already keeps its first state (a retried call changes nothing)."""
    try:
        with transaction(sessions) as session:
            job = service.get_job(session, job_id)
            if service.finish_job(session, job, spec.state, spec.reason, actor=who.actor):
                superseded = orders.close_finished(session, job_id, spec.state)
                log.info("job finished: job=%d state=%s by=%s superseded_orders=%d reason=%s", job_id, spec.state,
                         who.actor, superseded, spec.reason or "-")
            out = JobOut.model_validate(job)
    except service.JobNotFound as exc:
        raise not_found(exc) from exc
    return out


@router.post("/{job_id}/tasks", response_model=TaskOut, status_code=201, responses=CONFLICT)
def register_task(job_id: IdPath, spec: TaskCreate, sessions: Sessions, live: Live,
                  who: Annotated[Principal, Depends(allow(LAUNCH))]) -> TaskOut:
    try:
        with transaction(sessions) as session:
            job = service.get_job(session, job_id, lock=True)
            task = service.register_task(session, job, spec, actor=who.actor)
    except service.JobNotFound as exc:
        raise not_found(exc) from exc
    except service.PlacementRejected as exc:
        raise HTTPException(exc.status, str(exc)) from exc
    live.assignments.refresh()
    log.info("task registered: job=%d rank=%d attempt=%d node=%s accelerators=%s pid=%s", job_id, task.rank,
             task.attempt, task.node, ",".join(task.accelerators), task.pid)
    return task
