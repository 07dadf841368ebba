from __future__ import annotations

from typing import Annotated, Literal

from fastapi import APIRouter, Depends, Query

from sentinel.accelerators.schemas import AcceleratorOut
from sentinel.accelerators.service import list_accelerators
from sentinel.auth.deps import READ, allow
from sentinel.clock import to_datetime
from sentinel.deps import runtime
from sentinel.runtime import Runtime

router = APIRouter(prefix="/accelerators", tags=["accelerators"])


@router.get("", response_model=list[AcceleratorOut], dependencies=[Depends(allow(READ))])
def get_accelerators(rt: Annotated[Runtime, Depends(runtime)], node: str | None = None,
                     health: Literal["healthy", "suspect", "quarantined"] | None = None,
                     limit: Annotated[int, Query(ge=1, le=10_000)] = 1000,
                     offset: Annotated[int, Query(ge=0)] = 0) -> list[AcceleratorOut]:
    with rt.factory() as session:
        rows = list_accelerators(session, node=node, health=health, limit=limit, offset=offset)
    return [with_latest(rt, AcceleratorOut.model_validate(acc).model_copy(update={"node": name})) for acc, name in rows]


def with_latest(rt: Runtime, out: AcceleratorOut) -> AcceleratorOut:
    latest = rt.samples.latest(out.uuid)
    if latest is None:
        return out
    return out.model_copy(update={"sampled_at": to_datetime(latest[0]), "latest": latest[1]})
