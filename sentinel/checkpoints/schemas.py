from __future__ import annotations

from datetime import datetime
from typing import Annotated, Literal

from pydantic import BaseModel, ConfigDict, Field

from sentinel.telemetry.schemas import Name

Step = Annotated[int, Field(ge=0, le=2**62)]
Seconds = Annotated[float, Field(ge=0.0, le=10**7)]
Bytes = Annotated[int, Field(ge=0, le=2**62)]


class ShardLocation(BaseModel):
    """Where one copy of a shard lives: the node-local tier of a node, or the persistent tier."""

    model_config = ConfigDict(extra="forbid")

    tier: Literal["local", "persistent"]
    node: Annotated[str, Field(max_length=128)] = ""
    uri: Annotated[str, Field(min_length=1, max_length=1024)]


class CheckpointCreate(BaseModel):
    model_config = ConfigDict(extra="forbid")

    step: Step
    attempt: Annotated[int, Field(ge=0, le=100_000)] = 0


class ShardCreate(BaseModel):
    model_config = ConfigDict(extra="forbid", allow_inf_nan=False)

    manifest_digest: Annotated[str, Field(min_length=8, max_length=64, pattern=r"^[0-9a-f]+$")]
    bytes_total: Bytes = 0
    bytes_written: Bytes = 0
    stall_seconds: Seconds = 0.0
    write_seconds: Seconds = 0.0
    attempt: Annotated[int, Field(ge=0, le=100_000)] = 0
    locations: Annotated[list[ShardLocation], Field(min_length=1, max_length=16)]


class ShardInvalid(BaseModel):
    model_config = ConfigDict(extra="forbid")

    reason: Annotated[str, Field(min_length=1, max_length=1000)]


class ShardOut(BaseModel):
    model_config = ConfigDict(from_attributes=True)

    rank: int
    attempt: int
    manifest_digest: str
    bytes_total: int
    bytes_written: int
    stall_seconds: float
    write_seconds: float
    locations: list[ShardLocation]
    state: str
    invalid_reason: str
    created_at: datetime


class CheckpointOut(BaseModel):
    model_config = ConfigDict(from_attributes=True)

    job_id: int
    step: int
    attempt: int
    state: str
    shards_expected: int
    shards_in: int = 0
    bytes_total: int = 0
    bytes_written: int = 0
    created_at: datetime
    committed_at: datetime | None
    retired_at: datetime | None


class CheckpointDetail(CheckpointOut):
    shards: list[ShardOut] = []


class RetiredStep(BaseModel):
    step: int
    attempt: int


class ShardAccepted(BaseModel):
    """The answer to a shard: whether its step is now committed, and which steps ranks may delete."""

    step: int
    rank: int
    state: str  # the checkpoint's state after this shard
    committed: bool
    retired_steps: list[int]  # retired or abandoned steps whose files ranks may garbage-collect
    retired: list[RetiredStep] = []  # the same, with the attempt whose manifests may go


class PlanShard(BaseModel):
    rank: int
    step: int  # the plan's step; for a serving job, each replica's own newest usable step
    manifest_digest: str
    locations: list[ShardLocation]  # reachable copies, best first


class RecoveryPlan(BaseModel):
    """Where a restart resumes: the newest committed step whose every shard is verified and reachable."""

    job_id: int
    step: int | None
    reason: str
    committed_at: datetime | None = None
    last_step: int | None = None  # how far the job had got, from its telemetry
    steps_to_recompute: int | None = None
    ranks: list[PlanShard] = []
    skipped: list[str] = []  # newer steps that were passed over, and why


class CheckpointPolicy(BaseModel):
    """Checkpoint cost and cadence for `GET /jobs/{id}` and `sentinel jobs`."""

    last_committed_step: int | None
    last_committed_at: datetime | None
    committed: int
    stall_seconds: float | None  # what the loop waits for per save (median of recent steps, slowest rank)
    write_seconds: float | None
    bytes_total: int | None
    bytes_written_total: int
    mtbf_hours: float | None
    failure_basis: str
    interval_recommended_seconds: float | None  # Young/Daly √(2·C·MTBF), or the configured interval policy's
    interval_recommended_steps: int | None
    interval_observed_seconds: float | None
    interval_policy: str = "young-daly"  # which checkpoint interval policy recommended it


Nodes = list[Name]
