"""The exit of every watched task process, seen the moment it happens.

Exits come from the kernel's process-events connector (netlink, needs CAP_NET_ADMIN), which gives the exit
code or the killing signal of any process, not only our children; a socket filter passes only the watched
pids' exits. Where netlink is refused, a poller notices the process is gone within `poll_seconds`, without
a code.
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
from collections.abc import Callable, Collection

import psutil

from collectors.procfs import read_small
from sentinel.telemetry.schemas import TaskExit

log = logging.getLogger("sentinel.agent.jobs")

NETLINK_CONNECTOR, CN_IDX_PROC, CN_VAL_PROC = 11, 1, 1
PROC_CN_MCAST_LISTEN, PROC_EVENT_EXIT, NLMSG_DONE = 1, 0x80000000, 3
SO_ATTACH_FILTER = 26
MAX_FILTERED_PIDS = 200  # the filter's jumps are 8-bit: past this, every process's exit reaches the listener
SAFETY_NET_SECONDS = 10.0  # beside netlink, the poller's round when nothing is suspect


OnExit = Callable[[TaskExit], None]


class ExitWatcher:
    """Reports the end of every watched pid at once, with its exit code or signal where the kernel says."""

    def __init__(self, on_exit: OnExit, *, poll_seconds: float = 0.25, use_netlink: bool = True):
        self._on_exit = on_exit
        self._poll_seconds = poll_seconds
        self._watched: dict[int, tuple[int | None, int | None]] = {}
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._sweep = threading.Event()  # beside netlink: wakes the poller now (stop, overflow, an ended pid watched)
        self._netlink_lost = False
        self._sock: socket.socket | None = None
        self._filtering = False  # the kernel passes only the watched pids' exits (exit_filter)
        self._filter_lock = threading.Lock()
        if use_netlink:
            self._sock, self._filtering = self._open_netlink()
        self.mode = "netlink" if self._sock is not None else "poll"
        self.messages_total = 0  # connector messages that woke the listener
        # the listener sleeps in select() on the socket and this pipe: it wakes for an exit or for close(),
        # not on a timeout (a wakeup costs about as much as reading the exit)
        self._wake_r, self._wake_w = os.pipe() if self._sock is not None else (-1, -1)
        self._listening = False
        self._fds_lock = threading.Lock()  # the socket and the pipe are closed once, by whichever ends first

    def watch(self, pid: int, job_id: int | None = None, rank: int | None = None) -> None:
        with self._lock:
            if pid in self._watched or not psutil.pid_exists(pid):
                return
            self._watched[pid] = (job_id, rank)
        if self._sock is None:
            return
        self._filter_watched()
        if _is_zombie(pid) is not False:  # it ended before the filter let its exit through (or before it was
            self._sweep.set()  # watched): its message went by unclaimed, so the poller looks now

    def _filter_watched(self) -> None:
        """Have the kernel pass the exits of the watched pids only: on a busy node every other process's exit
        woke the listener for nothing. Past MAX_FILTERED_PIDS, every process's exit passes."""
        with self._filter_lock:
            if not self._filtering or self._stop.is_set():
                return
            pids = self.watched()
            assert self._sock is not None
            self._filtering = attach_exit_filter(self._sock, pids if len(pids) <= MAX_FILTERED_PIDS else None)

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
        self._sweep.set()
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
    def _open_netlink() -> tuple[socket.socket | None, bool]:
        """The connector's socket (None where refused), and whether the exit filter is attached to it."""
        try:
            sock = socket.socket(socket.AF_NETLINK, socket.SOCK_DGRAM, NETLINK_CONNECTOR)
            # the filter before the bind: once bound, the socket takes the events other listeners already
            # subscribed the node to, and those queued before a filter would reach the listener unfiltered
            filtering = attach_exit_filter(sock, ())  # nothing watched yet
            sock.bind((0, CN_IDX_PROC))
            op = struct.pack("I", PROC_CN_MCAST_LISTEN)
            cn_msg = struct.pack("IIIIHH", CN_IDX_PROC, CN_VAL_PROC, 0, 0, len(op), 0) + op
            sock.send(struct.pack("IHHII", 16 + len(cn_msg), NLMSG_DONE, 0, 0, os.getpid()) + cn_msg)
            return sock, filtering
        except OSError as exc:
            log.info("process-events connector unavailable (%s); task exits are polled, without exit codes", exc)
            return None, False

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
                        self._sweep.set()
                        continue  # keep listening (the poller finds the ended pids)
                    if not self._stop.is_set():
                        log.warning("process-events connector failed (%s); task exits are polled every second", exc)
                        self._netlink_lost = True
                        self._sweep.set()
                    return
                self.messages_total += 1
                exit_event = parse_exit(data)
                if exit_event is not None:
                    self._ended(*exit_event)
        finally:
            self._close_netlink()

    def _poll(self) -> None:
        """Alone, every `poll_seconds`. Beside netlink, which reports each exit with its code within milliseconds,
        a pid is ended here only if it was already gone one round (1 s) earlier, and rounds run only while a pid is
        suspect, when asked (an overflow, a pid that ended before it was watched) and every SAFETY_NET_SECONDS:
        a poll every second cost more than the listener itself."""
        suspects: set[int] = set()
        while not self._stop.is_set():
            if self._sock is None:
                wait = self._poll_seconds
            else:
                wait = 1.0 if suspects or self._netlink_lost else SAFETY_NET_SECONDS
            self._sweep.wait(wait)
            if self._stop.is_set():
                return
            self._sweep.clear()
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


def exit_filter(pids: Collection[int] | None = None) -> bytes:
    """A classic BPF program that passes only what parse_exit keeps: a process's exit (PROC_EVENT_EXIT with
    pid == tgid), and with `pids` only theirs. The connector sends every fork, exec, uid change and thread exit on
    the node; dropped in the kernel, they never wake the listener (on a busy node, thousands a second). Loads are
    big-endian: the kernel's fields are compared in the byte order they are in."""
    def native(value: int) -> int:
        return int.from_bytes(struct.pack("I", value), "big")

    ld_abs, tax, ja, jeq_k, jeq_x, ret_k = 0x20, 0x07, 0x05, 0x15, 0x1D, 0x06
    if pids is None:
        checks = [(ja, 0, 0, 1)]  # any process's exit: on to accept
    else:
        keys = [native(pid) for pid in sorted(pids)]
        checks = [(jeq_k, len(keys) - i, 0, key) for i, key in enumerate(keys)]  # this pid's: on to accept
    n = len(checks)
    program = [(ld_abs, 0, 0, 36), (jeq_k, 0, n + 4, native(PROC_EVENT_EXIT)),  # proc_event.what, else drop
               (ld_abs, 0, 0, 56), (tax, 0, 0, 0), (ld_abs, 0, 0, 52),  # X = tgid, A = pid
               (jeq_x, 0, n, 0),  # a process, not a thread, else drop
               *checks, (ret_k, 0, 0, 0), (ret_k, 0, 0, 0xFFFFFFFF)]  # drop, accept
    return b"".join(struct.pack("HBBI", *insn) for insn in program)


def attach_exit_filter(sock: socket.socket, pids: Collection[int] | None = None) -> bool:
    """Attach exit_filter(pids) to `sock` (replacing the one attached); False (everything still arrives, parse_exit
    sorts it) where refused."""
    code = ctypes.create_string_buffer(exit_filter(pids))
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
