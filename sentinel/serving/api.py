"""Serving routes: a serving job's request signals, job-wide and per replica."""

from __future__ import annotations

from fastapi import APIRouter, Depends, HTTPException

from sentinel.auth.deps import LAUNCH, READ, allow
from sentinel.deps import IdPath, Live, ServerClock, Sessions
from sentinel.jobs import service
from sentinel.jobs.models import Job
from sentinel.live.view import LiveView
from sentinel.serving.schemas import ReplicaServing, RouterQueue, ServingOut, SloSpec
from sentinel.serving.signals import BURN_WINDOWS, burn_rates, summary

router = APIRouter(prefix="/jobs", tags=["serving"])


@router.get("/{job_id}/serving", response_model=ServingOut, dependencies=[Depends(allow(READ))])
def serving(job_id: IdPath, sessions: Sessions, live: Live, clock: ServerClock) -> ServingOut:
    """TTFT, inter-token latency, TPOT, queue and stage quantiles, the KV-transfer share of TTFT, SLO attainment,
    goodput, MBU and the SLO burn rates over the window, for the job and each replica."""
    with sessions() as session:
        job = session.get(Job, job_id)
        if job is None:
            raise HTTPException(404, f"job {job_id} not found")
        placement = service.current_placement(session, job_id)
        model_bytes = (job.attributes or {}).get("model_bytes")
    return build(live, job_id, clock.time(), placement, model_bytes)


@router.put("/{job_id}/serving/router", response_model=RouterQueue, dependencies=[Depends(allow(LAUNCH))])
def router_queue(job_id: IdPath, body: RouterQueue, sessions: Sessions, live: Live,
                 clock: ServerClock) -> RouterQueue:
    """The requests the job's router holds for admission: the batching controller counts them with the
    engines' own queues (an engine the router holds to its limit says none)."""
    with sessions() as session:
        if session.get(Job, job_id) is None:
            raise HTTPException(404, f"job {job_id} not found")
    live.serving.set_router_waiting(job_id, body.waiting, clock.time(), limit=body.limit)
    return body


def build(live: LiveView, job_id: int, now: float, placement: dict[int, list[str]],
          model_bytes: float | None) -> ServingOut:
    view = live.serving
    slo, seconds = view.slo(job_id), view.window_seconds

    def model_of(rank: int) -> str | None:
        uuids = placement.get(rank) or []
        return live.jobs.accelerators.get(uuids[0], (None,))[0] if uuids else None

    replicas = [ReplicaServing(
        replica=r.replica, rank=r.rank, node=r.node, stage=r.stage, source=r.source, last_seen=r.last_seen,
        running=r.running, waiting=r.waiting, kv_cache_usage_ratio=r.kv_cache_usage_ratio, batch_limit=r.batch_limit,
        oldest_inflight_seconds=r.oldest_inflight_seconds, last_token_at=r.last_token_at,
        signals=summary(view.window(job_id, r.replica, now), seconds=seconds, slo=slo, model_bytes=model_bytes,
                        accelerator_model=model_of(r.rank)))
        for r in view.replicas(job_id, now)]
    first_model = next((m for m in (model_of(r.rank) for r in replicas) if m), None)
    return ServingOut(
        job_id=job_id, window_seconds=seconds,
        slo=None if slo is None else SloSpec(ttft_seconds=slo.ttft_seconds, tpot_seconds=slo.tpot_seconds,
                                             objective=slo.objective),
        signals=summary(view.window(job_id, None, now), seconds=seconds, slo=slo, model_bytes=model_bytes,
                        accelerator_model=first_model),
        burn_rates=dict(zip(BURN_WINDOWS, burn_rates(view, job_id, now), strict=True)), replicas=replicas)
