"""Instructions waiting for an agent (fault drills today). They live in memory: a drill lost to a
server restart is simply run again, and nothing else depends on them."""

from __future__ import annotations

import asyncio
import itertools
import threading
from typing import Literal

from sentinel.telemetry.schemas import NodeCommand


class CommandQueue:
    def __init__(self) -> None:
        self._pending: dict[str, list[NodeCommand]] = {}
        self._waiters: dict[str, list[tuple[asyncio.AbstractEventLoop, asyncio.Event]]] = {}
        self._ids = itertools.count(1)
        self._lock = threading.Lock()

    def push(self, node: str, *, kind: Literal["inject", "probe"], accelerator_index: int, fault: str,
             argument: float | None) -> NodeCommand:
        command = NodeCommand(id=f"cmd-{next(self._ids)}", kind=kind, accelerator_index=accelerator_index,
                              fault=fault, argument=argument)
        with self._lock:
            self._pending.setdefault(node, []).append(command)
            waiters = self._waiters.pop(node, [])
        for loop, event in waiters:
            loop.call_soon_threadsafe(event.set)
        return command

    def take(self, node: str) -> list[NodeCommand]:
        with self._lock:
            return self._pending.pop(node, [])

    async def wait(self, node: str, timeout_seconds: float) -> list[NodeCommand]:
        """Long-poll: return at once if something waits, else when something arrives or on timeout."""
        event = asyncio.Event()
        with self._lock:
            if self._pending.get(node):
                return self._pending.pop(node)
            self._waiters.setdefault(node, []).append((asyncio.get_running_loop(), event))
        try:
            await asyncio.wait_for(event.wait(), timeout_seconds)
        except TimeoutError:
            pass
        finally:
            with self._lock:
                waiters = self._waiters.get(node, [])
                self._waiters[node] = [w for w in waiters if w[1] is not event]
        return self.take(node)
