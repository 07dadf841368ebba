"""Remediation routes: orders for launchers, placements, manual quarantine and release, the breaker."""

from __future__ import annotations

import logging
from typing import Annotated, Literal

from fastapi import APIRouter, Body, Depends, HTTPException, Query
from sqlalchemy import select
from starlette.concurrency import run_in_threadpool

from sentinel.accelerators.service import AcceleratorNotFound, get_accelerator, set_health
from sentinel.audit.service import record
from sentinel.auth.deps import LAUNCH, OPERATE, READ, allow
from sentinel.auth.service import Principal
from sentinel.clock import to_datetime
from sentinel.db import transaction
from sentinel.deps import IdPath, IdQuery, not_found, runtime
from sentinel.errors import CONFLICT
from sentinel.incidents.models import Incident
from sentinel.jobs.service import JobNotFound, get_job
from sentinel.nodes.models import Node
from sentinel.remediation.models import Order, Remediation
from sentinel.remediation.placement import Inventory, NoCapacity, PlacementRequest
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
from sentinel.runtime import Runtime

log = logging.getLogger("sentinel.remediation")
router = APIRouter(tags=["remediation"])
RT = Annotated[Runtime, Depends(runtime)]


def _agent_urls(rt: Runtime, nodes: set[str]) -> dict[str, str]:
    with rt.factory() as session:
        return {name: str((labels or {}).get("agent_url", "")) for name, labels in
                session.execute(select(Node.name, Node.labels).where(Node.name.in_(nodes)))}


def _order_out(rt: Runtime, order: Order) -> OrderOut:
    urls = _agent_urls(rt, {str(p["node"]) for p in order.placement})
    out = OrderOut.model_validate(order)
    return out.model_copy(update={"placement": [s.model_copy(update={"agent_url": urls.get(s.node) or None})
                                                for s in out.placement]})


def _orders(rt: Runtime, job_id: int, state: str) -> list[OrderOut]:
    with rt.factory() as session:
        try:
            get_job(session, job_id)
        except JobNotFound as exc:
            raise not_found(exc) from exc
        query = select(Order).where(Order.job_id == job_id).order_by(Order.created_at)
        if state == "pending":
            query = query.where(Order.state == "pending")
        rows = list(session.scalars(query))
    return [_order_out(rt, o) for o in rows]


@router.get("/jobs/{job_id}/orders", response_model=list[OrderOut], dependencies=[Depends(allow(READ))])
async def job_orders(job_id: IdPath, rt: RT, wait: Annotated[float, Query(ge=0, le=60)] = 0,
                     state: Literal["pending", "all"] = "pending") -> list[OrderOut]:
    """A launcher's orders, oldest first. `wait=30` long-polls: answers as soon as a pending order exists.
    Act on the newest pending one (older ones are superseded) and acknowledge it."""
    found = await run_in_threadpool(_orders, rt, job_id, state)
    if found or wait <= 0:
        return found
    await rt.remediation.board.wait(job_id, wait)
    return await run_in_threadpool(_orders, rt, job_id, state)


@router.post("/orders/{order_id}/ack", response_model=OrderOut, responses=CONFLICT)
def ack_order(order_id: str, rt: RT, who: Annotated[Principal, Depends(allow(LAUNCH))],
              body: Annotated[OrderAck | None, Body()] = None) -> OrderOut:
    """`acknowledged` (taken), then `done` (the new attempt is started) or `failed`. Repeating an ack is a
    no-op; an ack never moves an order backwards."""
    ack = body or OrderAck()
    now = to_datetime(rt.clock.time())
    rank = {"pending": 0, "superseded": 0, "acknowledged": 1, "done": 2, "failed": 2}
    with transaction(rt.factory) as session:
        order = session.get(Order, order_id)
        if order is None:
            raise HTTPException(404, f"order {order_id!r} does not exist")
        if order.state == "superseded":
            raise HTTPException(409, f"order {order_id} was superseded by a newer order for job {order.job_id}")
        if rank[ack.status] > rank[order.state]:
            order.state = ack.status
            order.acknowledged_at = order.acknowledged_at or now
            order.acknowledged_by = order.acknowledged_by or who.actor
            order.result = ack.detail or order.result
            record(session, actor=who.actor, action=f"order.{ack.status}", subject=f"order/{order_id}",
                   reason=ack.detail, detail={"job": order.job_id, "attempt": order.attempt})
        incident_id = order.incident_id
        out = _order_out(rt, order)
    log.info("order %s: order=%s job=%d attempt=%d by=%s %s", ack.status, order_id, out.job_id, out.attempt,
             who.actor, ack.detail)
    if incident_id is not None and out.state == ack.status:
        rt.incidents.annotate(incident_id, f"launcher {who.actor}: order {order_id} {ack.status}"
                              + (f" ({ack.detail})" if ack.detail else ""))
    return out


@router.post("/jobs/{job_id}/placement", response_model=list[PlacementSlot], responses=CONFLICT)
def place_job(job_id: IdPath, rt: RT, _: Annotated[Principal, Depends(allow(LAUNCH))],
              body: Annotated[PlacementAsk | None, Body()] = None) -> list[PlacementSlot]:
    """A first placement for every rank from the placement policy: healthy, free, same model, one node
    when it fits. Register the tasks (`POST /jobs/{id}/tasks`) once they run."""
    ask = body or PlacementAsk()
    with rt.factory() as session:
        try:
            job = get_job(session, job_id)
        except JobNotFound as exc:
            raise not_found(exc) from exc
        states = {n.name: n.state for n in rt.fleet.all()}
        if ask.nodes:
            states = {name: (state if name in ask.nodes else "elsewhere") for name, state in states.items()}
        inventory = Inventory.load(session, job_id=job_id, node_states=states)
        request = PlacementRequest(job_id, {r: [] for r in range(job.world_size)}, frozenset(range(job.world_size)),
                                   ask.accelerators_per_rank, frozenset(ask.avoid_nodes))
        try:
            placement = rt.remediation.policy.place(request, inventory)
        except NoCapacity as exc:
            raise HTTPException(409, str(exc)) from exc
    urls = _agent_urls(rt, {n for n, _ in placement.values()})
    return [PlacementSlot(rank=r, node=n, accelerators=u, agent_url=urls.get(n) or None)
            for r, (n, u) in sorted(placement.items())]


@router.post("/accelerators/{uuid}/quarantine", response_model=list[str])
def quarantine(uuid: str, rt: RT, who: Annotated[Principal, Depends(allow(OPERATE))],
               body: Annotated[HealthChange | None, Body()] = None) -> list[str]:
    """Take an accelerator out of service by hand (a person decided: the breaker does not apply) and, by
    default, restart the jobs on it elsewhere. Returns what was done, one line each."""
    change = body or HealthChange()
    with rt.factory() as session:
        try:
            get_accelerator(session, uuid)
        except AcceleratorNotFound as exc:
            raise not_found(exc) from exc
    if change.move_work:
        outcome = rt.remediation.take_out(None, [uuid], drain=None, actor=who.actor, bypass_breaker=True)
        lines = outcome.lines
    else:
        with transaction(rt.factory) as session:
            acc = get_accelerator(session, uuid)
            changed = set_health(session, acc, health="quarantined", reason=change.reason or f"by {who.actor}",
                                 actor=who.actor)
        lines = [f"quarantined accelerator {uuid}"] if changed else []
    log.warning("accelerator quarantined by hand: accelerator=%s by=%s reason=%r", uuid, who.actor, change.reason)
    return lines or [f"accelerator {uuid} was already quarantined"]


@router.post("/accelerators/{uuid}/release", response_model=list[str])
def release(uuid: str, rt: RT, who: Annotated[Principal, Depends(allow(OPERATE))],
            body: Annotated[HealthChange | None, Body()] = None) -> list[str]:
    """Back in service after repair: healthy again, and the latched incidents about it are resolved."""
    change = body or HealthChange()
    reason = change.reason or f"released by {who.actor}"
    with transaction(rt.factory) as session:
        try:
            acc = get_accelerator(session, uuid)
        except AcceleratorNotFound as exc:
            raise not_found(exc) from exc
        changed = set_health(session, acc, health="healthy", reason=reason, actor=who.actor)
        latched = [i for (i,) in session.execute(select(Incident.id).where(
            Incident.accelerator_uuid == uuid, Incident.state != "resolved", Incident.latched.is_(True)))]
    for incident_id in latched:
        rt.incidents.resolve(incident_id, actor=who.actor, reason=f"accelerator released: {reason}")
    log.info("accelerator released: accelerator=%s by=%s incidents=%s", uuid, who.actor, latched)
    lines = [f"accelerator {uuid} is healthy again" if changed else f"accelerator {uuid} was already healthy"]
    return lines + [f"resolved incident #{i}" for i in latched]


def _breaker(rt: Runtime) -> BreakerOut:
    s = rt.settings
    now = to_datetime(rt.clock.time())
    with transaction(rt.factory) as session:
        row = rt.remediation.breaker.state(session)
        taken = rt.remediation.breaker.taken_recently(session, now)
        total = len(Inventory.load(session).slots)
        return BreakerOut(open=row.open, reason=row.reason, domain=row.domain, incident_id=row.incident_id,
                          opened_at=row.opened_at, reset_at=row.reset_at, reset_by=row.reset_by,
                          taken_in_window=taken, limit=max(s.breaker_min_accelerators, s.breaker_share * total),
                          accelerators=total, window_seconds=s.breaker_window_seconds)


@router.get("/breaker", response_model=BreakerOut, dependencies=[Depends(allow(READ))])
def get_breaker(rt: RT) -> BreakerOut:
    """Open or closed, why it tripped, and how close the last window is to the limit."""
    return _breaker(rt)


@router.post("/breaker/reset", response_model=BreakerOut)
def reset_breaker(rt: RT, who: Annotated[Principal, Depends(allow(OPERATE))],
                  body: Annotated[BreakerReset | None, Body()] = None) -> BreakerOut:
    reason = (body or BreakerReset()).reason
    with transaction(rt.factory) as session:
        rt.remediation.breaker.reset(session, actor=who.actor, reason=reason, now=to_datetime(rt.clock.time()))
    log.warning("circuit breaker reset: by=%s reason=%r", who.actor, reason)
    return _breaker(rt)


@router.get("/remediations", response_model=list[RemediationOut], dependencies=[Depends(allow(READ))])
def remediations(rt: RT, incident: IdQuery = None,
                 limit: Annotated[int, Query(ge=1, le=1000)] = 100) -> list[RemediationOut]:
    with rt.factory() as session:
        query = select(Remediation).order_by(Remediation.id.desc()).limit(limit)
        if incident is not None:
            query = query.where(Remediation.incident_id == incident)
        return [RemediationOut.model_validate(r) for r in session.scalars(query)]
