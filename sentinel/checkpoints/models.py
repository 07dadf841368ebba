from __future__ import annotations

from datetime import datetime
from typing import Any

from sqlalchemy import JSON, BigInteger, Float, ForeignKey, Integer, String, UniqueConstraint
from sqlalchemy.orm import Mapped, mapped_column

from sentinel.db import Base, UTCDateTime, utcnow

CHECKPOINT_STATES = ("pending", "committed", "retired", "abandoned")
SHARD_STATES = ("ok", "invalid")


class Checkpoint(Base):
    """One step of a job. Committed once every rank's shard of the same attempt is in."""

    __tablename__ = "checkpoints"
    __table_args__ = (UniqueConstraint("job_id", "step", name="uq_checkpoints_job_step"),)

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    job_id: Mapped[int] = mapped_column(ForeignKey("jobs.id", ondelete="CASCADE"), index=True)
    step: Mapped[int] = mapped_column(BigInteger)
    attempt: Mapped[int] = mapped_column(Integer, default=0)  # shards of older attempts no longer count
    state: Mapped[str] = mapped_column(String(16), default="pending", index=True)
    shards_expected: Mapped[int] = mapped_column(Integer)
    created_at: Mapped[datetime] = mapped_column(UTCDateTime, default=utcnow)
    committed_at: Mapped[datetime | None] = mapped_column(UTCDateTime, nullable=True)
    retired_at: Mapped[datetime | None] = mapped_column(UTCDateTime, nullable=True)


class CheckpointShard(Base):
    """One rank's manifest of a step, and where copies of it live (tier, node, uri)."""

    __tablename__ = "checkpoint_shards"
    __table_args__ = (UniqueConstraint("checkpoint_id", "rank", name="uq_checkpoint_shards_rank"),)

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    checkpoint_id: Mapped[int] = mapped_column(ForeignKey("checkpoints.id", ondelete="CASCADE"), index=True)
    rank: Mapped[int] = mapped_column(Integer)
    attempt: Mapped[int] = mapped_column(Integer, default=0)
    manifest_digest: Mapped[str] = mapped_column(String(64))
    bytes_total: Mapped[int] = mapped_column(BigInteger, default=0)
    bytes_written: Mapped[int] = mapped_column(BigInteger, default=0)
    stall_seconds: Mapped[float] = mapped_column(Float, default=0.0)
    write_seconds: Mapped[float] = mapped_column(Float, default=0.0)
    locations: Mapped[list[dict[str, Any]]] = mapped_column(JSON, default=list)
    state: Mapped[str] = mapped_column(String(16), default="ok")
    invalid_reason: Mapped[str] = mapped_column(String(1024), default="")
    created_at: Mapped[datetime] = mapped_column(UTCDateTime, default=utcnow)
