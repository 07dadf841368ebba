"""The local process executor: `sentinel launch --job NAME --nproc N -- python train.py …`.

It registers the job, asks the server for a placement (healthy, free accelerators; one node when it
fits), starts one process per rank with the environment the SDK and torch.distributed read, registers
each rank as a task, and then carries out Sentinel's orders: on a restart order it stops every rank,
acknowledges, and starts the next attempt on the order's placement with a fresh rendezvous port (a
restarted gloo group must never meet the old one's addresses — ENVIRONMENT.md). Serving replicas are
replaced the other way round: the replacement starts before the old replica stops.

Warm standbys (default for `python script.py` and `python -m module`): one process per rank that has
already imported the heavy modules (`--preload`, default torch) waits to become the next attempt's
rank, so a restart costs a rendezvous rather than an interpreter start and `import torch`.

The launcher does not restart anything on its own: a rank that dies is seen by the node agent, the
server decides, and the order comes back here. It ends when every rank of the current attempt exits
0, or on Ctrl-C (the ranks are stopped).
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
from dataclasses import dataclass, field
from typing import Any, TextIO

from sentinel.client import ApiError, SentinelClient

# A server that is away, or a standby still taking over, is asked again for this long before a launcher gives up.
RETRY_SECONDS = 60.0

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


class Launcher:
    def __init__(self, client: SentinelClient, *, name: str, nproc: int, argv: list[str], kind: str = "training",
                 nodes: list[str] | None = None, warm: bool = True, preload: list[str] | None = None,
                 poll_seconds: float = 25.0, out: TextIO = sys.stdout):
        if not argv:
            raise ValueError("nothing to launch: give the command after --")
        self.client = client
        self.name, self.nproc, self.argv, self.kind = name, nproc, argv, kind
        self.nodes = nodes or []
        self.preload = preload if preload is not None else list(DEFAULT_PRELOAD)
        self.poll_seconds = poll_seconds
        self.out = out
        self.job_id = 0
        self.attempt = 0
        self.ranks: list[Rank] = []
        self.standbys: list[Standby] = []
        self.warm = warm and self._warmable() is not None
        self._orders: list[dict[str, Any]] = []
        self._orders_lock = threading.Lock()
        self._stop = threading.Event()
        self.restarts: list[dict[str, Any]] = []  # (order id, attempt, seconds from order to ranks started)

    def say(self, text: str) -> None:
        print(f"[launch {self.name}] {text}", file=self.out, flush=True)

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

    def _fill_standbys(self, announce: bool = False) -> None:
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
            self._kill(standby.proc)
        return subprocess.Popen(self.argv, env={**os.environ, **env}, start_new_session=True)

    # -- attempts -------------------------------------------------------------------------------------
    def _env(self, slot: dict[str, Any], attempt: int, port: int) -> dict[str, str]:
        env = {"RANK": str(slot["rank"]), "LOCAL_RANK": str(slot["rank"]), "WORLD_SIZE": str(self.nproc),
               "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port), "TORCHELASTIC_RESTART_COUNT": str(attempt),
               "SENTINEL_JOB_ID": str(self.job_id), "SENTINEL_RANK": str(slot["rank"]),
               "SENTINEL_ATTEMPT": str(attempt), "SENTINEL_NODE": str(slot["node"]),
               "SENTINEL_ACCELERATORS": ",".join(slot["accelerators"]), "PYTHONUNBUFFERED": "1"}
        if slot.get("agent_url"):
            env["SENTINEL_AGENT_URL"] = str(slot["agent_url"])
        env["SENTINEL_SERVER"] = self.client.server  # for the checkpoint catalog (sentinel.sdk.checkpoint)
        if self.client.token:
            env["SENTINEL_TOKEN"] = self.client.token
        return env

    def start_attempt(self, placement: list[dict[str, Any]], attempt: int) -> None:
        port = free_port()  # a fresh rendezvous for every attempt
        started: list[Rank] = []
        for slot in sorted(placement, key=lambda s: s["rank"]):
            proc = self._start(self._env(slot, attempt, port))
            started.append(Rank(slot["rank"], slot["node"], list(slot["accelerators"]), slot.get("agent_url"), proc))
        for r in started:
            self.client.post(f"/jobs/{self.job_id}/tasks", {"rank": r.rank, "node": r.node,
                                                             "accelerators": r.accelerators, "pid": r.proc.pid,
                                                             "attempt": attempt}, retry_seconds=RETRY_SECONDS)
        self.ranks, self.attempt = started, attempt
        where = ", ".join(f"rank {r.rank} → {r.node}:{','.join(r.accelerators)} (pid {r.proc.pid})" for r in started)
        self.say(f"attempt {attempt} started ({'warm' if self.warm else 'cold'}, port {port}): {where}")
        threading.Thread(target=self._fill_standbys, args=(True,), daemon=True).start()

    @staticmethod
    def _kill(proc: subprocess.Popen[bytes]) -> None:
        if proc.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGKILL)
        with contextlib.suppress(subprocess.TimeoutExpired):
            proc.wait(timeout=10)

    def stop_ranks(self, ranks: list[Rank] | None = None) -> None:
        for r in ranks if ranks is not None else self.ranks:
            self._kill(r.proc)

    # -- orders ---------------------------------------------------------------------------------------
    def _poll_orders(self) -> None:
        client = SentinelClient(self.client.server, self.client.token, timeout=self.poll_seconds + 15)
        seen: set[str] = set()
        while not self._stop.is_set():
            try:
                orders = client.get(f"/jobs/{self.job_id}/orders", wait=self.poll_seconds)
            except (ApiError, OSError, Exception) as exc:
                log.warning("order poll failed, retrying: job=%d error=%s", self.job_id, exc)
                self._stop.wait(1.0)
                continue
            fresh = [o for o in orders if o["id"] not in seen and o["state"] == "pending"]
            if fresh:
                newest = max(fresh, key=lambda o: o["attempt"])
                seen.update(o["id"] for o in fresh)
                with self._orders_lock:
                    self._orders.append(newest)

    def carry_out(self, order: dict[str, Any]) -> None:
        received = time.monotonic()
        self.client.post(f"/orders/{order['id']}/ack", {"status": "acknowledged", "detail": "launcher got it"},
                         retry_seconds=RETRY_SECONDS)
        self.say(f"order {order['id']}: {order['kind']} as attempt {order['attempt']} ({order['reason']})")
        old = list(self.ranks)
        stopped = 0.0
        if order["kind"] == "replace_replica":
            self.start_attempt(order["placement"], order["attempt"])  # the replacement first, then the old one
            self.stop_ranks(old)
        else:
            self.stop_ranks(old)
            stopped = time.monotonic() - received
            self.start_attempt(order["placement"], order["attempt"])
        took = time.monotonic() - received
        self.restarts.append({"order": order["id"], "attempt": order["attempt"], "seconds": took})
        detail = f"attempt {order['attempt']} started in {took:.2f}s"
        if order["kind"] != "replace_replica":
            detail += f" ({stopped:.2f}s of it stopping the old ranks)"
        self.client.post(f"/orders/{order['id']}/ack", {"status": "done", "detail": detail},
                         retry_seconds=RETRY_SECONDS)

    # -- the whole run --------------------------------------------------------------------------------
    def run(self) -> int:
        spec = {"name": self.name, "kind": self.kind, "world_size": self.nproc,
                "attributes": {"launcher": "sentinel launch", "host": socket.gethostname(),
                               "command": " ".join(self.argv)[:500]}}
        self.job_id = int(self.client.post("/jobs", spec)["id"])
        self._fill_standbys()
        placement = self.client.post(f"/jobs/{self.job_id}/placement", {"nodes": self.nodes})
        self.say(f"job {self.job_id} registered; {self.nproc} rank(s)")
        self.start_attempt(placement, 0)
        threading.Thread(target=self._poll_orders, name="sentinel-launch-orders", daemon=True).start()
        try:
            while True:
                with self._orders_lock:
                    pending, self._orders = self._orders, []
                if pending:
                    self.carry_out(max(pending, key=lambda o: o["attempt"]))
                    continue
                codes = [r.proc.poll() for r in self.ranks]
                if all(c == 0 for c in codes):
                    self.say(f"every rank of attempt {self.attempt} finished")
                    return 0
                time.sleep(0.02)
        except KeyboardInterrupt:
            self.say("interrupted: stopping the ranks")
            return 130
        finally:
            self._stop.set()
            self.stop_ranks()
            for standby in self.standbys:
                self._kill(standby.proc)
