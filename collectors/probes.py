"""The probe mesh's two ends on a node: a UDP responder that echoes probes, and a prober that measures the
peers the server assigns (a rotating handful, so each node's cost stays O(k) however large the fleet is).

A probe is 24 bytes: MAGIC, a sequence number and the prober's 8-byte nonce; the reply is the same bytes under
REPLY, never larger than the request (no amplification), and the responder answers at most RATE per second.
Each interval the prober sends one probe to every target and waits `timeout_seconds` for the answers; one
not back by then is lost. Results accumulate per target into windows that `drain()` hands to the next report
(ProbeResult: sent, received, RTT p50/p99/max). When a target that answered stops answering, its window is
cut at the change and `on_loss(target)` is called, so the agent can push the loss at once rather than at the
next interval, in a window of its own that says "nothing came back".
"""

from __future__ import annotations

import contextlib
import logging
import math
import os
import random
import select
import socket
import struct
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field

from sentinel.network.plan import split_address
from sentinel.telemetry.schemas import ProbeResult, ProbeTarget

log = logging.getLogger(__name__)

MAGIC = b"SNTP"
REPLY = b"SNTR"
PACKET = struct.Struct("!4sQ8s")  # magic, seq, nonce
MAX_TARGETS = 64  # far above the server's probe_peers; a bigger list is cut, not obeyed
RATE = 200.0  # replies per second a responder sends at most
BURST = 100.0


def percentile(values: list[float], q: float) -> float:
    """Nearest-rank percentile of a non-empty list (q in 0..1)."""
    ordered = sorted(values)
    rank = max(0, min(len(ordered) - 1, math.ceil(q * len(ordered)) - 1))
    return ordered[rank]


def _family(host: str) -> socket.AddressFamily:
    return socket.AF_INET6 if ":" in host else socket.AF_INET


class ProbeResponder:
    """Echo probes on a UDP host:port. Anything that is not a probe is refused (counted), never answered."""

    def __init__(self, host: str, port: int, *, node: str = "", rate: float = RATE, burst: float = BURST):
        self.node = node
        self.sock = socket.socket(_family(host), socket.SOCK_DGRAM)
        self.sock.bind((host, port))
        self.sock.settimeout(0.5)
        self.rate, self.burst = rate, burst
        self._tokens, self._refilled_at = burst, time.monotonic()
        self.answered_total = 0
        self.refused_total = 0  # not a probe: wrong size or magic
        self.limited_total = 0  # a probe over the rate limit
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    @property
    def address(self) -> str:
        host, port = self.sock.getsockname()[:2]
        return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"

    def start(self) -> None:
        self._thread = threading.Thread(target=self._serve, name="sentinel-probe-responder", daemon=True)
        self._thread.start()

    def _allow(self) -> bool:
        now = time.monotonic()
        self._tokens = min(self.burst, self._tokens + (now - self._refilled_at) * self.rate)
        self._refilled_at = now
        if self._tokens < 1.0:
            return False
        self._tokens -= 1.0
        return True

    def _serve(self) -> None:
        while not self._stop.is_set():
            try:
                data, peer = self.sock.recvfrom(512)
            except TimeoutError:
                continue
            except OSError:
                if self._stop.is_set():
                    return
                time.sleep(0.05)  # e.g. ICMP-caused errors on some kernels: keep serving
                continue
            if len(data) != PACKET.size or data[:4] != MAGIC:
                self.refused_total += 1
                continue
            if not self._allow():
                self.limited_total += 1
                continue
            self.answered_total += 1  # counted before the send, so whoever holds the reply sees the count
            try:
                self.sock.sendto(REPLY + data[4:], peer)
            except OSError:
                self.answered_total -= 1  # the prober's route is gone: it will count the loss

    def close(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=1.5)
        self.sock.close()


@dataclass
class _Window:
    """Consecutive probes of one target that all came back, or all did not: from the first one's time (its
    answer, or its deadline when lost) to the last one's."""

    started_at: float
    ended_at: float
    sent: int = 0
    rtts: list[float] = field(default_factory=list)

    def result(self, target: str) -> ProbeResult:
        rtts = [min(60.0, r) for r in self.rtts]
        return ProbeResult(target=target, sent=self.sent, received=len(rtts),
                           rtt_p50_seconds=percentile(rtts, 0.5) if rtts else None,
                           rtt_p99_seconds=percentile(rtts, 0.99) if rtts else None,
                           rtt_max_seconds=max(rtts) if rtts else None,
                           started_at=self.started_at, ended_at=self.ended_at)


class Prober:
    def __init__(self, node: str, *, interval_seconds: float = 1.0, timeout_seconds: float = 0.3,
                 on_loss: Callable[[str], None] | None = None, max_targets: int = MAX_TARGETS):
        self.node = node
        self.max_targets = max_targets
        self.interval_seconds = max(0.05, interval_seconds)
        self.timeout_seconds = min(max(0.01, timeout_seconds), self.interval_seconds)
        self.on_loss = on_loss
        self._socks: dict[socket.AddressFamily, socket.socket] = {}
        self._nonce = os.urandom(8)
        self._seq = 0
        self._lock = threading.Lock()
        self._targets: dict[str, tuple[str, int]] = {}  # node → (host, port)
        self._open: dict[str, _Window] = {}
        self._lost_last: dict[str, bool] = {}  # target → whether its last probe was lost
        self._closed: list[ProbeResult] = []
        self.sent_total = 0
        self.lost_total = 0
        self.stray_total = 0  # replies that match no outstanding probe (late, forged, from elsewhere)
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def set_targets(self, targets: list[ProbeTarget]) -> None:
        """The peers to probe, as the server assigned them: IP literals only (no lookups), never this node."""
        chosen: dict[str, tuple[str, int]] = {}
        for t in targets:
            where = split_address(t.address)
            if t.node == self.node or where is None:
                continue
            chosen[t.node] = where
            if len(chosen) >= self.max_targets:
                break
        with self._lock:
            if chosen != self._targets:
                log.info("probe targets: node=%s peers=%s", self.node, " ".join(sorted(chosen)) or "none")
            self._targets = chosen

    def targets(self) -> dict[str, tuple[str, int]]:
        with self._lock:
            return dict(self._targets)

    def _sock(self, family: socket.AddressFamily) -> socket.socket:
        sock = self._socks.get(family)
        if sock is None:
            sock = self._socks[family] = socket.socket(family, socket.SOCK_DGRAM)
            sock.setblocking(False)
        return sock

    def probe_round(self) -> dict[str, float | None]:
        """Probe every target once; target → RTT seconds, or None when lost. Thread-safe, but one at a time."""
        targets = self.targets()
        outstanding: dict[int, tuple[str, float, tuple[str, int]]] = {}
        for node, where in sorted(targets.items()):
            self._seq += 1
            with contextlib.suppress(OSError):  # no route (our link is down): a loss like any other
                self._sock(_family(where[0])).sendto(PACKET.pack(MAGIC, self._seq, self._nonce), where)
            outstanding[self._seq] = (node, time.monotonic(), where)
        rtts: dict[str, float | None] = dict.fromkeys(targets)
        sent_at = time.time()
        deadline = time.monotonic() + self.timeout_seconds
        while outstanding and (left := deadline - time.monotonic()) > 0:
            ready, _, _ = select.select(list(self._socks.values()), [], [], left)
            for sock in ready:
                self._receive(sock, outstanding, rtts)
        self._account(rtts, sent_at)
        return rtts

    def _receive(self, sock: socket.socket, outstanding: dict[int, tuple[str, float, tuple[str, int]]],
                 rtts: dict[str, float | None]) -> None:
        while True:
            try:
                data, peer = sock.recvfrom(64)
            except (BlockingIOError, InterruptedError):
                return
            except OSError:  # ICMP port unreachable reported on the socket: the probe is simply lost
                continue
            at = time.monotonic()
            if len(data) != PACKET.size:
                self.stray_total += 1
                continue
            magic, seq, nonce = PACKET.unpack(data)
            sent = outstanding.get(seq)
            if magic != REPLY or nonce != self._nonce or sent is None or peer[:2] != sent[2]:
                self.stray_total += 1
                continue
            del outstanding[seq]
            rtts[sent[0]] = at - sent[1]

    def _account(self, rtts: dict[str, float | None], sent_at: float) -> None:
        """Add one round to each target's window; a window is cut where the target starts or stops answering, so
        the server can tell when a loss began from when the last answer came (sentinel/network/matrix.py)."""
        newly_lost: list[str] = []
        with self._lock:
            for node, rtt in rtts.items():
                lost = rtt is None
                at = sent_at + (self.timeout_seconds if rtt is None else rtt)  # the answer, or the deadline
                before = self._lost_last.get(node)
                window = self._open.get(node)
                if window is not None and before is not None and before != lost:
                    self._closed.append(window.result(node))
                    window = None
                if lost and before is not True:
                    newly_lost.append(node)
                if window is None:
                    window = self._open[node] = _Window(started_at=at, ended_at=at)
                window.sent += 1
                window.ended_at = max(window.ended_at, at)
                if rtt is not None:
                    window.rtts.append(rtt)
                self._lost_last[node] = lost
            self.sent_total += len(rtts)
            self.lost_total += sum(1 for r in rtts.values() if r is None)
        for node in newly_lost:
            if self.on_loss is not None:
                self.on_loss(node)

    def drain(self) -> list[ProbeResult]:
        """Every window since the last drain, the open ones closed: what the next report carries."""
        with self._lock:
            out = self._closed + [w.result(n) for n, w in sorted(self._open.items())]
            self._closed = []
            self._open = {}
            self._lost_last = {n: v for n, v in self._lost_last.items() if n in self._targets}
        return out[-256:]  # the wire schema's bound on NodeReport.probes

    def start(self) -> None:
        self._thread = threading.Thread(target=self._run, name="sentinel-prober", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        self._stop.wait(random.uniform(0, self.interval_seconds))  # peers' rounds spread, not in lockstep
        next_at = time.monotonic()
        while not self._stop.is_set():
            try:
                self.probe_round()
            except Exception:
                log.exception("probe round failed: node=%s", self.node)
            next_at += self.interval_seconds
            self._stop.wait(max(0.0, next_at - time.monotonic()))

    def close(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=self.interval_seconds + self.timeout_seconds + 1.0)
        for sock in self._socks.values():
            sock.close()
