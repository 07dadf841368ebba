"""Which SDK batches the agent relays: only a batch sent by the process it names, for the task placed here.

A batch names a job, a rank and a pid. Any process on the node can read a rank's pid in /proc, so the
agent checks two things before the batch counts as that rank's telemetry:

1. **The sender is the named process, or a process under it** (a data-loader worker forked from the rank
   still carries the rank's pid). The sender is found from the connection itself: the client's socket
   inode in `/proc/net/tcp`, held by one process's descriptors (collectors/peers.py). It is found once per
   connection; the SDK keeps one connection open, so a rank pays for it once, not per batch.
2. **The server placed that pid there.** When the agent's assignments (from the server's report acks) give
   the task a pid, the batch's pid must be it (or below it: a torchrun agent's workers); a batch for a task
   whose placed pid is another running process is refused. Before the server's pid reaches the agent (a
   task's first second), the first verified pid to report for the (job, rank) is bound to it until it ends.

Why the TCP peer lookup and not a Unix socket with SO_PEERCRED or a per-task secret: the SDK endpoint on
127.0.0.1:9481 is a contract (torchrun jobs, serving engines and old SDKs post there, with nothing passed
in by a launcher), and a Unix socket beside it would leave the TCP door open; a secret in the environment
is readable by any process of the same user and needs every launcher to carry it. The lookup binds the
batches that already arrive, needs no change on the sending side, and fails closed: a connection from
another host, another network namespace or through a proxy has no client socket here (or is held by the
proxy), so it is refused: listening beyond loopback (for a remote Prometheus) serves /metrics to other
hosts but takes batches only from this node's processes.
It needs the agent to see the ranks' processes: the host's pid namespace, and root to read other users'
descriptors (without it, batches from other users' processes are refused, saying why).

A search past the claimed process (its workers, then every process on the node, to name the real sender)
reads every descriptor on the node, so at most MAX_SEARCHES_PER_SECOND begin each second; past that a
connection the claimed pid does not hold is refused without naming its sender.

Refusals answer 403 with the reason, count in `sentinel_agent_sdk_batches_refused_total`, and log one
WARNING line at most every `log_every_seconds` (with how many were refused in between).
"""

from __future__ import annotations

import logging
import os
import threading
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from collectors import peers
from sentinel.telemetry.schemas import Assignment, SdkBatch

log = logging.getLogger("sentinel.agent.sdk")

MAX_BINDINGS = 4096
MAX_SEARCHES_PER_SECOND = 20


@dataclass
class Sender:
    """The process at the other end of one SDK connection, found when its first batch arrives."""

    pid: int | None
    unknown_because: str = ""
    vouched: set[int] = field(default_factory=set)  # ancestors it was checked to be below


class BatchRefused(Exception):
    def __init__(self, detail: str):
        super().__init__(detail)
        self.detail = detail


class SdkGate:
    def __init__(self, node: str, *, proc: Path = peers.PROC, clock: Callable[[], float] = time.monotonic,
                 log_every_seconds: float = 10.0):
        self.node = node
        self.proc = proc
        self.refused_total = 0
        self._clock = clock
        self._log_every = log_every_seconds
        self._logged_at = float("-inf")
        self._quiet = 0
        self._bound: dict[tuple[int, int], int] = {}  # (job, rank) → the pid that reports for it, until told
        self._searches: deque[float] = deque()  # when the last searches past the claimed pid began
        self._lock = threading.Lock()

    def identify(self, client: tuple[str, int], server: tuple[str, int], claimed_pid: int) -> Sender:
        """The process that holds the client end of this connection (searched from the pid its batch names)."""
        found = peers.client_socket(client, server, self.proc)
        if found is None:
            return Sender(None, f"it came from {client[0]}:{client[1]}, not from a process on this node")
        inode, uid = found
        owner = peers.socket_owner(inode, claimed_pid, self.proc, beyond_hint=False)
        if owner is None and not self._may_search():
            return Sender(None, f"pid {claimed_pid} does not hold its connection (not searched further: "
                                "too many such connections this second)")
        if owner is None:
            owner = peers.socket_owner(inode, claimed_pid, self.proc)
        if owner is None:
            why = "" if os.geteuid() == 0 else " (the agent is not root and cannot see other users' processes)"
            return Sender(None, f"no process could be seen holding its connection, owned by uid {uid}{why}")
        return Sender(owner)

    def _may_search(self) -> bool:
        """A search past the claimed pid reads every process's descriptors (ms): at most a few a second, so a
        flood of connections naming other pids cannot take the agent's CPU."""
        now = self._clock()
        with self._lock:
            while self._searches and self._searches[0] < now - 1.0:
                self._searches.popleft()
            if len(self._searches) >= MAX_SEARCHES_PER_SECOND:
                return False
            self._searches.append(now)
            return True

    def admit(self, batch: SdkBatch, sender: Sender, assignments: list[Assignment]) -> None:
        """Return when the batch may count as its task's telemetry; raise BatchRefused (counted, logged) if not."""
        detail = self._sender_mismatch(batch, sender) or self._placement_conflict(batch, assignments)
        if detail is not None:
            raise self._refuse(batch, sender, detail)

    def _sender_mismatch(self, batch: SdkBatch, sender: Sender) -> str | None:
        if sender.pid is None:
            return f"could not tell which process sent this batch: {sender.unknown_because}"
        if batch.pid == sender.pid or batch.pid in sender.vouched:
            return None
        if peers.is_ancestor(batch.pid, sender.pid, self.proc) and self._same_user(batch.pid, sender.pid):
            sender.vouched.add(batch.pid)
            return None
        return f"batch names pid {batch.pid} but was sent by pid {sender.pid}"

    def _same_user(self, a: int, b: int) -> bool:
        """An ancestor counts only if it runs as the same user (no process may claim init, sshd, a shell of root)."""
        try:
            return os.stat(self.proc / str(a)).st_uid == os.stat(self.proc / str(b)).st_uid
        except OSError:
            return False

    def _placement_conflict(self, batch: SdkBatch, assignments: list[Assignment]) -> str | None:
        key, pid = (batch.job_id, batch.rank), batch.pid
        placed = [a.pid for a in assignments if (a.job_id, a.rank) == key and a.pid]
        if any(p == pid or peers.is_ancestor(p, pid, self.proc) for p in placed):
            return None  # the server's word
        elsewhere = sorted({(a.job_id, a.rank) for a in assignments if a.pid == pid} - {key})
        if elsewhere:
            return (f"pid {pid} runs job {elsewhere[0][0]} rank {elsewhere[0][1]} here, "
                    f"not job {batch.job_id} rank {batch.rank}")
        running = [p for p in placed if peers.alive(p, self.proc)]
        if running:
            return (f"job {batch.job_id} rank {batch.rank} runs here as pid {running[0]} (placed by the server), "
                    f"not as pid {pid}")
        return self._bind(key, pid)

    def _bind(self, key: tuple[int, int], pid: int) -> str | None:
        """No placed pid yet (a task's first interval, or a restart the server has not told us of): the first
        verified process to report for the task keeps it while it runs."""
        with self._lock:
            bound = self._bound.get(key)
            if bound == pid:
                return None
            if bound is not None and peers.alive(bound, self.proc):
                if peers.is_ancestor(bound, pid, self.proc):
                    return None  # a worker of the bound process
                return f"job {key[0]} rank {key[1]} reports from pid {bound} on this node, not pid {pid}"
            self._bound.pop(key, None)
            self._bound[key] = pid
            if len(self._bound) > MAX_BINDINGS:
                self._prune()
        return None

    def _prune(self) -> None:
        for key, pid in list(self._bound.items()):
            if not peers.alive(pid, self.proc):
                del self._bound[key]
        while len(self._bound) > MAX_BINDINGS:
            del self._bound[next(iter(self._bound))]

    def _refuse(self, batch: SdkBatch, sender: Sender, detail: str) -> BatchRefused:
        with self._lock:
            self.refused_total += 1
            now = self._clock()
            speak = now - self._logged_at >= self._log_every
            quiet = self._quiet
            if speak:
                self._logged_at, self._quiet = now, 0
            else:
                self._quiet += 1
        if speak:
            log.warning("SDK batch refused: node=%s job=%d rank=%d pid=%d sender=%s: %s%s", self.node, batch.job_id,
                        batch.rank, batch.pid, sender.pid if sender.pid is not None else "unknown", detail,
                        f" ({quiet} more refused since the last such line)" if quiet else "")
        return BatchRefused(detail)
