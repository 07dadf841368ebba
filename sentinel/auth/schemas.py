from __future__ import annotations

from datetime import datetime
from typing import Annotated, Literal

from pydantic import BaseModel, ConfigDict, Field

from sentinel.telemetry.schemas import IsoDateTime, Name

# A node name or an fnmatch glob over node names (`sim-*`, `rack7-node[0-9]`); `*` is any node.
NodeBinding = Annotated[str, Field(min_length=1, max_length=256, pattern=r"^[A-Za-z0-9._:@*?\[\]!-]+$")]


class TokenCreate(BaseModel):
    model_config = ConfigDict(extra="forbid")

    name: Name
    role: Literal["viewer", "agent", "launcher", "operator", "admin"]
    expires_at: IsoDateTime | None = None
    node: Annotated[NodeBinding | None, Field(
        description="agent tokens: the node (name or glob) to act for; unset: bound by its first registration")] = None
    rate_limit_per_second: Annotated[float | None, Field(  # strict: `false` is no rate (lax pydantic made it 0)
        ge=0, strict=True, description="requests per second for this token (0: unlimited); unset: the server's "
        "default")] = None


class TokenCreated(BaseModel):
    id: int
    name: str
    role: str
    node: str | None = None
    token: Annotated[str, Field(description="the secret; shown only this once")]


class TokenOut(BaseModel):
    """A token as listed: never its secret or hash; `prefix` (the secret's first 12 characters) identifies it."""

    model_config = ConfigDict(from_attributes=True)

    id: int
    name: str
    role: str
    node: str | None
    rate_limit_per_second: float | None
    prefix: str
    created_at: datetime
    expires_at: datetime | None
    revoked_at: datetime | None
