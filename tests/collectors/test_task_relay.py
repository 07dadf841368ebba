"""Task telemetry relay and exit watching on the node, with real processes."""

from __future__ import annotations

import signal
import struct
import subprocess
import sys
import time
from pathlib import Path

import pytest

from collectors.exits import ExitWatcher, parse_exit
from collectors.jobs import TaskRelay
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


def test_relay_sums_are_the_step_by_step_sums_in_arrival_order():
    """Every figure equals adding each step in the order it came (floating-point sums included, to the bit),
    over batches with missing tokens and exposed times, an end that goes back, and more steps than are kept."""
    import random

    rng = random.Random(7)
    relay, steps = TaskRelay(), []
    start = 1.8e9
    for b in range(12):
        chunk = []
        for _ in range(rng.randint(0 if b == 3 else 1, 200)):
            start += rng.uniform(-0.005, 0.02)  # ends mostly grow; some go back and start no iteration
            chunk.append((len(steps) + len(chunk) + 1, start, rng.uniform(0.001, 0.02), rng.choice([None, 0, 4096]),
                          rng.uniform(0, 0.001), rng.choice([None, rng.uniform(0, 0.001)])))
        relay.add(SdkBatch.model_validate({"job_id": 3, "rank": 0, "pid": 4242, "steps": chunk}))
        steps.extend(chunk)
    (task,) = relay.drain()
    busy = coll = iteration_seconds = 0.0
    exposed: float | None = None
    iterations, tokens, previous = 0, 0, None
    for _i, started, duration, tok, c, e in steps:
        end = started + duration
        if previous is not None and end > previous:
            iterations += 1
            iteration_seconds += end - previous
        previous = end
        busy += duration
        tokens += tok or 0
        coll += c
        if e is not None:
            exposed = (exposed or 0.0) + e
    assert (task.steps, task.last_step, task.tokens, task.iterations) == (len(steps), steps[-1][0], tokens, iterations)
    assert (task.busy_seconds, task.collective_seconds, task.iteration_seconds) == (busy, coll, iteration_seconds)
    assert task.exposed_collective_seconds == exposed
    assert task.first_step_at == steps[0][1] + steps[0][2]
    assert task.step_seconds == [s[2] for s in steps[:1024]]


def test_a_task_that_ended_before_it_was_watched_is_reported_at_once_not_at_the_next_safety_round():
    """Its exit message went by before the pid was watched; a zombie (not yet reaped) is still a process to
    psutil, so the watcher looks at it now rather than every 10 s."""
    seen: list[TaskExit] = []
    watcher = ExitWatcher(seen.append)
    watcher.start()
    ended = subprocess.Popen([sys.executable, "-c", "pass"])
    try:
        deadline = time.monotonic() + 10
        while Path(f"/proc/{ended.pid}/stat").read_text().rpartition(")")[2].split()[0] != "Z":
            assert time.monotonic() < deadline
            time.sleep(0.01)
        started = time.monotonic()
        watcher.watch(ended.pid, job_id=1, rank=5)
        while not seen and time.monotonic() - started < 5:
            time.sleep(0.02)
        assert [(e.pid, e.rank) for e in seen] == [(ended.pid, 5)] and time.monotonic() - started < 3.5
    finally:
        watcher.close()
        ended.wait()


@pytest.mark.parametrize("max_filtered", [200, 0])
def test_other_processes_exits_do_not_wake_the_listener_while_few_pids_are_watched(monkeypatch, max_filtered):
    """The kernel filter passes the watched pids' exits only; past MAX_FILTERED_PIDS it passes every process's."""
    import collectors.exits

    monkeypatch.setattr(collectors.exits, "MAX_FILTERED_PIDS", max_filtered)
    seen: list[TaskExit] = []
    watcher = ExitWatcher(seen.append)
    if watcher.mode != "netlink" or not watcher._filtering:
        watcher.close()
        pytest.skip("the process-events connector or its filter is refused here (needs CAP_NET_ADMIN)")
    watcher.start()
    task = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        watcher.watch(task.pid, job_id=1, rank=0)
        for _ in range(20):
            subprocess.run(["true"], check=True)
        task.kill()
        task.wait()
        deadline = time.monotonic() + 3
        while not seen and time.monotonic() < deadline:
            time.sleep(0.01)
    finally:
        watcher.close()
    assert [(e.pid, e.signal) for e in seen] == [(task.pid, 9)]
    if max_filtered:
        assert watcher.messages_total == 1
    else:
        assert watcher.messages_total >= 21
