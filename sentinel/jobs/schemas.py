from __future__ import annotations

from datetime import datetime
from typing import Annotated, Any, Literal

from pydantic import AfterValidator, BaseModel, ConfigDict, Field

from sentinel.serving.schemas import check_attributes
from sentinel.telemetry.schemas import EngineSpec, Name, Uuid


class JobCreate(BaseModel):
    model_config = ConfigDict(extra="forbid", allow_inf_nan=False)

    name: Name
    kind: Literal["training", "serving"] = "training"
    world_size: Annotated[int, Field(ge=1, le=100_000)]
    # `slo` and `model_bytes` are read by sentinel/serving (validated there); the rest is the launcher's own
    attributes: Annotated[dict[Annotated[str, Field(max_length=64)], Any], Field(max_length=64),
                          AfterValidator(check_attributes)] = {}


class TaskCreate(BaseModel):
    model_config = ConfigDict(extra="forbid")

    rank: Annotated[int, Field(ge=0)]
    node: Name
    accelerators: Annotated[list[Uuid], Field(max_length=64)] = []
    pid: Annotated[int, Field(ge=1, le=2**31 - 1)] | None = None
    attempt: Annotated[int, Field(ge=0, le=100_000)] = 0
    # a serving replica's engine, scraped by the node's agent (no --engine needed there): KIND@URL[#REPLICA[:STAGE]]
    engine: EngineSpec | None = None


class JobFinish(BaseModel):
    """How a job ended, as its launcher says: every rank finished (`succeeded`), or it was stopped on purpose
    (`cancelled`: a signal to the launcher, a scheduler's cancel); the exits that follow are no failures."""

    model_config = ConfigDict(extra="forbid")

    state: Literal["succeeded", "cancelled"]
    reason: Annotated[str, Field(max_length=200)] = ""


class TaskOut(BaseModel):
    model_config = ConfigDict(from_attributes=True)

    id: int
    job_id: int
    rank: int
    attempt: int
    node: str
    accelerators: list[str]
    pid: int | None
    state: str
    exit_code: int | None
    exit_signal: int | None = None
    failure_reason: str = ""
    engine: str | None = None
    started_at: datetime
    ended_at: datetime | None


class JobOut(BaseModel):
    model_config = ConfigDict(from_attributes=True)

    id: int
    name: str
    kind: str
    state: str
    world_size: int
    owner: str
    attributes: dict[str, Any]
    created_at: datetime
    updated_at: datetime


class RankMetrics(BaseModel):
    rank: int
    node: str
    last_step: int | None
    step_seconds_p50: float | None
    step_seconds_p95: float | None
    tokens_per_second: float | None
    allreduce_time_ratio: float | None
    allreduce_exposed_ratio: float | None
    memory_peak_bytes: int | None
    memory_capacity_bytes: int | None
    accelerators: list[str]
    flops_per_token: float | None
    accelerators_per_rank: int
    peak_flops_per_accelerator: float | None


class JobMetrics(BaseModel):
    """A job's four signals over the recent window (GET /jobs/{id}/metrics)."""

    job_id: int
    window_seconds: float
    step_seconds_p50: float | None
    step_seconds_p95: float | None
    steps_in_window: int = 0
    step_seconds_sum: float = 0.0
    lost_steps_total: int = 0  # steps recomputed after restarts (the work a restart threw away)
    recovery_seconds_total: float = 0.0  # fault observed → stepping again, summed over recoveries
    goodput_ratio: float | None = None  # 1 − (recovery time + recomputed steps × p50 step) ÷ time since start
    tokens_per_second: float | None
    mfu_ratio: float | None
    allreduce_time_ratio: float | None
    allreduce_exposed_ratio: float | None
    memory_peak_bytes: int | None
    memory_capacity_bytes: int | None
    task_failures: dict[str, int]
    task_failures_total: int
    failures_per_hour: float | None
    ranks: list[RankMetrics]
