from __future__ import annotations

from datetime import datetime

from sqlalchemy import BigInteger, ForeignKey, Integer, PrimaryKeyConstraint, SmallInteger
from sqlalchemy.orm import Mapped, mapped_column

from sentinel.db import Base, UTCDateTime


class ReportReceipt(Base):
    """Proof that report (node, seq) was accepted: what makes ingest idempotent across restarts."""

    __tablename__ = "report_receipts"
    __table_args__ = (PrimaryKeyConstraint("node_id", "seq"),)

    node_id: Mapped[int] = mapped_column(ForeignKey("nodes.id", ondelete="CASCADE"))
    seq: Mapped[int] = mapped_column(BigInteger)
    received_at: Mapped[datetime] = mapped_column(UTCDateTime, index=True)
    accelerator_count: Mapped[int] = mapped_column(SmallInteger, default=0)
    event_count: Mapped[int] = mapped_column(Integer, default=0)
