"""The local executor's attempts run whole or not at all: real processes, one start made to fail."""

from __future__ import annotations

import os
import signal
import sys
from typing import Any

import pytest

from sentinel.launcher.local import LocalProcesses, Process
from sentinel.remediation.executors.base import Action, JobRef

SLEEP = [sys.executable, "-c", "import time; time.sleep(60)"]


class SecondStartFails(LocalProcesses):
    """Test double: the second process of an attempt cannot start (as a full process table would refuse it)."""

    def __init__(self, **kwargs: Any):
        super().__init__(**kwargs)
        self.started: list[Process] = []
        self.fail_from = 10**9

    def _start(self, env: dict[str, str]) -> Process:
        if len(self.started) >= self.fail_from:
            raise OSError(11, "Resource temporarily unavailable")
        proc = super()._start(env)
        self.started.append(proc)
        return proc


def placement(ranks: int) -> list[dict[str, Any]]:
    return [{"rank": r, "node": "node-a", "accelerators": [f"GPU-{r}"]} for r in range(ranks)]


def order(attempt: int) -> Action:
    return Action("order", "node-a", "test", jobs=(JobRef(7, "job"),),
                  order={"id": f"o{attempt}", "job_id": 7, "kind": "restart", "attempt": attempt,
                         "placement": placement(2)})


@pytest.fixture
def local() -> Any:
    executor = SecondStartFails(argv=SLEEP, nproc=2, warm=False)
    executor.job_id = 7
    yield executor
    executor.close()
    for proc in executor.started:  # whatever a failing test left running
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)


def test_an_attempt_that_cannot_start_whole_leaves_no_process_behind(local: SecondStartFails) -> None:
    local.start_attempt(placement(2), 0)
    first = list(local.started)
    local.fail_from = len(local.started) + 1  # of the next attempt, rank 0 starts and rank 1 cannot

    outcome = local.execute(order(1))

    assert not outcome.ok and "not started" in outcome.detail and "o1" in outcome.detail
    assert all(p.wait(timeout=10) is not None for p in local.started)  # the old ranks and the new rank 0: gone
    assert len(local.started) == len(first) + 1
    assert local.ranks == []  # nothing listed as running that is not


def test_the_same_order_again_after_a_failed_start_is_carried_out(local: SecondStartFails) -> None:
    local.start_attempt(placement(2), 0)
    local.fail_from = len(local.started) + 1
    assert not local.execute(order(1)).ok

    local.fail_from = 10**9
    outcome = local.execute(order(1))

    assert outcome.ok, outcome.detail
    assert outcome.detail.startswith("order o1: attempt 1 started")
    assert [r.rank for r in local.ranks] == [0, 1] and all(r.proc.poll() is None for r in local.ranks)
