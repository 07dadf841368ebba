from __future__ import annotations

from datetime import datetime
from typing import Any

from sqlalchemy import JSON, BigInteger, Boolean, Index, Integer, String
from sqlalchemy.orm import Mapped, mapped_column

from sentinel.db import Base, UTCDateTime, utcnow

DECISION_KINDS = ("placement", "checkpoint_interval")


class PolicyDecision(Base):
    """One decision of a placement or checkpoint-interval policy: what the active policy chose and, in shadow
    mode, what the shadow would have chosen beside it, so an operator can compare before switching. Decisions
    of an active learned policy are kept too (no shadow), for their explanations."""

    __tablename__ = "policy_decisions"
    __table_args__ = (Index("ix_policy_decisions_kind_at", "kind", "at"),)

    id: Mapped[int] = mapped_column(BigInteger().with_variant(Integer, "sqlite"), primary_key=True)
    at: Mapped[datetime] = mapped_column(UTCDateTime, default=utcnow)
    kind: Mapped[str] = mapped_column(String(32))  # placement | checkpoint_interval
    job_id: Mapped[int] = mapped_column(Integer, index=True)
    incident_id: Mapped[int | None] = mapped_column(Integer, nullable=True, index=True)
    active_policy: Mapped[str] = mapped_column(String(64))
    active_choice: Mapped[dict[str, Any]] = mapped_column(JSON, default=dict)
    shadow_policy: Mapped[str] = mapped_column(String(64), default="")  # '' when no shadow ran
    shadow_choice: Mapped[dict[str, Any] | None] = mapped_column(JSON, nullable=True)
    agree: Mapped[bool | None] = mapped_column(Boolean, nullable=True)  # None when no shadow ran
    explanation: Mapped[dict[str, Any]] = mapped_column(JSON, default=dict)  # {"active"|"shadow": why}
