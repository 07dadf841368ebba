from __future__ import annotations

from datetime import datetime
from typing import Annotated, Literal

from pydantic import BaseModel, ConfigDict, Field

from sentinel.telemetry.schemas import Name


class TokenCreate(BaseModel):
    model_config = ConfigDict(extra="forbid")

    name: Name
    role: Literal["viewer", "agent", "launcher", "operator", "admin"]
    expires_at: datetime | None = None


class TokenCreated(BaseModel):
    name: str
    role: str
    token: Annotated[str, Field(description="the secret; shown only this once")]
