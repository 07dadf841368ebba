from __future__ import annotations

from datetime import datetime
from typing import Any

from sqlalchemy import JSON, BigInteger, Boolean, Float, ForeignKey, Integer, String
from sqlalchemy.orm import Mapped, mapped_column

from sentinel.db import Base, UTCDateTime, utcnow

ORDER_KINDS = ("restart", "replace_replica", "adjust")
ORDER_STATES = ("pending", "acknowledged", "done", "failed", "superseded")
REMEDIATION_RESULTS = ("done", "dry_run", "blocked", "skipped", "failed")


class Order(Base):
    """What a launcher must do for a job: restart it with this placement (a new attempt), replace a serving
    replica (drain, start the replacement, stop the old one), or adjust a serving job (`params`: its batch
    limit; no new attempt). The id makes it idempotent."""

    __tablename__ = "orders"

    id: Mapped[str] = mapped_column(String(36), primary_key=True)
    job_id: Mapped[int] = mapped_column(ForeignKey("jobs.id", ondelete="CASCADE"), index=True)
    kind: Mapped[str] = mapped_column(String(32))
    attempt: Mapped[int] = mapped_column(Integer)  # the attempt this order starts
    placement: Mapped[list[dict[str, Any]]] = mapped_column(JSON, default=list)  # [{rank, node, accelerators}]
    params: Mapped[dict[str, Any] | None] = mapped_column(JSON, nullable=True)  # adjust: {"batch_limit": N}
    reason: Mapped[str] = mapped_column(String(512), default="")
    incident_id: Mapped[int | None] = mapped_column(Integer, nullable=True, index=True)
    state: Mapped[str] = mapped_column(String(16), default="pending", index=True)
    escalated: Mapped[bool] = mapped_column(Boolean, default=False)
    created_at: Mapped[datetime] = mapped_column(UTCDateTime, default=utcnow)
    deadline_at: Mapped[datetime] = mapped_column(UTCDateTime, default=utcnow)
    acknowledged_at: Mapped[datetime | None] = mapped_column(UTCDateTime, nullable=True)
    acknowledged_by: Mapped[str] = mapped_column(String(128), default="")
    completed_at: Mapped[datetime | None] = mapped_column(UTCDateTime, nullable=True)
    result: Mapped[str] = mapped_column(String(1024), default="")
    # once the job steps again: fault observed → first step, and the steps it recomputes
    recovery_seconds: Mapped[float | None] = mapped_column(Float, nullable=True)
    lost_steps: Mapped[int | None] = mapped_column(Integer, nullable=True)
    checkpoint_step: Mapped[int | None] = mapped_column(BigInteger, nullable=True)  # the plan it restarts from


class Remediation(Base):
    """One automatic (or dry-run, or blocked) action, for `sentinel_remediations_total` and the record."""

    __tablename__ = "remediations"

    id: Mapped[int] = mapped_column(BigInteger().with_variant(Integer, "sqlite"), primary_key=True)
    incident_id: Mapped[int | None] = mapped_column(Integer, nullable=True, index=True)
    action: Mapped[str] = mapped_column(String(32))
    subject: Mapped[str] = mapped_column(String(256))
    accelerators: Mapped[int] = mapped_column(Integer, default=0)  # how many it takes out of service
    result: Mapped[str] = mapped_column(String(16))
    detail: Mapped[str] = mapped_column(String(1024), default="")
    created_at: Mapped[datetime] = mapped_column(UTCDateTime, default=utcnow, index=True)


class BreakerState(Base):
    """The circuit breaker, one row: open stops every automatic action until a person resets it."""

    __tablename__ = "breaker"

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    open: Mapped[bool] = mapped_column(Boolean, default=False)
    reason: Mapped[str] = mapped_column(String(1024), default="")
    domain: Mapped[str] = mapped_column(String(128), default="")
    incident_id: Mapped[int | None] = mapped_column(Integer, nullable=True)
    opened_at: Mapped[datetime | None] = mapped_column(UTCDateTime, nullable=True)
    reset_at: Mapped[datetime | None] = mapped_column(UTCDateTime, nullable=True)
    reset_by: Mapped[str] = mapped_column(String(128), default="")
