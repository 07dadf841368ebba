from __future__ import annotations

from datetime import datetime
from typing import Any

from sqlalchemy import JSON, BigInteger, Float, Index, Integer, String, Text
from sqlalchemy.orm import Mapped, mapped_column

from sentinel.db import Base, UTCDateTime, utcnow

INCIDENT_STATES = ("open", "acknowledged", "resolved")
SEVERITIES = ("info", "warning", "critical")
LAYERS = ("hardware", "interconnect", "compute", "input_pipeline", "checkpoint_io", "software", "unknown")


class Incident(Base):
    """Something a person may need to know about, deduplicated by fingerprint while it is not resolved.

    The text columns are what reaches the alert, the API and the CLI alike (DESIGN §5).
    """

    __tablename__ = "incidents"
    __table_args__ = (Index("ix_incidents_fingerprint_state", "fingerprint", "state"),)

    id: Mapped[int] = mapped_column(BigInteger().with_variant(Integer, "sqlite"), primary_key=True)
    fingerprint: Mapped[str] = mapped_column(String(255))
    detector: Mapped[str] = mapped_column(String(64), index=True)
    state: Mapped[str] = mapped_column(String(16), default="open", index=True)
    severity: Mapped[str] = mapped_column(String(16), default="warning")
    title: Mapped[str] = mapped_column(String(512))
    layer: Mapped[str] = mapped_column(String(32), default="unknown")
    # subject: any of node, accelerator, job, rank
    node: Mapped[str | None] = mapped_column(String(128), nullable=True, index=True)
    accelerator_uuid: Mapped[str | None] = mapped_column(String(96), nullable=True, index=True)
    job_id: Mapped[int | None] = mapped_column(Integer, nullable=True, index=True)
    rank: Mapped[int | None] = mapped_column(Integer, nullable=True)
    seen: Mapped[str] = mapped_column(Text, default="")
    comparison: Mapped[str] = mapped_column(Text, default="")
    evidence: Mapped[dict[str, Any]] = mapped_column(JSON, default=dict)
    recommended_action: Mapped[str] = mapped_column(String(64), default="record")
    actions: Mapped[list[dict[str, Any]]] = mapped_column(JSON, default=list)
    next_steps: Mapped[list[str]] = mapped_column(JSON, default=list)
    latched: Mapped[bool] = mapped_column(default=False)
    occurrences: Mapped[int] = mapped_column(Integer, default=1)
    observed_at: Mapped[datetime] = mapped_column(UTCDateTime, default=utcnow)
    opened_at: Mapped[datetime] = mapped_column(UTCDateTime, default=utcnow, index=True)
    detection_latency_seconds: Mapped[float | None] = mapped_column(Float, nullable=True)
    last_seen_at: Mapped[datetime] = mapped_column(UTCDateTime, default=utcnow)
    acknowledged_at: Mapped[datetime | None] = mapped_column(UTCDateTime, nullable=True)
    acknowledged_by: Mapped[str] = mapped_column(String(128), default="")
    resolved_at: Mapped[datetime | None] = mapped_column(UTCDateTime, nullable=True)
    resolved_by: Mapped[str] = mapped_column(String(128), default="")
    resolve_reason: Mapped[str] = mapped_column(String(512), default="")
