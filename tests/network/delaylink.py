"""A userspace delay line between two TUN devices living in two network namespaces.

The kernel here has no ``netem`` qdisc, so a slow or lossy path cannot be made with ``tc``. Instead each
of the two namespaces gets a TUN device with a /32 route to the other host's real address; every IP
packet the kernel routes there surfaces on a file descriptor in this process, is held for
``delay_seconds`` in a time-ordered heap (or dropped with probability ``loss_ratio``, from a seeded
``random.Random``) and is then written, unchanged, into the other namespace's TUN device. Addresses stay
the real ``eth0`` ones, so UDP and TCP still work, just slower.

Entering a namespace (``setns(2)`` through ctypes: Python 3.11 has no ``os.setns``) changes only the
calling thread, so :func:`open_tun` does it on a dedicated short-lived thread; the caller never leaves
the root namespace. The opened descriptor stays valid for the whole process after that thread ends.
"""

from __future__ import annotations

import contextlib
import ctypes
import fcntl
import heapq
import itertools
import os
import random
import select
import struct
import threading
import time

CLONE_NEWNET = 0x40000000
TUNSETIFF = 0x400454CA
IFF_TUN = 0x0001
IFF_NO_PI = 0x1000
_LIBC = ctypes.CDLL(None, use_errno=True)


def _attach_in_namespace(netns: str, tun: str) -> int:
    """Enter ``netns`` (this thread only) and attach to its TUN device ``tun``; return the fd."""
    ns_fd = os.open(f"/var/run/netns/{netns}", os.O_RDONLY)
    try:
        if _LIBC.setns(ns_fd, CLONE_NEWNET) != 0:
            err = ctypes.get_errno()
            raise OSError(err, f"setns({netns}): {os.strerror(err)}")
    finally:
        os.close(ns_fd)
    fd = os.open("/dev/net/tun", os.O_RDWR)
    try:
        fcntl.ioctl(fd, TUNSETIFF, struct.pack("16sH22x", tun.encode(), IFF_TUN | IFF_NO_PI))
    except OSError:
        os.close(fd)
        raise
    os.set_blocking(fd, False)
    return fd


def open_tun(netns: str, tun: str) -> int:
    """The fd of TUN device ``tun`` in namespace ``netns``, opened on a throwaway thread."""
    result: dict[str, object] = {}

    def work() -> None:
        try:
            result["fd"] = _attach_in_namespace(netns, tun)
        except BaseException as exc:  # re-raised on the calling thread
            result["error"] = exc

    thread = threading.Thread(target=work, name=f"netlab-setns-{netns}", daemon=True)
    thread.start()
    thread.join()
    if "error" in result:
        raise result["error"]  # type: ignore[misc]
    return int(result["fd"])  # type: ignore[call-overload]


class DelayLink:
    """Copies IPv4 packets between two TUN fds after ``delay`` seconds, dropping ``loss`` of them."""

    @staticmethod
    def check(delay: float, loss: float) -> None:
        if delay < 0 or not 0.0 <= loss <= 1.0:
            raise ValueError(f"delay {delay} must be >= 0 and loss {loss} in [0, 1]")

    def __init__(self, fd_a: int, fd_b: int, delay: float, loss: float = 0.0, seed: int = 0) -> None:
        self.check(delay, loss)
        self.fds = (fd_a, fd_b)
        self.delay, self.loss = delay, loss
        self.rng = random.Random(seed)
        self.forwarded = self.dropped = 0
        self._heap: list[tuple[float, int, int, bytes]] = []
        self._seq = itertools.count()
        self._wake_r, self._wake_w = os.pipe()
        self._stopping = False
        self._thread = threading.Thread(target=self._loop, name="netlab-delaylink", daemon=True)

    def start(self) -> DelayLink:
        self._thread.start()
        return self

    def _read_all(self, fd: int, now: float) -> None:
        out = self.fds[1] if fd == self.fds[0] else self.fds[0]
        while True:
            try:
                packet = os.read(fd, 65536)
            except (BlockingIOError, InterruptedError):
                return
            except OSError:
                return
            if not packet or packet[0] >> 4 != 4:
                continue  # IPv4 only: ignore the IPv6 chatter a fresh link emits
            if self.loss and self.rng.random() < self.loss:
                self.dropped += 1
                continue
            heapq.heappush(self._heap, (now + self.delay, next(self._seq), out, packet))

    def _flush_due(self, now: float) -> None:
        while self._heap and self._heap[0][0] <= now:
            _, _, out, packet = heapq.heappop(self._heap)
            try:
                os.write(out, packet)
                self.forwarded += 1
            except OSError:
                self.dropped += 1

    def _loop(self) -> None:
        poller = select.poll()
        for fd in (*self.fds, self._wake_r):
            poller.register(fd, select.POLLIN)
        while not self._stopping:
            now = time.monotonic()
            timeout = None if not self._heap else max(0.0, self._heap[0][0] - now) * 1000.0
            for fd, _ in poller.poll(timeout):
                if fd == self._wake_r:
                    return
                self._read_all(fd, time.monotonic())
            self._flush_due(time.monotonic())

    def stop(self) -> None:
        """Stop the thread and close both TUN fds (idempotent)."""
        if self._stopping:
            return
        self._stopping = True
        os.write(self._wake_w, b"x")
        if self._thread.is_alive():
            self._thread.join(timeout=5)
        for fd in (*self.fds, self._wake_r, self._wake_w):
            with contextlib.suppress(OSError):
                os.close(fd)
