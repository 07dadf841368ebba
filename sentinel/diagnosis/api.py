"""Diagnosis routes (DESIGN §7): a job's diagnosis, the experiments that test it, its step-time timeline and
its ranks side by side."""

from __future__ import annotations

import logging
import statistics
from typing import Annotated

from fastapi import APIRouter, Depends, HTTPException, Path, Query
from sqlalchemy import select
from sqlalchemy.orm import Session

from sentinel.accelerators.models import Accelerator
from sentinel.auth.deps import OPERATE, READ, allow
from sentinel.auth.service import Principal
from sentinel.deps import IdPath, ServerClock, Sessions, part
from sentinel.diagnosis.components import COMPONENTS
from sentinel.diagnosis.engine import Diagnoser
from sentinel.diagnosis.schemas import (
    DiagnosisOut,
    ExperimentOut,
    ExperimentProposal,
    ExperimentRequest,
    RankRow,
    TimelinePoint,
)
from sentinel.errors import CONFLICT
from sentinel.jobs.models import Job

log = logging.getLogger("sentinel.diagnosis")
router = APIRouter(prefix="/jobs", tags=["diagnosis"])
Diagnosis = Annotated[Diagnoser, Depends(part("diagnosis"))]
ExperimentId = Annotated[str, Path(min_length=1, max_length=64, pattern=r"^exp-[0-9]+$")]


def _job(session: Session, job_id: int) -> Job:
    job = session.get(Job, job_id)
    if job is None:
        raise HTTPException(404, f"job {job_id} not found")
    return job


@router.get("/{job_id}/diagnosis", response_model=DiagnosisOut, dependencies=[Depends(allow(READ))])
def diagnosis(job_id: IdPath, sessions: Sessions, engine: Diagnosis) -> DiagnosisOut:
    """Which layer the job's slowdown comes from: the component, the evidence (before and after, per rank, node
    signals), what was ruled out and the proposed experiment; or that it is healthy, or still learning."""
    with sessions() as session:
        _job(session, job_id)
    found = engine.report(job_id)
    if found is None:
        return DiagnosisOut(job_id=job_id, state="learning",
                            detail="no step telemetry from this job yet (the SDK's step() and data() timings)")
    if found.diagnosis is not None:
        found.diagnosis.experiments = [e for e in engine.book.of_job(job_id)
                                       if not e.calibration and e.created_at >= found.diagnosis.onset_at]
    return found


@router.post("/{job_id}/experiments", response_model=ExperimentOut, status_code=202, responses=CONFLICT)
def run_experiment(job_id: IdPath, body: ExperimentRequest, sessions: Sessions, engine: Diagnosis,
                   clock: ServerClock, who: Annotated[Principal, Depends(allow(OPERATE))]) -> ExperimentOut:
    """Run an experiment for the job: the diagnosis's proposal when the body names no kind. Answers at once
    (202); poll `GET /jobs/{id}/experiments/{experiment}` for the result."""
    with sessions() as session:
        _job(session, job_id)
        current = engine.report(job_id)
        proposal = _proposal(job_id, body, current.diagnosis.proposed_experiment
                             if current is not None and current.diagnosis is not None else None)

        def index_of(uuid: str) -> int | None:
            return session.scalar(select(Accelerator.index).where(Accelerator.uuid == uuid))

        try:
            out = engine.run(job_id, proposal, clock.time(), index_of=index_of)
        except LookupError as exc:
            raise HTTPException(404, str(exc)) from exc
        except ValueError as exc:
            raise HTTPException(422, str(exc)) from exc
    log.info("experiment requested: id=%s job=%d kind=%s node=%s by=%s", out.id, job_id, out.kind, out.node,
             who.actor)
    return out


def _proposal(job_id: int, body: ExperimentRequest, proposed: ExperimentProposal | None) -> ExperimentProposal:
    if body.kind is None:
        if proposed is None:
            raise HTTPException(409, f"job {job_id} has no diagnosis with a proposed experiment: name a kind")
        given = body.model_dump(exclude_none=True)
        return proposed.model_copy(update=given)
    if proposed is not None and proposed.kind == body.kind:
        return proposed.model_copy(update=body.model_dump(exclude_none=True))
    return ExperimentProposal(kind=body.kind, node=body.node, accelerator=body.accelerator, peer=body.peer,
                              rank=body.rank, why="asked for", expect="")


@router.get("/{job_id}/experiments", response_model=list[ExperimentOut], dependencies=[Depends(allow(READ))])
def list_experiments(job_id: IdPath, sessions: Sessions, engine: Diagnosis) -> list[ExperimentOut]:
    """The job's experiments, calibrations included, oldest first."""
    with sessions() as session:
        _job(session, job_id)
    return engine.book.of_job(job_id)


@router.get("/{job_id}/experiments/{experiment_id}", response_model=ExperimentOut,
            dependencies=[Depends(allow(READ))])
def get_experiment(job_id: IdPath, experiment_id: ExperimentId, engine: Diagnosis) -> ExperimentOut:
    found = engine.experiment(experiment_id)
    if found is None or found.job_id != job_id:
        raise HTTPException(404, f"experiment {experiment_id} of job {job_id} not found")
    return found


@router.get("/{job_id}/timeline", response_model=list[TimelinePoint], dependencies=[Depends(allow(READ))])
def timeline(job_id: IdPath, sessions: Sessions, engine: Diagnosis, clock: ServerClock,
             seconds: Annotated[float, Query(gt=0, le=3600)] = 300.0,
             bucket: Annotated[float, Query(ge=1, le=600)] = 10.0) -> list[TimelinePoint]:
    """The job's execution timeline: wall time per step and its components (mean over ranks), per bucket."""
    with sessions() as session:
        _job(session, job_id)
    now = clock.time()
    points = []
    for at, ranks in engine.store.timeline(job_id, now - seconds, now, bucket):
        rows = list(ranks.values())
        points.append(TimelinePoint(at=at, iteration_seconds=round(statistics.fmean(r.iteration for r in rows), 6),
                                    components={c: round(statistics.fmean(r.components[c] for r in rows), 6)
                                                for c in COMPONENTS}))
    return points


@router.get("/{job_id}/ranks", response_model=list[RankRow], dependencies=[Depends(allow(READ))])
def ranks(job_id: IdPath, sessions: Sessions, engine: Diagnosis, clock: ServerClock,
          seconds: Annotated[float, Query(gt=0, le=600)] = 10.0) -> list[RankRow]:
    """The job's ranks side by side over the last `seconds`: each component per step, against its baseline."""
    with sessions() as session:
        _job(session, job_id)
    now = clock.time()
    base = engine.baselines.get(job_id)
    out = []
    for rank, p in sorted(engine.store.profile(job_id, now - seconds, now).items()):
        was = base.profiles.get(rank) if base is not None else None
        out.append(RankRow(rank=rank, node=p.node, iteration_seconds=round(p.iteration, 6),
                           components={c: round(v, 6) for c, v in p.components.items()},
                           baseline={c: round(v, 6) for c, v in was.components.items()} if was else {},
                           cpu_wait_ratio=p.cpu_wait, expert_imbalance=p.imbalance))
    return out
