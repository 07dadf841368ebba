from __future__ import annotations

from datetime import datetime

from pydantic import BaseModel, ConfigDict, Field, model_validator

from sentinel.alerting.service import MAX_MATCHERS, MAX_SILENCE
from sentinel.telemetry.schemas import IsoDateTime


class Matcher(BaseModel):
    """As in Alertmanager: `value` equals the label (or, with is_regex, fully matches it); is_equal=false negates."""

    model_config = ConfigDict(extra="forbid", from_attributes=True)

    name: str = Field(min_length=1, max_length=128, pattern=r"^[a-zA-Z_][a-zA-Z0-9_]*$")
    value: str = Field(max_length=1024)
    is_regex: bool = False
    is_equal: bool = True


class SilenceCreate(BaseModel):
    """Starts now; ends after `duration_seconds` or at `ends_at` (give exactly one)."""

    model_config = ConfigDict(extra="forbid")

    matchers: list[Matcher] = Field(min_length=1, max_length=MAX_MATCHERS)
    duration_seconds: float | None = Field(default=None, gt=0, le=MAX_SILENCE.total_seconds())
    ends_at: IsoDateTime | None = None
    comment: str = Field(default="", max_length=1024)

    @model_validator(mode="after")
    def _one_end(self) -> SilenceCreate:
        if (self.duration_seconds is None) == (self.ends_at is None):
            raise ValueError("give exactly one of duration_seconds and ends_at")
        return self


class SilenceOut(BaseModel):
    model_config = ConfigDict(from_attributes=True)

    id: int
    matchers: list[Matcher]
    starts_at: datetime
    ends_at: datetime
    created_by: str
    comment: str
    created_at: datetime
    active: bool = False


class DeliveryAttemptOut(BaseModel):
    model_config = ConfigDict(from_attributes=True)

    at: datetime
    status_code: int | None
    error: str
    duration_seconds: float


class NotificationOut(BaseModel):
    model_config = ConfigDict(from_attributes=True)

    id: int
    incident_id: int
    receiver: str
    kind: str
    event: str
    state: str
    attempts: int
    next_attempt_at: datetime
    last_error: str
    silence_id: int | None
    created_at: datetime
    delivered_at: datetime | None
    delivery_attempts: list[DeliveryAttemptOut] = []
