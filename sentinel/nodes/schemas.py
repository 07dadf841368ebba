from __future__ import annotations

from datetime import datetime
from typing import Annotated

from pydantic import BaseModel, ConfigDict, Field

from sentinel.accelerators.schemas import AcceleratorOut


class NodeOut(BaseModel):
    model_config = ConfigDict(from_attributes=True)

    id: int
    name: str
    hostname: str
    state: str
    admin_state: str
    state_reason: str
    interval_seconds: float
    agent_version: str
    sources: list[str]
    labels: dict[str, str]
    last_seq: int
    last_seen_at: datetime | None
    registered_at: datetime
    state_changed_at: datetime


class NodeDetail(NodeOut):
    accelerators: list[AcceleratorOut] = []


class RegistrationOut(BaseModel):
    node: NodeDetail
    last_seq: int = Field(description="the highest seq the server holds; the agent continues above it")


class CordonRequest(BaseModel):
    model_config = ConfigDict(extra="forbid")

    reason: Annotated[str, Field(max_length=512)] = ""


class InjectRequest(BaseModel):
    model_config = ConfigDict(extra="forbid", allow_inf_nan=False)

    accelerator_index: Annotated[int, Field(ge=0, le=1023)]
    fault: Annotated[str, Field(pattern=r"^(xid|ecc|thermal|hang|slow|offline|clear)$")]
    argument: Annotated[float, Field(ge=0, le=1e6)] | None = None
