"""Instructions waiting for an agent (fault drills, probes, experiments). They live in memory: a drill lost to a
server restart is simply run again, and nothing else depends on them."""

from __future__ import annotations

import itertools
import threading
from typing import Literal

from sentinel.doorbell import Doorbell
from sentinel.telemetry.schemas import NodeCommand


class CommandQueue:
    def __init__(self) -> None:
        self._pending: dict[str, list[NodeCommand]] = {}
        self._doorbell: Doorbell[str] = Doorbell()
        self._ids = itertools.count(1)
        self._lock = threading.Lock()

    def push(self, node: str, *, kind: Literal["inject", "probe"], accelerator_index: int, fault: str,
             argument: float | None) -> NodeCommand:
        command = NodeCommand(id=f"cmd-{next(self._ids)}", kind=kind, accelerator_index=accelerator_index,
                              fault=fault, argument=argument)
        with self._lock:
            self._pending.setdefault(node, []).append(command)
        self._doorbell.ring(node)
        return command

    def push_experiment(self, node: str, spec: dict[str, object]) -> NodeCommand:
        """An experiment for the node's agent to run (collectors/experiments.py); its result comes in a report."""
        command = NodeCommand(id=f"cmd-{next(self._ids)}", kind="experiment", accelerator_index=0,
                              fault="experiment", spec=dict(spec))
        with self._lock:
            self._pending.setdefault(node, []).append(command)
        self._doorbell.ring(node)
        return command

    def take(self, node: str) -> list[NodeCommand]:
        with self._lock:
            return self._pending.pop(node, [])

    async def wait(self, node: str, timeout_seconds: float) -> list[NodeCommand]:
        """Long-poll: return at once if something waits, else when something arrives or on timeout."""
        await self._doorbell.wait(node, timeout_seconds, ready=lambda: self._waiting(node))
        return self.take(node)

    def _waiting(self, node: str) -> bool:
        with self._lock:
            return bool(self._pending.get(node))
