"""The serving part of a job's registration, and what `GET /jobs/{id}/serving` answers."""

from __future__ import annotations

from typing import Annotated, Any

from pydantic import BaseModel, ConfigDict, Field

Positive = Annotated[float, Field(gt=0.0, le=3600.0)]


class SloSpec(BaseModel):
    """A serving job's latency SLO (`attributes.slo` on `POST /jobs`): a request meets it when its time to first
    token and its time per output token are both within target (DistServe); `objective` is the share of
    requests that must (its complement is the error budget the burn rates spend)."""

    model_config = ConfigDict(extra="forbid", allow_inf_nan=False)

    ttft_seconds: Positive
    tpot_seconds: Positive
    objective: Annotated[float, Field(gt=0.0, lt=1.0)] = 0.99


class RouterQueue(BaseModel):
    """The requests a serving job's router holds for admission now (`sentinel launch --serve`; said by
    sentinel/launcher/router_queue.py at each change)."""

    model_config = ConfigDict(extra="forbid")

    waiting: Annotated[int, Field(ge=0, le=1_000_000)]
    limit: Annotated[int, Field(ge=1, le=1_000_000)] | None = None  # what the router holds each replica to


class ServingAttributes(BaseModel):
    """The attributes of a job that sentinel/serving reads; any other attribute is the launcher's own."""

    model_config = ConfigDict(extra="allow", allow_inf_nan=False)

    slo: SloSpec | None = None
    model_bytes: Annotated[float, Field(gt=0.0, le=1e15)] | None = None  # weight bytes, for MBU


def check_attributes(attributes: dict[str, Any]) -> dict[str, Any]:
    """Validate the serving keys of a job's attributes (ValueError with the field that is wrong)."""
    ServingAttributes.model_validate(attributes)
    return attributes


class ReplicaServing(BaseModel):
    replica: str
    rank: int
    node: str
    stage: str
    source: str
    last_seen: float
    running: int | None
    waiting: int | None
    kv_cache_usage_ratio: float | None
    batch_limit: int | None
    oldest_inflight_seconds: float | None
    last_token_at: float | None
    signals: dict[str, Any]


class ServingOut(BaseModel):
    """A serving job's request signals over the window, job-wide and per replica (GET /jobs/{id}/serving)."""

    job_id: int
    window_seconds: float
    slo: SloSpec | None
    signals: dict[str, Any]
    burn_rates: dict[str, float | None]  # error-budget burn over 5m, 30m, 1h, 6h (1.0 spends it exactly)
    replicas: list[ReplicaServing]
