"""Job telemetry on the node: the SDK's batches summed per task for the next report, and the exit
of every watched task process, seen the moment it happens.

Exits come from the kernel's process-events connector (netlink, needs CAP_NET_ADMIN), which gives
the exit code or the killing signal of any process, not only our children. Where it is refused,
a poller notices the process is gone within `poll_seconds`, without a code.
"""

from __future__ import annotations

import ctypes
import errno
import logging
import os
import select
import socket
import struct
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field

import psutil

from collectors.procfs import read_small
from sentinel.telemetry.schemas import (
    CollectiveTotals,
    ExpertLoad,
    SdkBatch,
    TaskExit,
    TaskModel,
    TaskPause,
    TaskTelemetry,
)
from sentinel.telemetry.serving import ServingStats, add_stats

log = logging.getLogger("sentinel.agent.jobs")

MAX_STEP_SECONDS = 1024
NETLINK_CONNECTOR, CN_IDX_PROC, CN_VAL_PROC = 11, 1, 1
PROC_CN_MCAST_LISTEN, PROC_EVENT_EXIT, NLMSG_DONE = 1, 0x80000000, 3
SO_ATTACH_FILTER = 26


@dataclass
class _TaskSums:
    job_id: int
    rank: int
    attempt: int
    pid: int
    steps: int = 0
    last_step: int | None = None
    first_step_at: float | None = None
    step_seconds: list[float] = field(default_factory=list)
    tokens: int = 0
    busy_seconds: float = 0.0
    collective_seconds: float = 0.0
    exposed_seconds: float | None = None
    collectives: dict[str, list[float]] = field(default_factory=dict)
    memory_peak_bytes: int | None = None
    memory_source: str | None = None
    model: TaskModel | None = None
    failure: str | None = None
    failure_message: str = ""
    dropped_batches: int = 0
    pause: TaskPause | None = None  # the latest batch's: a pause that ended in the interval is over
    iterations: int = 0  # step ends after the previous step's end, and the wall time between them
    iteration_seconds: float = 0.0
    phases: dict[str, list[float]] = field(default_factory=dict)
    experts: ExpertLoad | None = None
    serving: ServingStats | None = None


class TaskRelay:
    """Sums SDK batches per task until the agent's next report takes them."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._tasks: dict[tuple[int, int, int], _TaskSums] = {}
        self._models: dict[tuple[int, int], TaskModel] = {}
        self._last_end: dict[tuple[int, int, int], float] = {}  # each task's newest step end, across reports
        self.run_queue = RunQueueMeter()
        self.batches_total = 0

    def add(self, batch: SdkBatch) -> None:
        key = (batch.job_id, batch.rank, batch.pid)
        with self._lock:
            self.batches_total += 1
            t = self._tasks.get(key)
            if t is None:
                t = self._tasks[key] = _TaskSums(batch.job_id, batch.rank, batch.attempt, batch.pid)
            for index, started, duration, tokens, coll, exposed in batch.steps:
                if t.first_step_at is None:
                    t.first_step_at = started + duration
                previous, end = self._last_end.get(key), started + duration
                if previous is not None and end > previous:
                    t.iterations += 1
                    t.iteration_seconds += end - previous
                self._last_end[key] = end
                t.steps += 1
                t.last_step = index
                t.busy_seconds += duration
                t.tokens += tokens or 0
                t.collective_seconds += coll
                if exposed is not None:
                    t.exposed_seconds = (t.exposed_seconds or 0.0) + exposed
                if len(t.step_seconds) < MAX_STEP_SECONDS:
                    t.step_seconds.append(duration)
            for op, (count, seconds, nbytes) in batch.collectives.items():
                sums = t.collectives.setdefault(op, [0, 0.0, 0])
                sums[0] += count
                sums[1] += seconds
                sums[2] += nbytes
            if batch.memory_peak_bytes is not None:
                t.memory_peak_bytes = max(t.memory_peak_bytes or 0, batch.memory_peak_bytes)
                t.memory_source = batch.memory_source
            if batch.model is not None:
                self._models[(batch.job_id, batch.rank)] = batch.model
            t.model = self._models.get((batch.job_id, batch.rank))
            if batch.failure is not None:
                t.failure, t.failure_message = batch.failure.type, batch.failure.message
            t.dropped_batches = max(t.dropped_batches, batch.dropped_batches)
            t.pause = batch.pause
            for name, (seconds, inside) in batch.phases.items():
                sums_ = t.phases.setdefault(name, [0.0, 0.0])
                sums_[0] += seconds
                sums_[1] += inside
            if batch.experts is not None:
                e = t.experts
                t.experts = batch.experts if e is None else ExpertLoad(
                    imbalance=max(e.imbalance, batch.experts.imbalance),
                    routed_tokens=e.routed_tokens + batch.experts.routed_tokens,
                    dropped_tokens=e.dropped_tokens + batch.experts.dropped_tokens)
            if batch.serving is not None:
                t.serving = batch.serving if t.serving is None else add_stats(t.serving, batch.serving)

    def pids(self) -> set[int]:
        with self._lock:
            return {pid for (_, _, pid) in self._tasks}

    def drain(self, device_memory: dict[int, int] | None = None) -> list[TaskTelemetry]:
        """This interval's sums, one per task; `device_memory` is per-pid memory seen by NVML or sim."""
        with self._lock:
            tasks, self._tasks = self._tasks, {}
            self._last_end = {key: at for key, at in self._last_end.items()  # a task quiet this interval keeps it
                              if key in tasks or os.path.exists(f"/proc/{key[2]}")}
        waits = self.run_queue.measure({t.pid for t in tasks.values()})
        out = []
        for t in tasks.values():
            out.append(TaskTelemetry(
                job_id=t.job_id, rank=t.rank, attempt=t.attempt, pid=t.pid, steps=t.steps, last_step=t.last_step,
                first_step_at=t.first_step_at,
                step_seconds=t.step_seconds, tokens=t.tokens, busy_seconds=t.busy_seconds,
                collective_seconds=t.collective_seconds, exposed_collective_seconds=t.exposed_seconds,
                collectives={op: CollectiveTotals(count=int(c), seconds=s, bytes=int(b))
                             for op, (c, s, b) in t.collectives.items()},
                memory_peak_bytes=t.memory_peak_bytes, memory_source=t.memory_source,
                device_memory_bytes=(device_memory or {}).get(t.pid), model=t.model,
                failure={"type": t.failure, "message": t.failure_message} if t.failure else None,  # type: ignore[arg-type]
                dropped_batches=t.dropped_batches, pause=t.pause, iterations=t.iterations,
                iteration_seconds=t.iteration_seconds, phases={n: v[0] for n, v in t.phases.items()},
                phases_in_step_seconds=sum(v[1] for v in t.phases.values()), experts=t.experts,
                cpu_wait_ratio=waits.get(t.pid), serving=t.serving))
        return out


class RunQueueMeter:
    """Of the time a task's main thread was runnable, the share it waited for a CPU, between two readings of
    /proc/<pid>/task/<pid>/schedstat (ns on CPU, ns waiting on a run queue). CPU contention from another
    process shows here; a stopped process, or one blocked on I/O or a collective, does not wait on a run queue.
    The main thread is the one that drives the steps; helper threads (communication, the SDK's sender) wake
    often and briefly, and on a busy core their waits would blur the figure."""

    def __init__(self, proc_root: str = "/proc") -> None:
        self._root = proc_root
        self._last: dict[int, tuple[int, int]] = {}

    def read(self, pid: int) -> tuple[int, int] | None:
        try:
            fields = read_small(f"{self._root}/{pid}/task/{pid}/schedstat").split()
            return int(fields[0]), int(fields[1])
        except (OSError, ValueError, IndexError):
            return None

    def measure(self, pids: set[int]) -> dict[int, float]:
        out: dict[int, float] = {}
        for pid in pids:
            now = self.read(pid)
            before = self._last.get(pid)
            if now is None:
                continue
            self._last[pid] = now
            if before is not None:
                ran, waited = now[0] - before[0], now[1] - before[1]
                if ran >= 0 and waited >= 0 and ran + waited > 0:
                    out[pid] = round(waited / (ran + waited), 4)
        self._last = {pid: v for pid, v in self._last.items() if pid in pids}
        return out


OnExit = Callable[[TaskExit], None]


class ExitWatcher:
    """Reports the end of every watched pid at once, with its exit code or signal where the kernel says."""

    def __init__(self, on_exit: OnExit, *, poll_seconds: float = 0.25, use_netlink: bool = True):
        self._on_exit = on_exit
        self._poll_seconds = poll_seconds
        self._watched: dict[int, tuple[int | None, int | None]] = {}
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._sock: socket.socket | None = self._open_netlink() if use_netlink else None
        self.mode = "netlink" if self._sock is not None else "poll"
        # the listener sleeps in select() on the socket and this pipe: it wakes for an exit or for close(),
        # not on a timeout (a wakeup costs about as much as reading the exit)
        self._wake_r, self._wake_w = os.pipe() if self._sock is not None else (-1, -1)
        self._listening = False
        self._fds_lock = threading.Lock()  # the socket and the pipe are closed once, by whichever ends first

    def watch(self, pid: int, job_id: int | None = None, rank: int | None = None) -> None:
        with self._lock:
            if pid not in self._watched and psutil.pid_exists(pid):
                self._watched[pid] = (job_id, rank)

    def watched(self) -> set[int]:
        with self._lock:
            return set(self._watched)

    def start(self) -> None:
        target = self._listen if self._sock is not None else self._poll
        self._listening = self._sock is not None
        threading.Thread(target=target, name=f"sentinel-agent-exits-{self.mode}", daemon=True).start()
        if self._sock is not None:  # the poller also catches pids that ended before they were watched
            threading.Thread(target=self._poll, name="sentinel-agent-exits-poll", daemon=True).start()

    def close(self) -> None:
        if self._stop.is_set():
            return
        self._stop.set()
        if self._sock is not None:
            with self._fds_lock:
                if self._wake_w >= 0:
                    os.write(self._wake_w, b"x")
            if not self._listening:  # else the listener closes them as it ends
                self._close_netlink()

    def _close_netlink(self) -> None:
        assert self._sock is not None
        with self._fds_lock:
            if self._wake_w < 0:
                return
            self._sock.close()
            os.close(self._wake_r)
            os.close(self._wake_w)
            self._wake_r = self._wake_w = -1

    @staticmethod
    def _open_netlink() -> socket.socket | None:
        try:
            sock = socket.socket(socket.AF_NETLINK, socket.SOCK_DGRAM, NETLINK_CONNECTOR)
            sock.bind((0, CN_IDX_PROC))
            attach_exit_filter(sock)
            op = struct.pack("I", PROC_CN_MCAST_LISTEN)
            cn_msg = struct.pack("IIIIHH", CN_IDX_PROC, CN_VAL_PROC, 0, 0, len(op), 0) + op
            sock.send(struct.pack("IHHII", 16 + len(cn_msg), NLMSG_DONE, 0, 0, os.getpid()) + cn_msg)
            return sock
        except OSError as exc:
            log.info("process-events connector unavailable (%s); task exits are polled, without exit codes", exc)
            return None

    def _listen(self) -> None:
        assert self._sock is not None
        try:
            while not self._stop.is_set():
                ready, _, _ = select.select([self._sock.fileno(), self._wake_r], [], [])
                if self._wake_r in ready:
                    return
                try:
                    data = self._sock.recv(8192)
                except OSError as exc:
                    if exc.errno == errno.ENOBUFS:  # a burst of exits overflowed the socket: events were lost;
                        log.warning("process-events connector overflowed; the poller catches the exits it missed")
                        continue  # keep listening (the 1 s poller finds the ended pids)
                    return
                exit_event = parse_exit(data)
                if exit_event is not None:
                    self._ended(*exit_event)
        finally:
            self._close_netlink()

    def _poll(self) -> None:
        # Beside netlink, a pid is ended here only if it was already gone one round earlier: the
        # connector's message (with the code) normally arrives within microseconds.
        suspects: set[int] = set()
        while not self._stop.wait(self._poll_seconds if self._sock is None else 1.0):
            gone = {pid for pid in self.watched() if _is_zombie(pid) is not False}
            for pid in gone if self._sock is None else gone & suspects:
                self._ended(pid, None, None)
            suspects = gone

    def _ended(self, pid: int, exit_code: int | None, signal: int | None) -> None:
        with self._lock:
            who = self._watched.pop(pid, None)
        if who is None:
            return
        try:
            self._on_exit(TaskExit(job_id=who[0], rank=who[1], pid=pid, exit_code=exit_code, signal=signal,
                                   observed_at=time.time()))
        except Exception:  # the watcher threads must outlive any one report: a dead watcher misses every exit
            log.exception("reporting a task exit failed: pid=%d job=%s rank=%s", pid, who[0], who[1])


def _is_zombie(pid: int) -> bool | None:
    """True for a zombie (ended, not yet reaped), False for a live process, None when gone.

    Reads /proc/<pid>/stat directly: this runs for every watched pid every poll."""
    try:
        stat = read_small(f"/proc/{pid}/stat")
    except OSError:
        return None
    return stat[stat.rfind(b")") + 2:][:1] == b"Z"


def exit_filter() -> bytes:
    """A classic BPF program that passes only what parse_exit keeps: a process's exit (PROC_EVENT_EXIT with
    pid == tgid). The connector sends every fork, exec, uid change and thread exit on the node; dropped in the
    kernel, they never wake the listener (on a busy node, thousands a second). Loads are big-endian: the
    kernel's fields are compared in the byte order they are in."""
    what = int.from_bytes(struct.pack("I", PROC_EVENT_EXIT), "big")
    ld_abs, tax, jeq_k, jeq_x, ret_k = 0x20, 0x07, 0x15, 0x1D, 0x06
    program = [(ld_abs, 0, 0, 36), (jeq_k, 0, 5, what),  # proc_event.what, else drop
               (ld_abs, 0, 0, 56), (tax, 0, 0, 0), (ld_abs, 0, 0, 52),  # X = tgid, A = pid
               (jeq_x, 0, 1, 0), (ret_k, 0, 0, 0xFFFFFFFF), (ret_k, 0, 0, 0)]
    return b"".join(struct.pack("HBBI", *insn) for insn in program)


def attach_exit_filter(sock: socket.socket) -> bool:
    """Attach exit_filter() to `sock`; False (everything still arrives, parse_exit sorts it) where refused."""
    code = ctypes.create_string_buffer(exit_filter())
    fprog = struct.pack("HL", len(code.raw) // 8, ctypes.addressof(code))
    try:
        sock.setsockopt(socket.SOL_SOCKET, SO_ATTACH_FILTER, fprog)
        return True
    except OSError as exc:
        log.info("process-events filter not attached (%s): every process event reaches the listener", exc)
        return False


def parse_exit(data: bytes) -> tuple[int, int | None, int | None] | None:
    """(pid, exit code, signal) from one netlink proc-connector message, if it is a process exit.

    Layout: nlmsghdr (16 bytes), cn_msg (20), proc_event {what u32, cpu u32, timestamp u64,
    exit {pid, tgid, exit_code, exit_signal}}. Only a thread-group leader's exit ends a process.
    """
    if len(data) < 16 + 20 + 16 + 16:
        return None
    what = struct.unpack_from("I", data, 36)[0]
    if what != PROC_EVENT_EXIT:
        return None
    pid, tgid, status, _exit_signal = struct.unpack_from("iiII", data, 52)
    if pid != tgid:
        return None
    if status & 0x7F:
        return pid, None, status & 0x7F
    return pid, (status >> 8) & 0xFF, None
