"""The project's own stand-in for a serving engine's fault-tolerance API, in the demo engine (engine.py), in the
shape vLLM 0.32 serves with `--enable-fault-tolerance` (vllm/entrypoints/serve/fault_tolerance/api_router.py,
vllm/v1/engine/core_client.py, vllm/v1/fault_tolerance/engine_core_sentinel.py). Not vLLM: what Sentinel needs
of it to be tested end to end on two CPU cores.

The `engine_core` fault makes the engine behave as a vLLM DP engine whose engine core failed: the requests it
holds are aborted (their streams cut), the scheduler stops, and `GET /fault_tolerance/status` says
`{"schema_version": 1, "total_engines": 1, "engines": [{"id": 0, "status": "unhealthy", "fault_info":
"EngineCoreFault"}]}` until `POST /fault_tolerance/apply {"instruction": ..., "params": {}}` says what to do:
`retry` resumes it (a fault still in the fault file fails it again at once), `scale_down` resumes it with half
its batch limit and the failed part gone (the fault no longer takes). 202 on an instruction it takes, as vLLM
(which then works in the background); one for a core that is not waiting is rejected as vLLM does, in the
status's `ft_error`; an instruction it does not take (`instructions`) or a bad body → 400. Also under `/v1`.
Without `--enable-fault-tolerance` the API answers 404 and the fault exits the process, as vLLM's engine does.
"""

from __future__ import annotations

import threading
import uuid
from typing import Any

STATUS_PATHS = ("/fault_tolerance/status", "/v1/fault_tolerance/status")
APPLY_PATHS = ("/fault_tolerance/apply", "/v1/fault_tolerance/apply")
FAULT_INFO = "EngineCoreFault"


class FaultTolerance:
    def __init__(self, *, enabled: bool = False, rank: int = 0,
                 instructions: tuple[str, ...] = ("retry", "scale_down")) -> None:
        self.enabled, self.rank, self.instructions = enabled, rank, instructions
        self.state = "healthy"
        self.ft_error: str | None = None
        self.scaled_down = False
        self.applied: list[str] = []  # the instructions taken, in order
        self._lock = threading.Lock()
        self._resumed = threading.Event()
        self._resumed.set()

    def takes(self, fault: str | None) -> bool:
        """Does this fault stop the engine core here (not once scaled down: the failed part is gone)?"""
        return fault == "engine_core" and not self.scaled_down

    def fail(self, abort: Any) -> None:
        """The engine core failed: `abort()` its requests, then wait for an instruction (the scheduler's thread)."""
        with self._lock:
            self.state, self.ft_error = "unhealthy", None
            self._resumed.clear()
        abort()
        self._resumed.wait()

    def status(self) -> dict[str, Any]:
        with self._lock:
            engine: dict[str, Any] = {"id": self.rank, "status": self.state}
            if self.state == "unhealthy":
                engine["fault_info"] = FAULT_INFO
            if self.ft_error:
                engine["ft_error"] = self.ft_error
        return {"schema_version": 1, "total_engines": 1, "engines": [engine]}

    def apply(self, body: Any, set_limit: Any) -> tuple[int, dict[str, Any]]:
        """An instruction from the orchestrator: (HTTP status, answer). `set_limit(f)` applies f to the batch limit."""
        if not isinstance(body, dict):
            return 400, {"detail": "Request body must be a JSON object."}
        instruction = body.get("instruction")
        if not instruction:
            return 400, {"detail": "'instruction' is required."}
        if instruction not in self.instructions:
            return 400, {"detail": f"Invalid instruction: '{instruction}'."}
        if not isinstance(body.get("params", {}), dict):
            return 400, {"detail": "'params' must be an object."}
        request_id = str(uuid.uuid4())
        with self._lock:
            if self.state != "unhealthy":
                self.ft_error = f"[FT] Rejecting {instruction} on engine {self.rank}: status is {self.state.upper()}"
            else:
                if instruction == "scale_down":
                    self.scaled_down = True
                    set_limit(lambda limit: max(1, limit // 2))
                self.state, self.ft_error = "healthy", None
                self.applied.append(instruction)
                self._resumed.set()
        return 202, {"message": "Request accepted; poll /fault_tolerance/status for updates.", "request_id": request_id}
