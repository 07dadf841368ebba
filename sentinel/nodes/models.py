from __future__ import annotations

from datetime import datetime
from typing import Any

from sqlalchemy import JSON, BigInteger, Float, Integer, String
from sqlalchemy.orm import Mapped, mapped_column

from sentinel.db import Base, UTCDateTime, utcnow

NODE_STATES = ("active", "cordoned", "draining", "down")
ADMIN_STATES = ("active", "cordoned", "draining")


class Node(Base):
    """A machine running an agent. `state` is what people see; `admin_state` is what they asked for,
    so a cordoned node that goes down comes back cordoned."""

    __tablename__ = "nodes"

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    name: Mapped[str] = mapped_column(String(128), unique=True)
    hostname: Mapped[str] = mapped_column(String(255), default="")
    state: Mapped[str] = mapped_column(String(16), default="active")
    admin_state: Mapped[str] = mapped_column(String(16), default="active")
    state_reason: Mapped[str] = mapped_column(String(512), default="")
    interval_seconds: Mapped[float] = mapped_column(Float, default=10.0)
    agent_version: Mapped[str] = mapped_column(String(64), default="")
    sources: Mapped[list[str]] = mapped_column(JSON, default=list)
    labels: Mapped[dict[str, Any]] = mapped_column(JSON, default=dict)
    last_seq: Mapped[int] = mapped_column(BigInteger, default=0)
    last_seen_at: Mapped[datetime | None] = mapped_column(UTCDateTime, nullable=True)
    registered_at: Mapped[datetime] = mapped_column(UTCDateTime, default=utcnow)
    state_changed_at: Mapped[datetime] = mapped_column(UTCDateTime, default=utcnow)
