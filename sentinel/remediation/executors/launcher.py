"""The launcher executor: how an order reaches the job's launcher. Always on; it handles `order` actions.

Two channels, both used: launchers long-polling `GET /api/v1/jobs/{id}/orders?wait=` are woken at once
(the board below), and a job that registered `attributes.order_webhook` gets the order POSTed there,
signed like alert webhooks (HMAC-SHA256 of the body under `order_webhook_secret`; the body carries
`sent_at` under the signature, so a launcher refuses replays with
`alerting.notifiers.webhook.verify_signature(..., max_age_seconds=...)`). The push runs on a thread of its
own: a slow webhook never holds up remediation, and a launcher that misses it still long-polls.
"""

from __future__ import annotations

import hashlib
import hmac
import json
import logging
import threading
import time
from collections.abc import Callable
from typing import Any

import httpx

from sentinel.doorbell import Doorbell, Wake
from sentinel.remediation.executors.base import Action, Executor, Outcome, register

log = logging.getLogger("sentinel.remediation")
SIGNATURE_HEADER = "X-Sentinel-Signature"
TIMESTAMP_HEADER = "X-Sentinel-Timestamp"


def sign(secret: str, body: bytes) -> str:
    return "sha256=" + hmac.new(secret.encode(), body, hashlib.sha256).hexdigest()


class OrderBoard:
    """Who is long-polling for a job's orders, woken when one is issued."""

    def __init__(self) -> None:
        self._doorbell: Doorbell[int] = Doorbell()

    def announce(self, job_id: int) -> int:
        """Wake everyone waiting on `job_id`; returns how many were."""
        return self._doorbell.ring(job_id)

    async def wait(self, job_id: int, timeout_seconds: float) -> Wake:
        return await self._doorbell.wait(job_id, timeout_seconds)

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


@register
class LauncherExecutor(Executor):
    name = "launcher"
    handles = frozenset({"order"})

    def __init__(self, options: dict[str, Any] | None = None, *, board: OrderBoard | None = None,
                 secret: Callable[[], str] = lambda: ""):
        super().__init__(options)
        self.board = board or OrderBoard()
        self._secret = secret  # read at each push: the setting may change while the server runs
        self.pushes: list[threading.Thread] = []  # webhook pushes under way (tests wait on them)

    def execute(self, action: Action) -> Outcome:
        if action.kind != "order" or action.order is None or len(action.jobs) != 1:
            return Outcome(False, f"launcher executor cannot {action.kind!r} without exactly one job and its order")
        order, job = action.order, action.jobs[0]
        if order.get("job_id") != job.id:
            return Outcome(False, f"order {order.get('id')} is for job {order.get('job_id')}, not job {job.id}")
        woken = self.board.announce(job.id)
        detail = f"order {order['id']} for job {job.id}: {woken} waiting launcher(s) woken"
        hook = job.attributes.get("order_webhook")
        if hook:
            push = threading.Thread(target=self._push, args=(str(hook), order), daemon=True,
                                    name=f"sentinel-order-webhook-{order['id']}")
            self.pushes = [t for t in self.pushes if t.is_alive()] + [push]
            push.start()
            detail += "; pushing it to the job's webhook"
        return Outcome(True, detail)

    def _push(self, url: str, order: dict[str, Any]) -> None:
        problem = OrderBoard.push_webhook(url, self._secret(), order)
        if problem:
            log.warning("order webhook failed: order=%s job=%s %s (the launcher can still long-poll)", order["id"],
                        order["job_id"], problem)
