"""Long-polls: coroutines wait on a key (a node, a job) and any thread wakes them. Drills and probes for an
agent (nodes/commands.py) and orders for a launcher (remediation/executors/launcher.py) are delivered so.

A server that stops cancels the requests still waiting (uvicorn, past its graceful shutdown). That is an
ordinary end of a long-poll, not an error: the wait ends ("stopped") and the caller answers with what it
has, so the poller hears "nothing new" and asks again (another server, or this one restarted)."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Callable, Hashable
from typing import Generic, Literal, TypeVar

K = TypeVar("K", bound=Hashable)
Wake = Literal["rang", "ready", "timeout", "stopped"]


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

    async def wait(self, key: K, timeout_seconds: float, ready: Callable[[], bool] = lambda: False) -> Wake:
        """Until `key` rings or the timeout; at once when `ready()` (checked after the waiter is in place, so a
        ring between the caller's check and this wait is never lost). "stopped": the request was cancelled
        (the server is stopping); the cancellation is absorbed so the caller can still answer."""
        event = asyncio.Event()
        with self._lock:
            self._waiters.setdefault(key, []).append((asyncio.get_running_loop(), event))
        try:
            if ready():
                return "ready"
            await asyncio.wait_for(event.wait(), timeout_seconds)
            return "rang"
        except TimeoutError:
            return "timeout"
        except asyncio.CancelledError:
            task = asyncio.current_task()
            if task is not None:
                task.uncancel()
            return "stopped"
        finally:
            with self._lock:
                left = [w for w in self._waiters.get(key, []) if w[1] is not event]
                if left:
                    self._waiters[key] = left
                else:
                    self._waiters.pop(key, None)
