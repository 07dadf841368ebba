from __future__ import annotations

from datetime import datetime
from typing import Any

from sqlalchemy import JSON, BigInteger, Float, ForeignKey, Integer, String, Text, UniqueConstraint
from sqlalchemy.orm import Mapped, mapped_column

from sentinel.db import Base, UTCDateTime, utcnow

NOTIFICATION_EVENTS = ("trigger", "acknowledge", "resolve")
NOTIFICATION_STATES = ("pending", "delivered", "failed", "silenced")


class Notification(Base):
    """One message owed to one receiver about one incident: a transactional outbox row.

    Written in the same transaction as the incident change, so a restart neither loses a pending
    message nor re-sends a delivered one. (incident, receiver, event) is unique: one page per event.
    """

    __tablename__ = "notifications"
    __table_args__ = (
        UniqueConstraint("incident_id", "receiver", "event", name="uq_notifications_incident_receiver_event"),
    )

    id: Mapped[int] = mapped_column(BigInteger().with_variant(Integer, "sqlite"), primary_key=True)
    incident_id: Mapped[int] = mapped_column(ForeignKey("incidents.id", ondelete="CASCADE"), index=True)
    receiver: Mapped[str] = mapped_column(String(64))
    kind: Mapped[str] = mapped_column(String(32))
    event: Mapped[str] = mapped_column(String(16))
    state: Mapped[str] = mapped_column(String(16), default="pending", index=True)
    attempts: Mapped[int] = mapped_column(Integer, default=0)
    next_attempt_at: Mapped[datetime] = mapped_column(UTCDateTime, default=utcnow)
    last_error: Mapped[str] = mapped_column(String(1024), default="")
    silence_id: Mapped[int | None] = mapped_column(Integer, nullable=True)
    created_at: Mapped[datetime] = mapped_column(UTCDateTime, default=utcnow)
    delivered_at: Mapped[datetime | None] = mapped_column(UTCDateTime, nullable=True)


class DeliveryAttempt(Base):
    """Each try to deliver a notification, with what the receiver answered."""

    __tablename__ = "delivery_attempts"

    id: Mapped[int] = mapped_column(BigInteger().with_variant(Integer, "sqlite"), primary_key=True)
    notification_id: Mapped[int] = mapped_column(ForeignKey("notifications.id", ondelete="CASCADE"), index=True)
    at: Mapped[datetime] = mapped_column(UTCDateTime, default=utcnow)
    status_code: Mapped[int | None] = mapped_column(Integer, nullable=True)
    error: Mapped[str] = mapped_column(Text, default="")
    duration_seconds: Mapped[float] = mapped_column(Float, default=0.0)


class Silence(Base):
    """Mute notifications whose labels match every matcher, between starts_at and ends_at."""

    __tablename__ = "silences"

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    matchers: Mapped[list[dict[str, Any]]] = mapped_column(JSON, default=list)
    starts_at: Mapped[datetime] = mapped_column(UTCDateTime, default=utcnow)
    ends_at: Mapped[datetime] = mapped_column(UTCDateTime)
    created_by: Mapped[str] = mapped_column(String(128), default="")
    comment: Mapped[str] = mapped_column(String(1024), default="")
    created_at: Mapped[datetime] = mapped_column(UTCDateTime, default=utcnow)
