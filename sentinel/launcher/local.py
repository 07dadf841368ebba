"""The local executor: a job's ranks as processes on this machine, and orders carried out on them.

`sentinel launch` (launcher.py) talks to the server; this class does what an order asks of local processes.
A restart stops every rank, then starts the next attempt on the order's placement with a fresh rendezvous
port (a restarted gloo group must never meet the old one's addresses — ENVIRONMENT.md). A serving replica
is replaced the other way round: the replacement starts before the old replica stops.

Every process of the job is forked by one zygote (zygote.py, children.py), which outlives nothing: stopping
it, or the launcher dying, stops every rank and standby. Warm standbys (default for `python script.py` and
`python -m module`): the zygote has imported the heavy modules (`preload`, default torch), and a standby
forked from it waits to become the next attempt's rank, so a restart costs a rendezvous rather than an
interpreter start and `import torch` (standby.py). Refilling a standby is a fork: milliseconds.
"""

from __future__ import annotations

import contextlib
import logging
import os
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Protocol, TextIO

from sentinel.launcher.children import Child, Zygote
from sentinel.launcher.rendezvous import wait_listening
from sentinel.remediation.executors.base import Action, Executor, Outcome, register

log = logging.getLogger("sentinel.launch")

# What a torch job imports before its first step. torch._dynamo matters most: DistributedDataParallel's
# constructor imports it, ~1 s on a small machine, and that would be paid on every restart. The SDK is what a
# job run by Sentinel imports next; a module that is not installed is skipped.
DEFAULT_PRELOAD = ["torch", "torch.distributed", "torch.nn.parallel", "torch._dynamo", "sentinel.sdk",
                   "sentinel.sdk.checkpoint", "sentinel.sdk.torch"]
STOP_GRACE_SECONDS = 5.0  # a stop: SIGTERM, this long, then SIGKILL (Slurm's KillWait and Kubernetes' are 30 s)
RENDEZVOUS_WAIT_SECONDS = 1.0  # a warm attempt's other ranks wait at most this for rank 0's store to listen
RENDEZVOUS_LEARN_SECONDS = 120.0
WARM = ("standby", "forked")
PRELOAD_WAIT_SECONDS = 300.0  # a first attempt waits this long for the zygote's preloads rather than start cold


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class Process(Protocol):
    """What the executor needs of a rank's process (a `Child`; Popen fits too)."""

    pid: int

    def poll(self) -> int | None: ...

    def wait(self, timeout: float | None = None) -> int: ...


@dataclass
class Rank:
    rank: int
    node: str
    accelerators: list[str]
    agent_url: str | None
    proc: Process


def kill(proc: Process) -> None:
    """SIGKILL the process group of `proc` (a rank and whatever it started) and reap it."""
    signal_group(proc, signal.SIGKILL)
    with contextlib.suppress(subprocess.TimeoutExpired):
        proc.wait(timeout=10)


def signal_group(proc: Process, sig: int) -> None:
    if proc.pid > 0 and proc.poll() is None:  # never pid 0: killpg(0) is this very process group
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(proc.pid, sig)


def attempt_label(started: list[Rank]) -> str:
    """How an attempt started, honestly: warm only when every rank got a standby that was ready."""
    how = Counter(getattr(r.proc, "how", "cold") for r in started)
    total = len(started)
    if how["standby"] == total:
        return "warm"
    if how["cold"] == total:
        return f"cold: {total} of {total} rank(s) started fresh, no standby"
    parts = [f"{n} {text}" for key, text in (("standby", "from ready standbys"), ("forked", "forked on demand"),
                                             ("waited", "waited for the preloads"), ("cold", "started cold"))
             if (n := how[key])]
    return "not warm: " + ", ".join(parts)


@register
class LocalProcesses(Executor):
    name = "local"
    handles = frozenset({"order"})

    def __init__(self, options: dict[str, Any] | None = None, *, argv: list[str] | None = None, nproc: int = 1,
                 env: dict[str, str] | None = None, warm: bool = True, preload: list[str] | None = None,
                 on_started: Callable[[list[Rank], int], None] | None = None, out: TextIO = sys.stdout,
                 on_exit: Callable[[], None] = lambda: None):
        super().__init__(options)
        self.argv = argv or list(self.options.get("argv", []))
        if not self.argv:
            raise ValueError("nothing to launch: give the command after --")
        self.nproc = nproc
        self.job_id = 0
        self.env = dict(env or {})  # for every rank (server URL, token)
        self.preload = preload if preload is not None else list(DEFAULT_PRELOAD)
        self.on_started = on_started or (lambda ranks, attempt: None)
        self.out = out
        self.label = ""
        self.attempt = 0
        self.ranks: list[Rank] = []
        self.standbys: list[Child] = []
        self.warm = warm and self._warmable() is not None
        self.on_exit = on_exit  # a rank or standby ended (from the zygote's event thread)
        self._zygote: Zygote | None = None
        self._closing: Zygote | None = None
        self._rendezvous_seen: bool | None = None  # rank 0 listened on MASTER_PORT in an earlier attempt
        self._lock = threading.RLock()

    def say(self, text: str) -> None:
        print(f"[launch {self.label}] {text}", file=self.out, flush=True)

    # -- the Executor contract --------------------------------------------------------------------------
    def execute(self, action: Action) -> Outcome:
        """An `order` for this job: the next attempt on its placement. Never raises for a bad order."""
        order = action.order
        if action.kind != "order" or order is None:
            return Outcome(False, f"local executor cannot {action.kind!r}")
        if int(order.get("job_id", -1)) != self.job_id:
            return Outcome(False, f"order {order.get('id')} is for job {order.get('job_id')}, not job {self.job_id}")
        if int(order["attempt"]) <= self.attempt and self.ranks:
            return Outcome(True, f"attempt {order['attempt']} already running (order {order['id']})")
        try:
            return self._carry_out(order)
        except (OSError, KeyError, ValueError) as exc:
            return Outcome(False, f"order {order.get('id')}: attempt {order.get('attempt')} not started: {exc}")

    def _carry_out(self, order: dict[str, Any]) -> Outcome:
        if order["kind"] == "replace_replica":
            return self._replace_replicas(order)
        received = time.monotonic()
        self.stop_ranks(list(self.ranks))
        self.ranks = []  # stopped: a failed start below must not leave them listed as this attempt's
        stopped = time.monotonic() - received
        self.start_attempt(order["placement"], int(order["attempt"]))
        took = time.monotonic() - received
        return Outcome(True, f"order {order['id']}: attempt {order['attempt']} started in {took:.2f}s "
                             f"({stopped:.2f}s of it stopping the old ranks)")

    def _replace_replicas(self, order: dict[str, Any]) -> Outcome:
        """A serving job's replicas marked `replace` (every one when none is), one at a time, each replacement
        started before its old replica stops; the replicas left alone join the new attempt as they are."""
        attempt = int(order["attempt"])
        slots = {int(s["rank"]): s for s in order["placement"]}
        chosen = sorted(r for r, s in slots.items() if s.get("replace")) or sorted(slots)
        lines = [self._replace(slots[rank], attempt) for rank in chosen]
        kept = [r for r in self.ranks if r.rank not in chosen]
        if kept:  # the server's next placement names them all
            self.on_started(kept, attempt)
        self.attempt = attempt
        threading.Thread(target=self.fill_standbys, args=(True,), daemon=True).start()
        return Outcome(True, f"order {order['id']}: " + "; ".join(lines))

    def _replace(self, slot: dict[str, Any], attempt: int) -> str:
        """One replica, without a router (sentinel/launcher/replicas.py drains and cuts over): the replacement
        starts, then the old one stops."""
        rank, begun = int(slot["rank"]), time.monotonic()
        old = next((r for r in self.ranks if r.rank == rank), None)
        proc = self._start(self.rank_env(slot, attempt, free_port()))
        new = Rank(rank, slot["node"], list(slot["accelerators"]), slot.get("agent_url"), proc)
        self.on_started([new], attempt)
        if old is not None:
            self.stop_ranks([old])
        self.ranks = sorted([r for r in self.ranks if r.rank != rank] + [new], key=lambda r: r.rank)
        took = time.monotonic() - begun
        self.say(f"rank {rank} replaced (pid {old.proc.pid if old else '-'} → {proc.pid}) in {took:.2f}s")
        return f"rank {rank} replaced in {took:.2f}s (no router: nothing drained)"

    # -- the command, run warm or cold -----------------------------------------------------------------
    def _warmable(self) -> dict[str, Any] | None:
        """{"argv": …} or {"module": …, "argv": …} when the command is `python script.py …` or `python -m m …`."""
        exe = os.path.basename(self.argv[0])
        if not exe.startswith("python") or len(self.argv) < 2:
            return None
        if self.argv[1] == "-m" and len(self.argv) >= 3:
            return {"module": self.argv[2], "argv": self.argv[3:]}
        if self.argv[1].endswith(".py"):
            return {"argv": [os.path.abspath(self.argv[1]), *self.argv[2:]]}
        return None

    def zygote(self) -> Zygote:
        """The zygote every process of the job is forked from; started on first use, again if it died (its
        children died with it). Warm: the job's interpreter with the preloads; cold: this one, bare."""
        with self._lock:
            old = self._zygote
            if old is not None and old.alive():
                return old
            if old is not None and self.warm and not old.ready.is_set():
                self.warm = False
                self.say(f"warm standbys unavailable (the zygote exited before its preloads, status "
                         f"{old.proc.poll()}): every rank starts cold")
            elif old is not None:
                log.warning("zygote gone, starting another: job=%d pid=%d status=%s", self.job_id, old.pid,
                            old.proc.poll())
            interpreter = (shutil.which(self.argv[0]) or self.argv[0]) if self.warm else sys.executable
            self._zygote = Zygote(interpreter, self.preload if self.warm else [], grace_seconds=STOP_GRACE_SECONDS,
                                  on_exit=lambda child: self.on_exit())
            return self._zygote

    def fill_standbys(self, announce: bool = False) -> None:
        """One standby per rank, forked from the zygote (milliseconds once its preloads are in)."""
        if not self.warm:
            return
        with self._lock:
            zygote = self.zygote()
            self.standbys = [s for s in self.standbys if s.poll() is None]
            while len(self.standbys) < self.nproc:
                self.standbys.append(zygote.fork())
            waiting = list(self.standbys)
        if announce and all(s.started.wait(timeout=PRELOAD_WAIT_SECONDS) and s.error is None for s in waiting):
            missing = f" (not preloaded: {', '.join(zygote.failed_preloads)})" if zygote.failed_preloads else ""
            self.say(f"{len(waiting)} warm standby(s) ready for the next attempt{missing}")

    def _take_standby(self) -> tuple[Zygote, Child]:
        """A standby that is waiting now (how="standby"); else one forked now from a ready zygote ("forked"),
        or, while the zygote still imports its preloads, the first to come ("waited": no slower than cold)."""
        with self._lock:
            zygote = self.zygote()
            for i, standby in enumerate(self.standbys):
                if standby.started.is_set() and standby.error is None and standby.poll() is None:
                    return zygote, self.standbys.pop(i)
            if zygote.ready.is_set():
                return zygote, zygote.fork("forked")
            if not self.standbys:
                self.standbys.append(zygote.fork())
            standby = self.standbys.pop(0)
        standby.how = "waited"
        return zygote, standby

    def _start(self, env: dict[str, str]) -> Process:
        spec = self._warmable()
        if self.warm and spec is not None:
            zygote, standby = self._take_standby()
            if standby.started.wait(PRELOAD_WAIT_SECONDS) and standby.error is None:
                zygote.run(standby, {**spec, "env": env})
                return standby
            log.warning("no warm standby for a rank, starting cold: job=%d error=%s", self.job_id, standby.error)
        return self.zygote().exec(self.argv, {**os.environ, **env})

    # -- attempts -------------------------------------------------------------------------------------
    def rank_env(self, slot: dict[str, Any], attempt: int, port: int) -> dict[str, str]:
        env = {"RANK": str(slot["rank"]), "LOCAL_RANK": str(slot["rank"]), "WORLD_SIZE": str(self.nproc),
               "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port), "TORCHELASTIC_RESTART_COUNT": str(attempt),
               "SENTINEL_JOB_ID": str(self.job_id), "SENTINEL_RANK": str(slot["rank"]),
               "SENTINEL_ATTEMPT": str(attempt), "SENTINEL_NODE": str(slot["node"]),
               "SENTINEL_ACCELERATORS": ",".join(slot["accelerators"]), "PYTHONUNBUFFERED": "1"}
        if slot.get("agent_url"):
            env["SENTINEL_AGENT_URL"] = str(slot["agent_url"])
        return {**env, **self.env}

    def task_fields(self, rank: int) -> dict[str, Any]:
        """What the rank's task registration says beyond its placement (a serving replica: its engine)."""
        return {}

    def start_attempt(self, placement: list[dict[str, Any]], attempt: int) -> list[Rank]:
        """Start every rank of `attempt`; if one cannot start, the ones already started are stopped (an attempt
        runs whole or not at all) and the error is raised."""
        port = free_port()  # a fresh rendezvous for every attempt
        started: list[Rank] = []
        try:
            for slot in sorted(placement, key=lambda s: s["rank"]):
                if len(started) == 1 and self._rendezvous_seen and getattr(started[0].proc, "how", "") in WARM:
                    wait_listening(port, RENDEZVOUS_WAIT_SECONDS)  # rank 0's store first: no client backoff
                proc = self._start(self.rank_env(slot, attempt, port))
                started.append(Rank(slot["rank"], slot["node"], list(slot["accelerators"]), slot.get("agent_url"),
                                    proc))
        except BaseException:
            self.stop_ranks(started)
            raise
        self.on_started(started, attempt)
        self.ranks, self.attempt = started, attempt
        where = ", ".join(f"rank {r.rank} → {r.node}:{','.join(r.accelerators)} (pid {r.proc.pid})" for r in started)
        self.say(f"attempt {attempt} started ({attempt_label(started)}, port {port}): {where}")
        threading.Thread(target=self.fill_standbys, args=(True,), daemon=True).start()
        if self._rendezvous_seen is None:
            threading.Thread(target=self._learn_rendezvous, args=(port,), daemon=True).start()
        return started

    def _learn_rendezvous(self, port: int) -> None:
        """Does this job's rank 0 listen on MASTER_PORT? Then later warm attempts start it first."""
        if wait_listening(port, RENDEZVOUS_LEARN_SECONDS, poll_seconds=0.05):
            self._rendezvous_seen = True

    def stop_ranks(self, ranks: list[Rank] | None = None) -> None:
        """SIGKILL (a restart wants the old ranks gone now), every group first, then reap."""
        chosen = list(ranks if ranks is not None else self.ranks)
        for r in chosen:
            signal_group(r.proc, signal.SIGKILL)
        for r in chosen:
            kill(r.proc)

    def exit_codes(self) -> list[int | None]:
        return [r.proc.poll() for r in self.ranks]

    def close(self, grace_seconds: float = STOP_GRACE_SECONDS) -> None:
        """Stop every rank and standby: SIGTERM to each process group, `grace_seconds`, then SIGKILL."""
        with self._lock:
            zygote, self._zygote = self._zygote, None
            self._closing, self.standbys = zygote, []
        if zygote is not None:
            zygote.stop(grace_seconds)

    def hurry(self) -> None:
        """A second stop signal while closing: SIGKILL now instead of at the end of the grace period."""
        zygote = self._zygote or self._closing
        if zygote is not None:
            zygote.stop(0.0, wait=False)
