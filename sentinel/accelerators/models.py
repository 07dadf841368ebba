from __future__ import annotations

from datetime import datetime

from sqlalchemy import BigInteger, Boolean, Float, ForeignKey, Integer, String
from sqlalchemy.orm import Mapped, mapped_column

from sentinel.db import Base, UTCDateTime, utcnow

HEALTH_STATES = ("healthy", "suspect", "quarantined")


class Accelerator(Base):
    __tablename__ = "accelerators"
    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    uuid: Mapped[str] = mapped_column(String(96), unique=True)
    node_id: Mapped[int] = mapped_column(ForeignKey("nodes.id", ondelete="CASCADE"), index=True)
    index: Mapped[int] = mapped_column(Integer)
    model: Mapped[str] = mapped_column(String(128))
    memory_total_bytes: Mapped[int] = mapped_column(BigInteger, default=0)
    # dense peak FLOP/s its agent measured (sim) — datasheet figures come from sentinel.sdk.flops
    peak_flops: Mapped[float | None] = mapped_column(Float, nullable=True)
    source: Mapped[str] = mapped_column(String(32))
    simulated: Mapped[bool] = mapped_column(Boolean, default=False)
    health: Mapped[str] = mapped_column(String(16), default="healthy")
    health_reason: Mapped[str] = mapped_column(String(512), default="")
    present: Mapped[bool] = mapped_column(Boolean, default=True)
    health_incident_id: Mapped[int | None] = mapped_column(Integer, nullable=True)
    health_changed_at: Mapped[datetime | None] = mapped_column(UTCDateTime, nullable=True)
    registered_at: Mapped[datetime] = mapped_column(UTCDateTime, default=utcnow)
