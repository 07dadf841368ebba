from __future__ import annotations

from datetime import datetime
from typing import Any

from sqlalchemy import JSON, ForeignKey, Integer, String, UniqueConstraint
from sqlalchemy.orm import Mapped, mapped_column

from sentinel.db import Base, UTCDateTime, utcnow

JOB_KINDS = ("training", "serving")
JOB_STATES = ("pending", "running", "recovering", "succeeded", "failed", "cancelled")
FINISHED_STATES = frozenset({"succeeded", "cancelled"})  # ended as its launcher said: nothing to remediate
TASK_STATES = ("pending", "running", "exited", "failed", "lost")


class Job(Base):
    __tablename__ = "jobs"

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    name: Mapped[str] = mapped_column(String(128), index=True)
    kind: Mapped[str] = mapped_column(String(16))
    state: Mapped[str] = mapped_column(String(16), default="pending")
    world_size: Mapped[int] = mapped_column(Integer)
    owner: Mapped[str] = mapped_column(String(128), default="")
    attributes: Mapped[dict[str, Any]] = mapped_column(JSON, default=dict)
    created_at: Mapped[datetime] = mapped_column(UTCDateTime, default=utcnow)
    updated_at: Mapped[datetime] = mapped_column(UTCDateTime, default=utcnow)


class Task(Base):
    """One rank of a job, placed on a node's accelerators. A restart makes a new attempt row."""

    __tablename__ = "tasks"
    __table_args__ = (UniqueConstraint("job_id", "rank", "attempt", name="uq_tasks_job_rank_attempt"),)

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    job_id: Mapped[int] = mapped_column(ForeignKey("jobs.id", ondelete="CASCADE"), index=True)
    rank: Mapped[int] = mapped_column(Integer)
    attempt: Mapped[int] = mapped_column(Integer, default=0)
    node_id: Mapped[int] = mapped_column(ForeignKey("nodes.id"), index=True)
    accelerators: Mapped[list[str]] = mapped_column(JSON, default=list)
    pid: Mapped[int | None] = mapped_column(Integer, nullable=True)
    state: Mapped[str] = mapped_column(String(16), default="running")
    exit_code: Mapped[int | None] = mapped_column(Integer, nullable=True)
    exit_signal: Mapped[int | None] = mapped_column(Integer, nullable=True)
    failure_reason: Mapped[str] = mapped_column(String(256), default="", server_default="")
    engine: Mapped[str | None] = mapped_column(String(300), nullable=True)  # its serving engine, KIND@URL#REPLICA
    started_at: Mapped[datetime] = mapped_column(UTCDateTime, default=utcnow)
    ended_at: Mapped[datetime | None] = mapped_column(UTCDateTime, nullable=True)
