"""`sentinel launch --job NAME --nproc N -- python train.py …`: a job launcher for this machine.

It registers the job, asks the server for a placement (healthy, free accelerators; one node when it
fits), starts one process per rank through the local executor (local.py: the environment the SDK and
torch.distributed read, warm standbys), registers each rank as a task, and then carries out Sentinel's
orders: it long-polls for them, acknowledges, has the local executor start the new attempt, and says
`done` (or `failed`) with what that took.

The launcher does not restart anything on its own: a rank that dies is seen by the node agent, the
server decides, and the order comes back here. It ends when every rank of the current attempt exits
0, or on Ctrl-C (the ranks are stopped).
"""

from __future__ import annotations

import logging
import socket
import sys
import threading
import time
from typing import Any, TextIO

from sentinel.client import ApiError, SentinelClient
from sentinel.launcher.local import LocalProcesses, Rank
from sentinel.remediation.executors.base import Action, JobRef

# A server that is away, or a standby still taking over, is asked again for this long before a launcher gives up.
RETRY_SECONDS = 60.0

log = logging.getLogger("sentinel.launch")


class Launcher:
    def __init__(self, client: SentinelClient, *, name: str, nproc: int, argv: list[str], kind: str = "training",
                 nodes: list[str] | None = None, warm: bool = True, preload: list[str] | None = None,
                 poll_seconds: float = 25.0, out: TextIO = sys.stdout):
        if not argv:
            raise ValueError("nothing to launch: give the command after --")
        self.client = client
        self.name, self.nproc, self.argv, self.kind = name, nproc, argv, kind
        self.nodes = nodes or []
        self.poll_seconds = poll_seconds
        env = {"SENTINEL_SERVER": client.server}  # for the checkpoint catalog (sentinel.sdk.checkpoint)
        if client.token:
            env["SENTINEL_TOKEN"] = client.token
        self.local = LocalProcesses(argv=argv, nproc=nproc, env=env, warm=warm, preload=preload,
                                    on_started=self._register_tasks, out=out)
        self.local.label = name
        self._orders: list[dict[str, Any]] = []
        self._orders_lock = threading.Lock()
        self._stop = threading.Event()
        self.restarts: list[dict[str, Any]] = []  # (order id, attempt, seconds from order to ranks started)

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

    def _register_tasks(self, started: list[Rank], attempt: int) -> None:
        for r in started:
            self.client.post(f"/jobs/{self.job_id}/tasks", {"rank": r.rank, "node": r.node,
                                                             "accelerators": r.accelerators, "pid": r.proc.pid,
                                                             "attempt": attempt}, retry_seconds=RETRY_SECONDS)

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
        """Acknowledge, have the local executor start the order's attempt, report `done` or `failed`."""
        received = time.monotonic()
        self.client.post(f"/orders/{order['id']}/ack", {"status": "acknowledged", "detail": "launcher got it"},
                         retry_seconds=RETRY_SECONDS)
        self.say(f"order {order['id']}: {order['kind']} as attempt {order['attempt']} ({order['reason']})")
        slots = order.get("placement") or [{}]
        action = Action("order", str(slots[0].get("node", "")), str(order.get("reason", "")),
                        jobs=(JobRef(self.job_id, self.name, self.kind),), incident_id=order.get("incident_id"),
                        order={**order, "job_id": self.job_id})
        result = self.local.execute(action)
        self.restarts.append({"order": order["id"], "attempt": order["attempt"],
                              "seconds": time.monotonic() - received})
        detail = result.detail.removeprefix(f"order {order['id']}: ")  # the ack names the order already
        self.client.post(f"/orders/{order['id']}/ack", {"status": "done" if result.ok else "failed",
                                                        "detail": detail}, retry_seconds=RETRY_SECONDS)

    # -- the whole run --------------------------------------------------------------------------------
    def run(self) -> int:
        spec = {"name": self.name, "kind": self.kind, "world_size": self.nproc,
                "attributes": {"launcher": "sentinel launch", "host": socket.gethostname(),
                               "command": " ".join(self.argv)[:500]}}
        self.local.job_id = int(self.client.post("/jobs", spec)["id"])
        self.local.fill_standbys()
        placement = self.client.post(f"/jobs/{self.job_id}/placement", {"nodes": self.nodes})
        self.say(f"job {self.job_id} registered; {self.nproc} rank(s)")
        self.local.start_attempt(placement, 0)
        threading.Thread(target=self._poll_orders, name="sentinel-launch-orders", daemon=True).start()
        try:
            while True:
                with self._orders_lock:
                    pending, self._orders = self._orders, []
                if pending:
                    self.carry_out(max(pending, key=lambda o: o["attempt"]))
                    continue
                if all(c == 0 for c in self.local.exit_codes()):
                    self.say(f"every rank of attempt {self.attempt} finished")
                    return 0
                time.sleep(0.02)
        except KeyboardInterrupt:
            self.say("interrupted: stopping the ranks")
            return 130
        finally:
            self._stop.set()
            self.local.close()
