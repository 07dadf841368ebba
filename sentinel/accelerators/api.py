from __future__ import annotations

from typing import Annotated, Literal

from fastapi import APIRouter, Depends, Query

from sentinel.accelerators.schemas import AcceleratorOut, FleetReliability, NodeReliability
from sentinel.auth.deps import READ, allow
from sentinel.clock import to_datetime
from sentinel.deps import Live, Offset, ServerClock, Sessions
from sentinel.nodes.service import fault_rates, list_accelerators

router = APIRouter(prefix="/accelerators", tags=["accelerators"])


@router.get("", response_model=list[AcceleratorOut], dependencies=[Depends(allow(READ))])
def get_accelerators(sessions: Sessions, live: Live, node: str | None = None,
                     health: Literal["healthy", "suspect", "quarantined"] | None = None,
                     limit: Annotated[int, Query(ge=1, le=10_000)] = 1000,
                     offset: Offset = 0) -> list[AcceleratorOut]:
    with sessions() as session:
        rows = list_accelerators(session, node=node, health=health, limit=limit, offset=offset)
    return [live.samples.with_latest(AcceleratorOut.model_validate(acc).model_copy(update={"node": name}))
            for acc, name in rows]


fleet_router = APIRouter(prefix="/fleet", tags=["accelerators"])


def per_thousand(faults: int, days: float) -> float | None:
    return 1000.0 * faults / days if days > 0 else None


@fleet_router.get("/reliability", response_model=FleetReliability, dependencies=[Depends(allow(READ))])
def get_reliability(sessions: Sessions, clock: ServerClock) -> FleetReliability:
    with sessions() as session:
        rows = fault_rates(session, to_datetime(clock.time()))
    nodes = [NodeReliability(node=n, hardware_faults=f, accelerator_days=d,
                             faults_per_1000_accelerator_days=per_thousand(f, d)) for n, f, d in rows]
    faults, days = sum(n.hardware_faults for n in nodes), sum(n.accelerator_days for n in nodes)
    return FleetReliability(hardware_faults=faults, accelerator_days=days,
                            faults_per_1000_accelerator_days=per_thousand(faults, days), nodes=nodes)
