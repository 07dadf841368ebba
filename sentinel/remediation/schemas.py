from __future__ import annotations

from datetime import datetime
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from sentinel.telemetry.schemas import Name


class PlacementSlot(BaseModel):
    rank: int
    node: str
    accelerators: list[str]
    agent_url: str | None = None  # where the rank's SDK reports: the agent on that node
    replace: bool = False  # replace_replica: this replica is the one to replace (the others stay)


class OrderOut(BaseModel):
    model_config = ConfigDict(from_attributes=True)

    id: str
    job_id: int
    kind: Literal["restart", "replace_replica", "adjust"]
    attempt: int
    placement: list[PlacementSlot]
    params: dict[str, Any] | None = None  # adjust: {"batch_limit": N}
    reason: str
    incident_id: int | None
    state: str
    escalated: bool
    created_at: datetime
    deadline_at: datetime
    acknowledged_at: datetime | None
    acknowledged_by: str
    completed_at: datetime | None
    result: str
    recovery_seconds: float | None = None
    lost_steps: int | None = None
    checkpoint_step: int | None = None  # the recovery plan's step when the order was issued (None: from scratch)


class OrderAck(BaseModel):
    model_config = ConfigDict(extra="forbid")

    status: Literal["acknowledged", "done", "failed"] = "acknowledged"
    detail: Annotated[str, Field(max_length=1024)] = ""


class PlacementAsk(BaseModel):
    """A first placement for a job's ranks, from the server's placement policy."""

    model_config = ConfigDict(extra="forbid")

    accelerators_per_rank: Annotated[int, Field(ge=1, le=64)] = 1
    avoid_nodes: Annotated[list[Name], Field(max_length=1000)] = []
    nodes: Annotated[list[Name], Field(max_length=1000)] = []  # only these nodes, e.g. the launcher's own


class HealthChange(BaseModel):
    model_config = ConfigDict(extra="forbid")

    reason: Annotated[str, Field(max_length=512)] = ""
    move_work: bool = True  # quarantine: also restart the jobs on it elsewhere


class BreakerOut(BaseModel):
    open: bool
    reason: str
    domain: str
    incident_id: int | None
    opened_at: datetime | None
    reset_at: datetime | None
    reset_by: str
    taken_in_window: int
    limit: float
    accelerators: int
    window_seconds: float


class BreakerReset(BaseModel):
    model_config = ConfigDict(extra="forbid")

    reason: Annotated[str, Field(max_length=512)] = ""


class RemediationOut(BaseModel):
    model_config = ConfigDict(from_attributes=True)

    id: int
    incident_id: int | None
    action: str
    subject: str
    accelerators: int
    result: str
    detail: str
    created_at: datetime


