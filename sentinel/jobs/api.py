from __future__ import annotations

import logging
from typing import Annotated

from fastapi import APIRouter, Depends, HTTPException, Query

from sentinel.auth.deps import LAUNCH, READ, allow
from sentinel.auth.service import Principal
from sentinel.db import transaction
from sentinel.deps import not_found, runtime
from sentinel.jobs import service
from sentinel.jobs.schemas import JobCreate, JobDetail, JobOut, TaskCreate, TaskOut
from sentinel.runtime import Runtime

log = logging.getLogger("sentinel.jobs")
router = APIRouter(prefix="/jobs", tags=["jobs"])
RT = Annotated[Runtime, Depends(runtime)]


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
              offset: Annotated[int, Query(ge=0)] = 0) -> list[JobOut]:
    with rt.factory() as session:
        return [JobOut.model_validate(j) for j in service.list_jobs(session, state=state, limit=limit, offset=offset)]


@router.get("/{job_id}", response_model=JobDetail, dependencies=[Depends(allow(READ))])
def get_job(job_id: int, rt: RT) -> JobDetail:
    with rt.factory() as session:
        try:
            job = service.get_job(session, job_id)
        except service.JobNotFound as exc:
            raise not_found(exc) from exc
        return JobDetail.model_validate(job).model_copy(update={"tasks": service.job_tasks(session, job_id)})


@router.post("/{job_id}/tasks", response_model=TaskOut, status_code=201)
def register_task(job_id: int, spec: TaskCreate, rt: RT,
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
