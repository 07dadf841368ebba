"""`sentinel launch --job NAME --nproc N -- python train.py …`: a job launcher for this machine.

It registers the job, asks the server for a placement (healthy, free accelerators; one node when it
fits), starts one process per rank through the local executor (local.py: the environment the SDK and
torch.distributed read, warm standbys), registers each rank as a task, and then carries out Sentinel's
orders: it long-polls for them, acknowledges, has the local executor start the new attempt, and says
`done` (or `failed`) with what that took.

The launcher does not restart anything on its own: a rank that dies is seen by the node agent, the
server decides, and the order comes back here. It ends when every rank of the current attempt exits
0, or on SIGTERM, SIGINT or SIGHUP: every rank and standby gets SIGTERM, then SIGKILL after a grace period
(a second signal: at once), and the launcher exits 128 + the signal. SIGKILLed, it leaves nothing either:
the zygote that forked every process of the job sees its control pipe close and stops them (local.py).
"""

from __future__ import annotations

import logging
import signal
import socket
import sys
import threading
import time
from collections.abc import Callable
from typing import Any, TextIO

import httpx

from sentinel.client import ApiError, SentinelClient
from sentinel.launcher.local import STOP_GRACE_SECONDS, LocalProcesses, Rank
from sentinel.launcher.router_queue import RouterQueueReporter
from sentinel.remediation.executors.base import Action, JobRef, adjust_purpose

# A server that is away, or a standby still taking over, is asked again for this long before a launcher gives up.
RETRY_SECONDS = 60.0
FINISH_RETRY_SECONDS = 3.0  # how long a stop waits on a server that is away to hear the job ended

STOP_SIGNALS = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP)

log = logging.getLogger("sentinel.launch")


class Stopped(Exception):
    """A stop signal reached the launcher."""

    def __init__(self, signum: int):
        super().__init__(signal.Signals(signum).name)
        self.signum = signum


class Launcher:
    def __init__(self, client: SentinelClient, *, name: str, nproc: int, argv: list[str], kind: str = "training",
                 nodes: list[str] | None = None, warm: bool = True, preload: list[str] | None = None,
                 poll_seconds: float = 25.0, out: TextIO = sys.stdout,
                 executor: Callable[..., LocalProcesses] | None = None, attributes: dict[str, Any] | None = None):
        if not argv:
            raise ValueError("nothing to launch: give the command after --")
        self.client = client
        self.name, self.nproc, self.argv, self.kind = name, nproc, argv, kind
        self.attributes = dict(attributes or {})  # registered with the job (a serving job's `slo`)
        self.nodes = nodes or []
        self.poll_seconds = poll_seconds
        env = {"SENTINEL_SERVER": client.server}  # for the checkpoint catalog (sentinel.sdk.checkpoint)
        if client.token:
            env["SENTINEL_TOKEN"] = client.token
        make = executor or LocalProcesses  # a serving job's: sentinel/launcher/replicas.py, from the command
        self.local = make(argv=argv, nproc=nproc, env=env, warm=warm, preload=preload,
                          on_started=self._register_tasks, out=out, on_exit=self._wake_up)
        self.local.label = name
        self._orders: list[dict[str, Any]] = []
        self._orders_lock = threading.Lock()
        self._stop = threading.Event()
        self._wake = threading.Event()  # an order came, or a process ended
        self._closing = False
        self.restarts: list[dict[str, Any]] = []  # (order id, attempt, seconds from order to ranks started)
        self.router_queue: RouterQueueReporter | None = None

    @property
    def job_id(self) -> int:
        return self.local.job_id

    @property
    def attempt(self) -> int:
        return self.local.attempt

    @property
    def warm(self) -> bool:
        return self.local.warm

    def say(self, text: str) -> None:
        self.local.say(text)

    def _wake_up(self) -> None:
        self._wake.set()

    def _register_tasks(self, started: list[Rank], attempt: int) -> None:
        for r in started:
            try:
                self.client.post(f"/jobs/{self.job_id}/tasks", {"rank": r.rank, "node": r.node,
                                                                 "accelerators": r.accelerators, "pid": r.proc.pid,
                                                                 "attempt": attempt, **self.local.task_fields(r.rank)},
                                 retry_seconds=RETRY_SECONDS)
            except ApiError as exc:
                if exc.status != 409 or not self._registered(r, attempt):
                    raise
                # a leader that committed the task and stopped before it answered: the retry on the next
                # leader finds this very process registered, which is what was asked
                log.info("job %s rank %d attempt %d pid %d: already registered (an earlier try was committed)",
                         self.job_id, r.rank, attempt, r.proc.pid)

    def _registered(self, r: Rank, attempt: int) -> bool:
        tasks = self.client.get(f"/jobs/{self.job_id}").get("tasks", [])
        return any(t["rank"] == r.rank and t["attempt"] == attempt and t["node"] == r.node and t["pid"] == r.proc.pid
                   for t in tasks)

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
            restarts = [o for o in fresh if o["kind"] != "adjust"]
            # of adjusts, the newest of each purpose counts (a batch limit; an instruction to the engines)
            newest: dict[str, dict[str, Any]] = {}
            for o in sorted((o for o in fresh if o["kind"] == "adjust"), key=lambda o: o["created_at"]):
                newest[adjust_purpose(o.get("params"))] = o
            chosen = ([max(restarts, key=lambda o: o["attempt"])] if restarts else []) + list(newest.values())
            if chosen:
                seen.update(o["id"] for o in fresh)
                with self._orders_lock:
                    self._orders.extend(chosen)
                self._wake.set()

    def carry_out(self, order: dict[str, Any]) -> None:
        """Acknowledge, have the local executor start the order's attempt, report `done` or `failed`."""
        received = time.monotonic()
        # acknowledged while the attempt starts: the round trip must not delay the ranks ('done' waits for it)
        acked: list[BaseException | None] = []

        def acknowledge() -> None:
            try:
                self.client.post(f"/orders/{order['id']}/ack", {"status": "acknowledged", "detail": "launcher got it"},
                                 retry_seconds=RETRY_SECONDS)
                acked.append(None)
            except Exception as exc:  # raised below, in this thread, as before
                acked.append(exc)

        ack = threading.Thread(target=acknowledge, name="sentinel-launch-ack", daemon=True)
        ack.start()
        if order["kind"] != "adjust":
            self.say(f"order {order['id']}: {order['kind']} as attempt {order['attempt']} ({order['reason']})")
        slots = order.get("placement") or [{}]
        action = Action("order", str(slots[0].get("node", "")), str(order.get("reason", "")),
                        jobs=(JobRef(self.job_id, self.name, self.kind),), incident_id=order.get("incident_id"),
                        order={**order, "job_id": self.job_id})
        result = self.local.execute(action)
        if order["kind"] != "adjust":
            self.restarts.append({"order": order["id"], "attempt": order["attempt"],
                                  "seconds": time.monotonic() - received})
        detail = result.detail.removeprefix(f"order {order['id']}: ")  # the ack names the order already
        ack.join(RETRY_SECONDS + 30)
        if acked and acked[0] is not None:
            raise acked[0]
        self.client.post(f"/orders/{order['id']}/ack", {"status": "done" if result.ok else "failed",
                                                        "detail": detail}, retry_seconds=RETRY_SECONDS)

    # -- the whole run --------------------------------------------------------------------------------
    def _on_signal(self, signum: int, _frame: Any) -> None:
        if self._closing:
            self.local.hurry()  # a second signal while stopping: SIGKILL now
            return
        self._closing = True
        raise Stopped(signum)

    def _trap_signals(self) -> dict[int, Any]:
        if threading.current_thread() is not threading.main_thread():
            return {}
        return {sig: signal.signal(sig, self._on_signal) for sig in STOP_SIGNALS}

    def run(self) -> int:
        """Until every rank of the current attempt exits 0 (0; never for a serving job), or a stop signal (128 +
        the signal)."""
        previous = self._trap_signals()
        try:
            self.local.fill_standbys()  # the zygote imports the preloads while the job registers
            self._start_job()
            while True:
                self._wake.clear()
                with self._orders_lock:
                    pending, self._orders = self._orders, []
                if pending:
                    restarts = [o for o in pending if o["kind"] != "adjust"]
                    for order in ([max(restarts, key=lambda o: o["attempt"])] if restarts else []) + [
                            o for o in pending if o["kind"] == "adjust"]:
                        self.carry_out(order)
                    continue
                # a serving job has no end of its own: a replica that exits 0 stopped serving, and the server
                # orders it replaced (`exit:0+serving`); the job ends when the launcher is stopped
                if self.kind != "serving" and all(c == 0 for c in self.local.exit_codes()):
                    self.say(f"every rank of attempt {self.attempt} finished")
                    self._finish("succeeded", f"every rank of attempt {self.attempt} exited 0")
                    return 0
                self._wake.wait(1.0)
        except (Stopped, KeyboardInterrupt) as stop:
            signum = stop.signum if isinstance(stop, Stopped) else int(signal.SIGINT)
            name = signal.Signals(signum).name
            # said before the ranks are stopped: their exits (SIGTERM) are then the cancellation, no failure
            self._finish("cancelled", f"{name} to the launcher")
            self.say(f"{name}: stopping the ranks and standbys (SIGTERM, {STOP_GRACE_SECONDS:g}s, SIGKILL)")
            return 128 + signum
        finally:
            self._closing = True
            self._stop.set()
            if self.router_queue is not None:
                self.router_queue.close()
            self.local.close()
            for sig, handler in previous.items():
                signal.signal(sig, handler)

    def _finish(self, state: str, reason: str) -> None:
        """Tell the server how the job ended; a server that is away does not hold the stop up (its detectors
        then judge the exits as they come)."""
        if not self.job_id:  # stopped before the job registered
            return
        try:
            self.client.post(f"/jobs/{self.job_id}/finish", {"state": state, "reason": reason},
                             retry_seconds=FINISH_RETRY_SECONDS)
        except (ApiError, httpx.HTTPError) as exc:
            log.warning("could not tell the server job %s %s: %s", self.job_id, state, exc)

    def _start_job(self) -> None:
        spec = {"name": self.name, "kind": self.kind, "world_size": self.nproc,
                "attributes": {"launcher": "sentinel launch", "host": socket.gethostname(),
                               "command": " ".join(self.argv)[:500], **self.attributes}}
        self.local.job_id = int(self.client.post("/jobs", spec)["id"])
        placement = self.client.post(f"/jobs/{self.job_id}/placement", {"nodes": self.nodes})
        self.say(f"job {self.job_id} registered; {self.nproc} rank(s)")
        self.local.start_attempt(placement, 0)
        threading.Thread(target=self._poll_orders, name="sentinel-launch-orders", daemon=True).start()
        router = getattr(self.local, "router", None)  # a serving job's (sentinel/launcher/replicas.py)
        if router is not None:  # its queue, for the batching controller (sentinel/launcher/router_queue.py)
            self.router_queue = RouterQueueReporter(router, self.client, lambda: self.job_id).start()
