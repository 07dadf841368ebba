"""Orders for launchers: stored in SQL (an order outlives a server restart), announced to long-pollers
in memory, and pushed to a launcher's webhook when its job registered one (signed like alert webhooks:
the body carries `sent_at` under the signature, so a launcher can refuse replays with
`alerting.notifiers.webhook.verify_signature(..., max_age_seconds=...)`)."""

from __future__ import annotations

import asyncio
import hashlib
import hmac
import json
import logging
import threading
import time
import uuid
from datetime import datetime, timedelta
from typing import Any

import httpx
from sqlalchemy import func, select
from sqlalchemy.orm import Session

from sentinel.jobs.models import Job, Task
from sentinel.remediation.models import Order

log = logging.getLogger("sentinel.orders")
SIGNATURE_HEADER = "X-Sentinel-Signature"
TIMESTAMP_HEADER = "X-Sentinel-Timestamp"


def next_attempt(session: Session, job_id: int) -> int:
    tasks = session.scalar(select(func.max(Task.attempt)).where(Task.job_id == job_id))
    orders = session.scalar(select(func.max(Order.attempt)).where(Order.job_id == job_id))
    return max(tasks if tasks is not None else -1, orders if orders is not None else -1) + 1


def latest_attempt(session: Session, job_id: int) -> int | None:
    return session.scalar(select(func.max(Task.attempt)).where(Task.job_id == job_id))


def create_order(session: Session, *, job: Job, kind: str, placement: list[dict[str, Any]], reason: str,
                 incident_id: int | None, now: datetime, ack_seconds: float) -> Order:
    """A new attempt for `job`; pending orders it makes obsolete are superseded (a launcher acts on the
    newest only)."""
    for old in session.scalars(select(Order).where(Order.job_id == job.id, Order.state == "pending")):
        old.state, old.result = "superseded", "a newer order replaced it"
    order = Order(id=str(uuid.uuid4()), job_id=job.id, kind=kind, attempt=next_attempt(session, job.id),
                  placement=placement, reason=reason[:512], incident_id=incident_id, state="pending",
                  created_at=now, deadline_at=now + timedelta(seconds=ack_seconds))
    session.add(order)
    job.state = "recovering"
    job.updated_at = now
    session.flush()
    return order


def sign(secret: str, body: bytes) -> str:
    return "sha256=" + hmac.new(secret.encode(), body, hashlib.sha256).hexdigest()


class OrderBoard:
    """Who is waiting for a job's orders, and the webhook push."""

    def __init__(self) -> None:
        self._waiters: dict[int, list[tuple[asyncio.AbstractEventLoop, asyncio.Event]]] = {}
        self._lock = threading.Lock()

    def announce(self, job_id: int) -> None:
        with self._lock:
            waiters = self._waiters.pop(job_id, [])
        for loop, event in waiters:
            loop.call_soon_threadsafe(event.set)

    async def wait(self, job_id: int, timeout_seconds: float) -> None:
        event = asyncio.Event()
        with self._lock:
            self._waiters.setdefault(job_id, []).append((asyncio.get_running_loop(), event))
        try:
            await asyncio.wait_for(event.wait(), timeout_seconds)
        except TimeoutError:
            pass
        finally:
            with self._lock:
                self._waiters[job_id] = [w for w in self._waiters.get(job_id, []) if w[1] is not event]

    @staticmethod
    def push_webhook(url: str, secret: str, order: dict[str, Any], timeout: float = 5.0,
                     sent_at: float | None = None) -> str:
        """POST the order to the launcher's webhook; returns '' on 2xx, else what went wrong (no secrets)."""
        stamp = int(time.time() if sent_at is None else sent_at)
        body = json.dumps({"order": order, "sent_at": stamp}, default=str).encode()
        headers = {"Content-Type": "application/json", "Idempotency-Key": str(order["id"]),
                   TIMESTAMP_HEADER: str(stamp)}
        if secret:
            headers[SIGNATURE_HEADER] = sign(secret, body)
        try:
            response = httpx.post(url, content=body, headers=headers, timeout=timeout)
        except httpx.HTTPError as exc:
            return f"webhook unreachable: {type(exc).__name__}"
        return "" if response.is_success else f"webhook answered {response.status_code}"
