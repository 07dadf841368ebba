"""One background thread working through a queue: what the incident writer and remediation share.

`put` never blocks the caller (an ingest listener on the event loop); `drain` waits until what was
queued before it is done (tests, shutdown); a failing item is the handler's to log, never the end of
the thread.
"""

from __future__ import annotations

import logging
import queue
import threading
from collections.abc import Callable
from typing import Generic, TypeVar

T = TypeVar("T")
log = logging.getLogger("sentinel.worker")


class QueueWorker(Generic[T]):
    def __init__(self, name: str, handle: Callable[[T], None]):
        self.name = name
        self._handle = handle
        self._queue: queue.SimpleQueue[T | threading.Event | None] = queue.SimpleQueue()
        self._thread: threading.Thread | None = None

    def put(self, item: T) -> None:
        self._queue.put(item)

    def start(self) -> None:
        self._thread = threading.Thread(target=self._run, name=self.name, daemon=True)
        self._thread.start()

    def stop(self, timeout: float = 10.0) -> None:
        if self._thread is not None:
            self._queue.put(None)
            self._thread.join(timeout=timeout)
            self._thread = None

    def drain(self, timeout: float = 10.0) -> bool:
        marker = threading.Event()
        self._queue.put(marker)
        return marker.wait(timeout)

    def _run(self) -> None:
        while True:
            item = self._queue.get()
            if item is None:
                return
            if isinstance(item, threading.Event):
                item.set()
                continue
            try:
                self._handle(item)
            except Exception:
                log.exception("worker item failed: worker=%s", self.name)
