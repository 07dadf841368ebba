from __future__ import annotations

from datetime import datetime
from typing import Any

from sqlalchemy import JSON, Integer, String
from sqlalchemy.orm import Mapped, mapped_column

from sentinel.db import Base, UTCDateTime, utcnow


class AuditEntry(Base):
    """Who changed what, and why: every state change a person or Sentinel makes."""

    __tablename__ = "audit_log"

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    at: Mapped[datetime] = mapped_column(UTCDateTime, default=utcnow, index=True)
    actor: Mapped[str] = mapped_column(String(160))
    action: Mapped[str] = mapped_column(String(64))
    subject: Mapped[str] = mapped_column(String(256))
    reason: Mapped[str] = mapped_column(String(1024), default="")
    detail: Mapped[dict[str, Any]] = mapped_column(JSON, default=dict)
