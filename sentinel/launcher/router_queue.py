"""The router's queue, said to the server for the job: the requests `sentinel launch --serve`'s router holds for
admission (sentinel/serving/router.py), which an engine held to its batch limit by the router (vLLM takes none)
never counts in its own `waiting`.

With it goes the limit the router holds its replicas to, where it holds one: the batching controller starts from
it for replicas that report no limit of their own (vLLM).

Said at each change (checked every `interval_seconds`), and every `heartbeat_seconds` while there is a queue or
a limit, so the server (`PUT /jobs/{id}/serving/router`; sentinel/serving/signals.py:ServingView.set_router_waiting)
knows a queue it has not heard of for ROUTER_STALE_SECONDS is gone with its launcher. A server that is away is asked
again at the next check; nothing here stops the router or the launcher.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from typing import Any, Protocol

from sentinel.serving.router import Router

log = logging.getLogger("sentinel.launch")

INTERVAL_SECONDS = 0.5
HEARTBEAT_SECONDS = 10.0  # well within sentinel/serving/signals.py:ROUTER_STALE_SECONDS


class Requester(Protocol):
    def request(self, method: str, path: str, **kwargs: Any) -> Any: ...


class RouterQueueReporter:
    def __init__(self, router: Router, client: Requester, job_id: Callable[[], int], *,
                 interval_seconds: float = INTERVAL_SECONDS, heartbeat_seconds: float = HEARTBEAT_SECONDS,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.router, self.client, self.job_id = router, client, job_id
        self.interval_seconds, self.heartbeat_seconds, self.clock = interval_seconds, heartbeat_seconds, clock
        self.said: tuple[int, int | None] | None = None  # (waiting, limit) as the server last heard (None: nothing)
        self.said_at = 0.0
        self.failures = 0
        self._failing = False
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def report_once(self) -> bool:
        """Say the queue if it changed, or if a queue is due its heartbeat; True when it was said."""
        job_id = self.job_id()
        if not job_id:  # the job is not registered yet
            return False
        with self.router.cond:
            waiting, limit = self.router.waiting, self.router.limit
        now = self.clock()
        due = (waiting or limit is not None) and now - self.said_at >= self.heartbeat_seconds
        if (waiting, limit) == self.said and not due:
            return False
        if self.said is None and waiting == 0 and limit is None:  # the server counts no queue it never heard of
            self.said, self.said_at = (0, None), now
            return False
        try:
            self.client.request("PUT", f"/jobs/{job_id}/serving/router",
                                json={"waiting": waiting, **({} if limit is None else {"limit": limit})})
        except Exception as exc:  # away, a standby, refused: asked again at the next check
            self.failures += 1
            if not self._failing:  # once until it works again: a check runs twice a second
                log.warning("could not tell the server the router's queue (asking again): job=%s waiting=%d "
                            "error=%s", job_id, waiting, exc)
            self._failing = True
            return False
        self.said, self.said_at, self._failing = (waiting, limit), now, False
        return True

    def _run(self) -> None:
        while not self._stop.wait(self.interval_seconds):
            self.report_once()

    def start(self) -> RouterQueueReporter:
        self._thread = threading.Thread(target=self._run, name="sentinel-router-queue", daemon=True)
        self._thread.start()
        return self

    def close(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(5.0)
