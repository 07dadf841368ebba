from __future__ import annotations

import logging
from datetime import datetime
from typing import Annotated

from fastapi import APIRouter, Depends, HTTPException, Query

from sentinel.auth.deps import LAUNCH, READ, allow
from sentinel.auth.service import Principal
from sentinel.checkpoints.api import checkpoint_policy
from sentinel.checkpoints.schemas import CheckpointPolicy
from sentinel.db import transaction
from sentinel.deps import IdPath, Offset, not_found, runtime
from sentinel.errors import CONFLICT
from sentinel.jobs import service
from sentinel.jobs.schemas import JobCreate, JobMetrics, JobOut, TaskCreate, TaskOut
from sentinel.runtime import Runtime

log = logging.getLogger("sentinel.jobs")
router = APIRouter(prefix="/jobs", tags=["jobs"])
RT = Annotated[Runtime, Depends(runtime)]


class JobDetail(JobOut):
    """`GET /jobs/{id}` answers with three domains' data (the job, its tasks, its checkpoint policy): the
    composite is assembled, and its schema declared, here at the edge."""

    tasks: list[TaskOut] = []
    checkpoints: CheckpointPolicy | None = None


@router.post("", response_model=JobOut, status_code=201)
def create_job(spec: JobCreate, rt: RT, who: Annotated[Principal, Depends(allow(LAUNCH))]) -> JobOut:
    with transaction(rt.factory) as session:
        job = service.create_job(session, spec, actor=who.actor)
        session.flush()
        out = JobOut.model_validate(job)
    log.info("job registered: job=%d name=%s kind=%s world_size=%d by=%s", out.id, out.name, out.kind,
             out.world_size, who.actor)
    return out


@router.get("", response_model=list[JobOut], dependencies=[Depends(allow(READ))])
def list_jobs(rt: RT, state: str | None = None, limit: Annotated[int, Query(ge=1, le=1000)] = 100,
              offset: Offset = 0) -> list[JobOut]:
    with rt.factory() as session:
        return [JobOut.model_validate(j) for j in service.list_jobs(session, state=state, limit=limit, offset=offset)]


@router.get("/{job_id}", response_model=JobDetail, dependencies=[Depends(allow(READ))])
def get_job(job_id: IdPath, rt: RT) -> JobDetail:
    with rt.factory() as session:
        try:
            job = service.get_job(session, job_id)
        except service.JobNotFound as exc:
            raise not_found(exc) from exc
        placement = service.current_placement(session, job_id)
        metrics = job_metrics(rt, job_id, job.created_at, placement)
        policy = checkpoint_policy(rt, session, job, failures_per_hour=metrics.failures_per_hour,
                                   accelerators=sum(len(a) for a in placement.values()) or job.world_size,
                                   step_seconds=metrics.step_seconds_p50)
        return JobDetail.model_validate(job).model_copy(update={"tasks": service.job_tasks(session, job_id),
                                                                "checkpoints": policy})


@router.get("/{job_id}/metrics", response_model=JobMetrics, dependencies=[Depends(allow(READ))])
def get_job_metrics(job_id: IdPath, rt: RT) -> JobMetrics:
    """The job's four signals over the recent window, job-wide and per rank."""
    with rt.factory() as session:
        try:
            job = service.get_job(session, job_id)
        except service.JobNotFound as exc:
            raise not_found(exc) from exc
        placement = service.current_placement(session, job_id)
    return job_metrics(rt, job_id, job.created_at, placement)


def job_metrics(rt: Runtime, job_id: int, created_at: datetime, placement: dict[int, list[str]]) -> JobMetrics:
    hours = max(1e-9, (rt.clock.time() - created_at.timestamp()) / 3600.0)
    summary = rt.jobs.summary(job_id, accelerators_by_rank=placement, hours_running=hours)
    if summary is None:
        return JobMetrics(job_id=job_id, window_seconds=rt.jobs.window_seconds, step_seconds_p50=None,
                          step_seconds_p95=None, tokens_per_second=None, mfu_ratio=None, allreduce_time_ratio=None,
                          allreduce_exposed_ratio=None, memory_peak_bytes=None, memory_capacity_bytes=None,
                          task_failures={}, task_failures_total=0, failures_per_hour=None, ranks=[])
    recovery = rt.remediation.recovery_total.get(job_id, 0.0)
    running = rt.clock.time() - created_at.timestamp()
    wasted = recovery + summary.lost_steps_total * (summary.step_seconds_p50 or 0.0)
    goodput = max(0.0, 1.0 - wasted / running) if running > 0 and summary.step_seconds_p50 is not None else None
    return summary.model_copy(update={"recovery_seconds_total": recovery, "goodput_ratio": goodput})


@router.post("/{job_id}/tasks", response_model=TaskOut, status_code=201, responses=CONFLICT)
def register_task(job_id: IdPath, spec: TaskCreate, rt: RT,
                  who: Annotated[Principal, Depends(allow(LAUNCH))]) -> TaskOut:
    try:
        with transaction(rt.factory) as session:
            job = service.get_job(session, job_id)
            task = service.register_task(session, job, spec, actor=who.actor)
    except service.JobNotFound as exc:
        raise not_found(exc) from exc
    except service.PlacementRejected as exc:
        raise HTTPException(exc.status, str(exc)) from exc
    rt.refresh_assignments()
    log.info("task registered: job=%d rank=%d attempt=%d node=%s accelerators=%s pid=%s", job_id, task.rank,
             task.attempt, task.node, ",".join(task.accelerators), task.pid)
    return task
