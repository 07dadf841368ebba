"""Remediation routes: orders for launchers, placements, manual quarantine and release, the breaker."""

from __future__ import annotations

import logging
from typing import Annotated, Literal

from fastapi import APIRouter, Body, Depends, HTTPException, Query
from sqlalchemy import select
from sqlalchemy.orm import Session, sessionmaker
from starlette.concurrency import run_in_threadpool

from sentinel.accelerators.service import AcceleratorNotFound, get_accelerator, set_health
from sentinel.audit.service import record
from sentinel.auth.deps import LAUNCH, OPERATE, READ, allow
from sentinel.auth.service import Principal
from sentinel.clock import to_datetime
from sentinel.db import transaction
from sentinel.deps import IdPath, IdQuery, IncidentLog, Live, Remediation, ServerClock, Sessions, not_found
from sentinel.errors import CONFLICT
from sentinel.jobs.service import JobNotFound, get_job
from sentinel.nodes.service import agent_urls
from sentinel.remediation import orders, service
from sentinel.remediation.models import Order
from sentinel.remediation.models import Remediation as RemediationRow
from sentinel.remediation.placement import NoCapacity, first_placement
from sentinel.remediation.schemas import (
    BreakerOut,
    BreakerReset,
    HealthChange,
    OrderAck,
    OrderOut,
    PlacementAsk,
    PlacementSlot,
    RemediationOut,
)

log = logging.getLogger("sentinel.remediation")
router = APIRouter(tags=["remediation"])


def _order_out(session: Session, order: Order) -> OrderOut:
    urls = agent_urls(session, {str(p["node"]) for p in order.placement})
    out = OrderOut.model_validate(order)
    return out.model_copy(update={"placement": [s.model_copy(update={"agent_url": urls.get(s.node) or None})
                                                for s in out.placement]})


def _orders(sessions: sessionmaker[Session], job_id: int, state: str) -> list[OrderOut]:
    with sessions() as session:
        try:
            get_job(session, job_id)
        except JobNotFound as exc:
            raise not_found(exc) from exc
        query = select(Order).where(Order.job_id == job_id).order_by(Order.created_at)
        if state == "pending":
            query = query.where(Order.state == "pending")
        return [_order_out(session, o) for o in session.scalars(query)]


@router.get("/jobs/{job_id}/orders", response_model=list[OrderOut], dependencies=[Depends(allow(READ))])
async def job_orders(job_id: IdPath, sessions: Sessions, remediation: Remediation,
                     wait: Annotated[float, Query(ge=0, le=60)] = 0,
                     state: Literal["pending", "all"] = "pending") -> list[OrderOut]:
    """A launcher's orders, oldest first. `wait=30` long-polls: answers as soon as a pending order exists.
    Act on the newest pending one (older ones are superseded) and acknowledge it."""
    found = await run_in_threadpool(_orders, sessions, job_id, state)
    if found or wait <= 0:
        return found
    if await remediation.board.wait(job_id, wait) == "stopped":
        # the server is stopping: "nothing new yet" sends the launcher to poll again (the next server, or this one
        # restarted) — an ordinary end of a long-poll, said in one line
        log.info("orders long-poll ended by the server stopping: job=%d", job_id)
        return []
    return await run_in_threadpool(_orders, sessions, job_id, state)


@router.post("/orders/{order_id}/ack", response_model=OrderOut, responses=CONFLICT)
def ack_order(order_id: str, sessions: Sessions, clock: ServerClock, incidents: IncidentLog, live: Live,
              who: Annotated[Principal, Depends(allow(LAUNCH))],
              body: Annotated[OrderAck | None, Body()] = None) -> OrderOut:
    """`acknowledged` (taken), then `done` (the new attempt is started) or `failed`. Repeating an ack is a
    no-op; an ack never moves an order backwards. A replace_replica done retires the replaced replicas'
    serving signals: the old replica is stopped, and its last reports, still on their way, speak for no one."""
    ack = body or OrderAck()
    with transaction(sessions) as session:
        order = session.get(Order, order_id)
        if order is None:
            raise HTTPException(404, f"order {order_id!r} does not exist")
        try:
            moved = orders.acknowledge(order, status=ack.status, detail=ack.detail, actor=who.actor,
                                       now=to_datetime(clock.time()))
        except orders.OrderSuperseded as exc:
            raise HTTPException(409, str(exc)) from exc
        if moved:
            record(session, actor=who.actor, action=f"order.{ack.status}", subject=f"order/{order_id}",
                   reason=ack.detail, detail={"job": order.job_id, "attempt": order.attempt})
        incident_id = order.incident_id
        out = _order_out(session, order)
        if moved and ack.status == "done" and order.kind == "replace_replica":
            slots = order.placement or []
            marked = [int(s["rank"]) for s in slots if s.get("replace")] or [int(s["rank"]) for s in slots]
            retired = live.serving.replaced(order.job_id, marked, order.created_at.timestamp())
            if retired:
                log.info("replicas retired: job=%d order=%s replicas=%s", order.job_id, order_id, retired)
    log.info("order %s: order=%s job=%d attempt=%d by=%s %s", ack.status, order_id, out.job_id, out.attempt,
             who.actor, ack.detail)
    if incident_id is not None and out.state == ack.status:
        incidents.annotate(incident_id, f"launcher {who.actor}: order {order_id} {ack.status}"
                           + (f" ({ack.detail})" if ack.detail else ""))
    return out


@router.post("/jobs/{job_id}/placement", response_model=list[PlacementSlot], responses=CONFLICT)
def place_job(job_id: IdPath, sessions: Sessions, remediation: Remediation, clock: ServerClock,
              _: Annotated[Principal, Depends(allow(LAUNCH))],
              body: Annotated[PlacementAsk | None, Body()] = None) -> list[PlacementSlot]:
    """A first placement for every rank from the placement policy: healthy, free, same model, one node
    when it fits. Register the tasks (`POST /jobs/{id}/tasks`) once they run."""
    ask = body or PlacementAsk()
    refused = ""
    with transaction(sessions) as session:  # commits the policy's decision record (sentinel/policy/shadow.py)
        try:
            job = get_job(session, job_id)
        except JobNotFound as exc:
            raise not_found(exc) from exc
        try:
            placement = first_placement(
                session, remediation.placement, job, remediation.node_states(),
                accelerators_per_rank=ask.accelerators_per_rank, avoid_nodes=frozenset(ask.avoid_nodes),
                only_nodes=ask.nodes, now=to_datetime(clock.time()))
        except NoCapacity as exc:
            refused, placement = str(exc), {}
        urls = agent_urls(session, {n for n, _ in placement.values()})
    if refused:
        raise HTTPException(409, refused)
    return [PlacementSlot(rank=r, node=n, accelerators=u, agent_url=urls.get(n) or None)
            for r, (n, u) in sorted(placement.items())]


@router.post("/accelerators/{uuid}/quarantine", response_model=list[str])
def quarantine(uuid: str, sessions: Sessions, remediation: Remediation,
               who: Annotated[Principal, Depends(allow(OPERATE))],
               body: Annotated[HealthChange | None, Body()] = None) -> list[str]:
    """Take an accelerator out of service by hand (a person decided: the breaker does not apply) and, by
    default, restart the jobs on it elsewhere. Returns what was done, one line each."""
    change = body or HealthChange()
    with sessions() as session:
        try:
            get_accelerator(session, uuid)
        except AcceleratorNotFound as exc:
            raise not_found(exc) from exc
    if change.move_work:
        lines = remediation.take_out(None, [uuid], drain=None, actor=who.actor, bypass_breaker=True).lines
    else:
        with transaction(sessions) as session:
            changed = set_health(session, get_accelerator(session, uuid), health="quarantined",
                                 reason=change.reason or f"by {who.actor}", actor=who.actor)
        lines = [f"quarantined accelerator {uuid}"] if changed else []
    log.warning("accelerator quarantined by hand: accelerator=%s by=%s reason=%r", uuid, who.actor, change.reason)
    return lines or [f"accelerator {uuid} was already quarantined"]


@router.post("/accelerators/{uuid}/release", response_model=list[str])
def release(uuid: str, sessions: Sessions, incidents: IncidentLog, remediation: Remediation,
            who: Annotated[Principal, Depends(allow(OPERATE))],
            body: Annotated[HealthChange | None, Body()] = None) -> list[str]:
    """Back in service after repair: healthy again, and the latched incidents about it are resolved."""
    change = body or HealthChange()
    reason = change.reason or f"released by {who.actor}"
    try:
        with transaction(sessions) as session:
            changed, latched = service.release_accelerator(session, uuid, reason=reason, actor=who.actor)
    except AcceleratorNotFound as exc:
        raise not_found(exc) from exc
    for incident_id in latched:
        incidents.resolve(incident_id, actor=who.actor, reason=f"accelerator released: {reason}")
    remediation.fleet.mark_cleared(uuid)  # its agent's fault gauges return to 0 with the next ack
    log.info("accelerator released: accelerator=%s by=%s incidents=%s", uuid, who.actor, latched)
    lines = [f"accelerator {uuid} is healthy again" if changed else f"accelerator {uuid} was already healthy"]
    return lines + [f"resolved incident #{i}" for i in latched]


@router.get("/breaker", response_model=BreakerOut, dependencies=[Depends(allow(READ))])
def get_breaker(sessions: Sessions, remediation: Remediation, clock: ServerClock) -> BreakerOut:
    """Open or closed, why it tripped, and how close the last window is to the limit."""
    with transaction(sessions) as session:
        return remediation.breaker.status(session, to_datetime(clock.time()))


@router.post("/breaker/reset", response_model=BreakerOut)
def reset_breaker(sessions: Sessions, remediation: Remediation, clock: ServerClock,
                  who: Annotated[Principal, Depends(allow(OPERATE))],
                  body: Annotated[BreakerReset | None, Body()] = None) -> BreakerOut:
    reason = (body or BreakerReset()).reason
    with transaction(sessions) as session:
        remediation.breaker.reset(session, actor=who.actor, reason=reason, now=to_datetime(clock.time()))
    log.warning("circuit breaker reset: by=%s reason=%r", who.actor, reason)
    with transaction(sessions) as session:
        return remediation.breaker.status(session, to_datetime(clock.time()))


@router.get("/remediations", response_model=list[RemediationOut], dependencies=[Depends(allow(READ))])
def remediations(sessions: Sessions, incident: IdQuery = None,
                 limit: Annotated[int, Query(ge=1, le=1000)] = 100) -> list[RemediationOut]:
    with sessions() as session:
        query = select(RemediationRow).order_by(RemediationRow.id.desc()).limit(limit)
        if incident is not None:
            query = query.where(RemediationRow.incident_id == incident)
        return [RemediationOut.model_validate(r) for r in session.scalars(query)]
