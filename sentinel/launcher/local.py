"""The local executor: a job's ranks as processes on this machine, and orders carried out on them.

`sentinel launch` (launcher.py) talks to the server; this class does what an order asks of local processes.
A restart stops every rank, then starts the next attempt on the order's placement with a fresh rendezvous
port (a restarted gloo group must never meet the old one's addresses — ENVIRONMENT.md). A serving replica
is replaced the other way round: the replacement starts before the old replica stops.

Warm standbys (default for `python script.py` and `python -m module`): one process per rank that has
already imported the heavy modules (`preload`, default torch) waits to become the next attempt's rank, so
a restart costs a rendezvous rather than an interpreter start and `import torch` (standby.py).
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, TextIO

from sentinel.remediation.executors.base import Action, Executor, Outcome, register

log = logging.getLogger("sentinel.launch")

# What a torch job imports before its first step. torch._dynamo matters most: DistributedDataParallel's
# constructor imports it, ~1 s on a small machine, and that would be paid on every restart.
DEFAULT_PRELOAD = ["torch", "torch.distributed", "torch.nn.parallel", "torch._dynamo"]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@dataclass
class Rank:
    rank: int
    node: str
    accelerators: list[str]
    agent_url: str | None
    proc: subprocess.Popen[bytes]


@dataclass
class Standby:
    proc: subprocess.Popen[bytes]
    ready: threading.Event = field(default_factory=threading.Event)


def kill(proc: subprocess.Popen[bytes]) -> None:
    """SIGKILL the process group of `proc` (a rank and whatever it started) and reap it."""
    if proc.poll() is None:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
    with contextlib.suppress(subprocess.TimeoutExpired):
        proc.wait(timeout=10)


@register
class LocalProcesses(Executor):
    name = "local"
    handles = frozenset({"order"})

    def __init__(self, options: dict[str, Any] | None = None, *, argv: list[str] | None = None, nproc: int = 1,
                 env: dict[str, str] | None = None, warm: bool = True, preload: list[str] | None = None,
                 on_started: Callable[[list[Rank], int], None] | None = None, out: TextIO = sys.stdout):
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
        self.standbys: list[Standby] = []
        self.warm = warm and self._warmable() is not None

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
        received = time.monotonic()
        old = list(self.ranks)
        stopped = 0.0
        if order["kind"] == "replace_replica":
            self.start_attempt(order["placement"], int(order["attempt"]))  # the replacement first, then the old one
            self.stop_ranks(old)
        else:
            self.stop_ranks(old)
            self.ranks = []  # stopped: a failed start below must not leave them listed as this attempt's
            stopped = time.monotonic() - received
            self.start_attempt(order["placement"], int(order["attempt"]))
        took = time.monotonic() - received
        detail = f"order {order['id']}: attempt {order['attempt']} started in {took:.2f}s"
        if order["kind"] != "replace_replica":
            detail += f" ({stopped:.2f}s of it stopping the old ranks)"
        return Outcome(True, detail)

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

    def _spawn_standby(self) -> Standby:
        interpreter = shutil.which(self.argv[0]) or self.argv[0]
        cmd = [interpreter, "-m", "sentinel.launcher.standby", *[a for m in self.preload for a in ("--preload", m)]]
        proc = subprocess.Popen(cmd, stdin=subprocess.PIPE, stdout=subprocess.PIPE, start_new_session=True)
        standby = Standby(proc)

        def watch() -> None:
            assert proc.stdout is not None
            if proc.stdout.readline().strip() == b"ready":
                standby.ready.set()
            # from here on the rank writes to the launcher's stdout
            for line in proc.stdout:
                sys.stdout.buffer.write(line)
                sys.stdout.flush()

        threading.Thread(target=watch, daemon=True).start()
        return standby

    def fill_standbys(self, announce: bool = False) -> None:
        if self.warm:
            while len(self.standbys) < self.nproc:
                self.standbys.append(self._spawn_standby())
            if announce and all(s.ready.wait(timeout=300) for s in list(self.standbys)):
                self.say(f"{len(self.standbys)} warm standby(s) ready for the next attempt")

    def _start(self, env: dict[str, str]) -> subprocess.Popen[bytes]:
        spec = self._warmable()
        while self.warm and self.standbys and spec is not None:
            standby = self.standbys.pop(0)
            if standby.proc.poll() is None and standby.ready.wait(timeout=120):
                assert standby.proc.stdin is not None
                standby.proc.stdin.write((json.dumps({**spec, "env": env}) + "\n").encode())
                standby.proc.stdin.flush()
                return standby.proc
            log.warning("standby not ready, starting cold: pid=%d", standby.proc.pid)
            kill(standby.proc)
        return subprocess.Popen(self.argv, env={**os.environ, **env}, start_new_session=True)

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

    def start_attempt(self, placement: list[dict[str, Any]], attempt: int) -> list[Rank]:
        """Start every rank of `attempt`; if one cannot start, the ones already started are stopped (an attempt
        runs whole or not at all) and the error is raised."""
        port = free_port()  # a fresh rendezvous for every attempt
        started: list[Rank] = []
        try:
            for slot in sorted(placement, key=lambda s: s["rank"]):
                proc = self._start(self.rank_env(slot, attempt, port))
                started.append(Rank(slot["rank"], slot["node"], list(slot["accelerators"]), slot.get("agent_url"),
                                    proc))
        except BaseException:
            self.stop_ranks(started)
            raise
        self.on_started(started, attempt)
        self.ranks, self.attempt = started, attempt
        where = ", ".join(f"rank {r.rank} → {r.node}:{','.join(r.accelerators)} (pid {r.proc.pid})" for r in started)
        self.say(f"attempt {attempt} started ({'warm' if self.warm else 'cold'}, port {port}): {where}")
        threading.Thread(target=self.fill_standbys, args=(True,), daemon=True).start()
        return started

    def stop_ranks(self, ranks: list[Rank] | None = None) -> None:
        for r in ranks if ranks is not None else self.ranks:
            kill(r.proc)

    def exit_codes(self) -> list[int | None]:
        return [r.proc.poll() for r in self.ranks]

    def close(self) -> None:
        """Stop every rank and standby."""
        self.stop_ranks()
        for standby in self.standbys:
            kill(standby.proc)
