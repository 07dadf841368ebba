"""Task telemetry relay and exit watching on the node, with real processes."""

from __future__ import annotations

import signal
import struct
import subprocess
import sys
import time

import pytest

from collectors.jobs import ExitWatcher, TaskRelay, parse_exit
from sentinel.telemetry.schemas import SdkBatch, TaskExit


def batch(steps: list[tuple[int, float, int]], pid: int = 4242, rank: int = 0, **extra: object) -> SdkBatch:
    return SdkBatch.model_validate({"job_id": 3, "rank": rank, "pid": pid,
                                    "steps": [[i, 1.8e9, d, 100, c, None] for i, d, c in steps], **extra})


def test_relay_sums_batches_per_task_until_drained():
    relay = TaskRelay()
    relay.add(batch([(1, 0.5, 0)], collectives={"all_reduce": [2, 0.2, 10]}))
    relay.add(batch([(2, 0.25, 0)], collectives={"all_reduce": [1, 0.1, 5]}, memory_peak_bytes=900,
                    model={"flops_per_token": 1e6}))
    relay.add(batch([(1, 1.0, 0)], pid=4343, rank=1, failure={"type": "OOM", "message": "out of memory"}))
    tasks = {t.rank: t for t in relay.drain({4242: 2048})}
    zero, one = tasks[0], tasks[1]
    assert (zero.steps, zero.last_step, zero.tokens, zero.busy_seconds) == (2, 2, 200, 0.75)
    assert zero.step_seconds == [0.5, 0.25]
    assert zero.collectives["all_reduce"].count == 3 and zero.collectives["all_reduce"].bytes == 15
    assert zero.collectives["all_reduce"].seconds == pytest.approx(0.3)
    assert zero.memory_peak_bytes == 900 and zero.device_memory_bytes == 2048
    assert zero.model is not None and zero.model.flops_per_token == 1e6
    assert one.failure is not None and one.failure.type == "OOM"
    assert relay.drain() == []
    relay.add(batch([(3, 0.1, 0)]))
    assert relay.drain()[0].model is not None, "the model is remembered across intervals"


def _exit_message(pid: int, tgid: int, status: int) -> bytes:
    header = struct.pack("IHHII", 16 + 20 + 32, 3, 0, 0, 0) + struct.pack("IIIIHH", 1, 1, 0, 0, 32, 0)
    return header + struct.pack("IIQ", 0x80000000, 0, 0) + struct.pack("iiII", pid, tgid, status, 17)


def test_parse_exit_reads_codes_and_signals():
    assert parse_exit(_exit_message(100, 100, 9)) == (100, None, 9)
    assert parse_exit(_exit_message(100, 100, 3 << 8)) == (100, 3, None)
    assert parse_exit(_exit_message(101, 100, 0)) is None  # a thread, not the process
    assert parse_exit(b"short") is None


@pytest.mark.parametrize("use_netlink", [True, False])
def test_exits_are_seen_with_their_signal_or_code_within_a_second(use_netlink):
    seen: list[TaskExit] = []
    watcher = ExitWatcher(seen.append, poll_seconds=0.1, use_netlink=use_netlink)
    watcher.start()
    killed = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    failing = subprocess.Popen([sys.executable, "-c", "import time, sys; time.sleep(0.5); sys.exit(3)"])
    try:
        watcher.watch(killed.pid, job_id=1, rank=0)
        watcher.watch(failing.pid, job_id=1, rank=1)
        started = time.monotonic()
        killed.send_signal(signal.SIGKILL)
        while len(seen) < 1 and time.monotonic() - started < 1.0:
            time.sleep(0.01)
        assert seen and seen[0].pid == killed.pid and time.monotonic() - started < 1.0
        killed.wait()
        failing.wait()
        deadline = time.monotonic() + 3
        while len(seen) < 2 and time.monotonic() < deadline:
            time.sleep(0.01)
    finally:
        watcher.close()
        killed.kill()
    by_rank = {e.rank: e for e in seen}
    if watcher.mode == "netlink":
        assert (by_rank[0].signal, by_rank[0].exit_code) == (9, None)
        assert (by_rank[1].signal, by_rank[1].exit_code) == (None, 3)
    else:
        assert set(by_rank) == {0, 1}  # polling knows that they ended, not how
