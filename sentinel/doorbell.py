"""Long-polls: coroutines wait on a key (a node, a job) and any thread wakes them. Drills and probes for an
agent (nodes/commands.py) and orders for a launcher (remediation/executors/launcher.py) are delivered so."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Callable, Hashable
from typing import Generic, TypeVar

K = TypeVar("K", bound=Hashable)


class Doorbell(Generic[K]):
    def __init__(self) -> None:
        self._waiters: dict[K, list[tuple[asyncio.AbstractEventLoop, asyncio.Event]]] = {}
        self._lock = threading.Lock()

    def ring(self, key: K) -> int:
        """Wake everyone waiting on `key`; returns how many were."""
        with self._lock:
            waiters = self._waiters.pop(key, [])
        for loop, event in waiters:
            loop.call_soon_threadsafe(event.set)
        return len(waiters)

    async def wait(self, key: K, timeout_seconds: float, ready: Callable[[], bool] = lambda: False) -> None:
        """Until `key` rings or the timeout; at once when `ready()` (checked after the waiter is in place, so a
        ring between the caller's check and this wait is never lost)."""
        event = asyncio.Event()
        with self._lock:
            self._waiters.setdefault(key, []).append((asyncio.get_running_loop(), event))
        try:
            if not ready():
                await asyncio.wait_for(event.wait(), timeout_seconds)
        except TimeoutError:
            pass
        finally:
            with self._lock:
                left = [w for w in self._waiters.get(key, []) if w[1] is not event]
                if left:
                    self._waiters[key] = left
                else:
                    self._waiters.pop(key, None)
