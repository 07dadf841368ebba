from __future__ import annotations

from datetime import datetime

from sqlalchemy import Float, Integer, String
from sqlalchemy.orm import Mapped, mapped_column

from sentinel.db import Base, UTCDateTime, utcnow

ROLES = ("viewer", "agent", "launcher", "operator", "admin")


class ApiToken(Base):
    """A bearer token. Only its SHA-256 is stored; the secret is shown once, at creation."""

    __tablename__ = "api_tokens"

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    name: Mapped[str] = mapped_column(String(128))
    role: Mapped[str] = mapped_column(String(16))
    prefix: Mapped[str] = mapped_column(String(16))
    token_hash: Mapped[str] = mapped_column(String(64), unique=True)
    created_at: Mapped[datetime] = mapped_column(UTCDateTime, default=utcnow)
    expires_at: Mapped[datetime | None] = mapped_column(UTCDateTime, nullable=True)
    revoked_at: Mapped[datetime | None] = mapped_column(UTCDateTime, nullable=True)
    # Agent tokens: the node (exact name or fnmatch glob, e.g. `sim-*`) they may act for; unset until the
    # first registration binds it (trust on first use).
    node: Mapped[str | None] = mapped_column(String(256), nullable=True)
    # Requests per second for this token; unset: the server's `rate_limit_per_second`; 0: unlimited.
    rate_limit_per_second: Mapped[float | None] = mapped_column(Float, nullable=True)
