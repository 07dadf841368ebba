from __future__ import annotations

from datetime import datetime
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field


class IncidentAction(BaseModel):
    at: datetime
    text: str


class IncidentOut(BaseModel):
    model_config = ConfigDict(from_attributes=True)

    id: int
    fingerprint: str
    detector: str
    state: Literal["open", "acknowledged", "resolved"]
    severity: Literal["info", "warning", "critical"]
    title: str
    layer: str
    node: str | None
    accelerator_uuid: str | None
    job_id: int | None
    rank: int | None
    seen: str
    comparison: str
    recommended_action: str
    actions: list[IncidentAction]
    next_steps: list[str]
    latched: bool
    occurrences: int
    observed_at: datetime
    opened_at: datetime
    detection_latency_seconds: float | None
    last_seen_at: datetime
    acknowledged_at: datetime | None
    acknowledged_by: str
    resolved_at: datetime | None
    resolved_by: str
    resolve_reason: str


class IncidentList(BaseModel):
    incidents: list[IncidentOut]
    total: int


class IncidentUpdate(BaseModel):
    model_config = ConfigDict(extra="forbid")

    note: str = Field(default="", max_length=1024)
