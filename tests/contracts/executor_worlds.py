"""The worlds the Executor contract runs each executor in (tests/contracts/test_executor_contract.py): one
harness per implementation that builds it, prepares its world for an action and tells whether the world shows
the action done. Test doubles here are named as such; Slurm is real daemons (tests/remediation/slurm_cluster.py)."""

from __future__ import annotations

import asyncio
import io
import json
import socket
import sys
import threading
import time
import uuid
from abc import ABC, abstractmethod
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, ClassVar, cast

import pytest

from sentinel.alerting.notifiers.webhook import REPLAY_TOLERANCE_SECONDS, verify_signature
from sentinel.launcher.local import LocalProcesses
from sentinel.remediation.executors.base import Action, ActionKind, Executor, JobRef
from sentinel.remediation.executors.kubernetes import (
    CORDONED_ANNOTATION,
    QUARANTINE_TAINT_KEY,
    REASON_ANNOTATION,
    KubernetesExecutor,
)
from sentinel.remediation.executors.launcher import LauncherExecutor, OrderBoard
from sentinel.remediation.executors.slurm import SlurmExecutor
from tests.alerting.alerting_helpers import LoopbackReceiver
from tests.remediation.kube_api import TOKEN, FakeKubeApiServer
from tests.remediation.slurm_cluster import SLURM_NODE, SlurmCluster

DETAIL_MAX_CHARS = 400
WAIT_SECONDS = 30.0
POLL_SECONDS = 0.1
# an incident title as detectors write them, with a driver message's line break in it
REASON = 'XID 79 on GPU-0bad: "fallen off the bus"\nreported by the driver at 12:00:01'
SECRET = "order-hook-secret-7c1e"
BAD_UUID = "GPU-0b1c2d3e-0000-4000-8000-000000000bad"
GOOD_UUID = "GPU-0b1c2d3e-0000-4000-8000-000000000900"


def wait_until(predicate: Callable[[], bool], what: str | Callable[[], str],
               timeout_seconds: float = WAIT_SECONDS) -> None:
    deadline = time.monotonic() + timeout_seconds
    while not predicate():
        if time.monotonic() >= deadline:
            raise AssertionError(f"timed out after {timeout_seconds:g}s waiting for "
                                 f"{what() if callable(what) else what}")
        time.sleep(POLL_SECONDS)


def closed_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


@dataclass(frozen=True)
class Unknown:
    """An action naming what the world does not know. `refused=False` declares that this world cannot tell:
    the action is then ok, says `says`, and `untouched()` proves it reached nothing the world does know."""

    action: Action
    refused: bool = True
    why: str = ""
    says: str = ""
    untouched: Callable[[], bool] | None = None


@dataclass(frozen=True)
class Away:
    """The executor with its world away. `still_ok` declares that part of the work needs none of what is away
    (`still_done` shows it done); the failure is then logged with `says`, else the detail says it."""

    executor: Executor
    action: Action
    says: str
    still_ok: bool = False
    still_done: Callable[[], bool] | None = None


class Harness(ABC):
    """One executor in its world. `known_bugs`: (contract point, kind) → what goes wrong today."""

    name: ClassVar[str]
    known_bugs: ClassVar[dict[tuple[str, str], str]] = {}
    secrets: tuple[str, ...] = ()

    def __init__(self, request: pytest.FixtureRequest, tmp_path: Path):
        self.request, self.tmp_path = request, tmp_path

    @property
    @abstractmethod
    def executor(self) -> Executor: ...

    @abstractmethod
    def prepare(self, kind: str) -> Action:
        """Make the world ready for a valid `kind` action (a drained node to release, running work to move)."""

    @abstractmethod
    def done(self, action: Action) -> bool:
        """Does the world show `action` carried out?"""

    @abstractmethod
    def world(self) -> Any:
        """What actions change, comparable with ==."""

    @abstractmethod
    def unknown(self, kind: str) -> Unknown: ...

    @abstractmethod
    def away(self, kind: str) -> Away: ...

    def subject(self, action: Action) -> str:
        return str(action.order["id"]) if action.order else action.node

    def settle(self) -> None:
        """Wait for work the executor left running in the background."""
        return None

    def close(self) -> None:
        return None


class SlurmHarness(Harness):
    """A real one-node Slurm, one per module (`slurm_cluster`), reset before each test that touches it."""

    name = "slurm"

    def __init__(self, request: pytest.FixtureRequest, tmp_path: Path):
        super().__init__(request, tmp_path)
        self._cluster: SlurmCluster | None = None
        self.jobs: list[str] = []

    @property
    def cluster(self) -> SlurmCluster:
        if self._cluster is None:
            self._cluster = cast(SlurmCluster, self.request.getfixturevalue("slurm_cluster"))
            self._cluster.reset()
        return self._cluster

    @property
    def executor(self) -> Executor:
        return self.cluster.executor()

    def running_job(self) -> JobRef:
        job_id = self.cluster.submit_sleep()
        self.jobs.append(job_id)
        self.cluster.wait_job(job_id, "RUNNING")
        return JobRef(1, "trainer", attributes={"slurm_job_id": job_id})

    def prepare(self, kind: str) -> Action:
        if kind == "release_node":
            self.cluster.run("scontrol", "update", f"NodeName={SLURM_NODE}", "State=DRAIN",
                             "Reason=sentinel: an earlier incident")
            self.cluster.wait(lambda: self.world()["node"][0], f"{SLURM_NODE} drained")
            return Action("release_node", SLURM_NODE, "repaired")
        if kind == "move_work":
            return Action("move_work", SLURM_NODE, REASON, jobs=(self.running_job(),), incident_id=41)
        return Action(cast(ActionKind, kind), SLURM_NODE, REASON, incident_id=41)

    def done(self, action: Action) -> bool:
        drained, reason = self.world()["node"]
        if action.kind == "drain_node":
            return drained and reason == "sentinel: " + " ".join(action.reason.split())
        if action.kind == "release_node":
            return not drained and reason == ""
        job = self.cluster.job(str(action.jobs[0].attributes["slurm_job_id"]))
        return job["JobState"] == "PENDING" and job["Restarts"] == "1"  # requeued once, not running anywhere

    def world(self) -> dict[str, Any]:
        state, reason = self.cluster.node_state()
        jobs = {job_id: self.cluster.job(job_id) for job_id in self.jobs}
        return {"node": ("DRAIN" in state.split("+"), reason),
                "jobs": {job_id: (j["JobState"], j["Restarts"], j["ExcNodeList"]) for job_id, j in jobs.items()}}

    def unknown(self, kind: str) -> Unknown:
        jobs = (self.running_job(),) if kind == "move_work" else ()
        return Unknown(Action(cast(ActionKind, kind), "no-such-node", REASON, jobs=jobs))

    def away(self, kind: str) -> Away:
        executor = SlurmExecutor({"scontrol": str(self.tmp_path / "no-scontrol")})
        jobs = (JobRef(1, "trainer", attributes={"slurm_job_id": "12"}),)
        return Away(executor, Action(cast(ActionKind, kind), SLURM_NODE, REASON, jobs=jobs), says="scontrol not found")


class KubernetesHarness(Harness):
    """The in-tree API server double (tests/remediation/kube_api.py), through the real `kubernetes` client."""

    name = "kubernetes"
    secrets = (TOKEN,)
    K8S_NODE = "ip-10-0-0-7"

    def __init__(self, request: pytest.FixtureRequest, tmp_path: Path):
        super().__init__(request, tmp_path)
        self.api = FakeKubeApiServer()
        self.api.start()
        self.api.add_node(self.K8S_NODE)
        self.api.add_pod("train-0", node=self.K8S_NODE, gpus=1, visible_devices=BAD_UUID)
        self.api.add_pod("train-1", node=self.K8S_NODE, gpus=1, visible_devices=GOOD_UUID)
        self._executor = self.executor_at(self.api.url)

    def executor_at(self, url: str) -> KubernetesExecutor:
        return KubernetesExecutor({"host": url, "token": TOKEN, "node_map": {"gpu-7": self.K8S_NODE},
                                   "timeout_seconds": 5})

    @property
    def executor(self) -> Executor:
        return self._executor

    def prepare(self, kind: str) -> Action:
        if kind == "release_node":
            node = self.api.nodes[self.K8S_NODE]
            node["spec"] = {"unschedulable": True,
                            "taints": [{"key": QUARANTINE_TAINT_KEY, "value": "xid-79", "effect": "NoSchedule"}]}
            node["metadata"]["annotations"] = {REASON_ANNOTATION: "xid 79", CORDONED_ANNOTATION: "true"}
            node["metadata"]["resourceVersion"] = self.api.next_resource_version()
            return Action("release_node", "gpu-7", "repaired")
        return Action(cast(ActionKind, kind), "gpu-7", REASON, (BAD_UUID,), incident_id=41)

    def done(self, action: Action) -> bool:
        spec = self.api.nodes[self.K8S_NODE]["spec"]
        ours = [t for t in spec.get("taints") or [] if t["key"] == QUARANTINE_TAINT_KEY]
        if action.kind == "drain_node":
            return spec.get("unschedulable") is True and [t["effect"] for t in ours] == ["NoSchedule"]
        if action.kind == "release_node":
            annotations = self.api.nodes[self.K8S_NODE]["metadata"].get("annotations") or {}
            return not spec.get("unschedulable") and not ours and not any(k.startswith("sentinel.dev/")
                                                                          for k in annotations)
        return "default/train-0" in self.api.evicted() and set(self.api.pods) == {"default/train-1"}

    def world(self) -> dict[str, Any]:
        nodes = {name: (node["spec"], node["metadata"].get("annotations")) for name, node in self.api.nodes.items()}
        return json.loads(json.dumps({"nodes": nodes, "pods": sorted(self.api.pods)}))

    def unknown(self, kind: str) -> Unknown:
        return Unknown(Action(cast(ActionKind, kind), "gpu-9", REASON, (BAD_UUID,)))

    def away(self, kind: str) -> Away:
        executor = self.executor_at(f"http://127.0.0.1:{closed_port()}")
        return Away(executor, Action(cast(ActionKind, kind), "gpu-7", REASON, (BAD_UUID,)), says="unreachable")

    def close(self) -> None:
        self.api.stop()


def order_for(job_id: int, attempt: int, placement: list[dict[str, Any]], kind: str = "restart") -> dict[str, Any]:
    """An order as its launcher gets it (sentinel/remediation/orders.py `order_dict`)."""
    return {"id": f"order-{job_id}-{attempt}-{uuid.uuid4().hex[:8]}", "job_id": job_id, "kind": kind,
            "attempt": attempt, "placement": placement, "reason": "incident #41: XID 79", "incident_id": 41,
            "state": "pending", "created_at": "2030-05-06T07:08:09+00:00", "deadline_at": "2030-05-06T07:09:09+00:00"}


def order_action(job: JobRef, order: dict[str, Any]) -> Action:
    return Action("order", str(order["placement"][0]["node"]), str(order["reason"]), jobs=(job,), incident_id=41,
                  order=order)


class LongPollers:
    """Launchers long-polling the board, as GET /api/v1/jobs/{id}/orders?wait= does, on a loop of their own."""

    def __init__(self, board: OrderBoard):
        self.board = board
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, daemon=True)
        self.thread.start()
        self.returned: dict[int, threading.Event] = {}

    def poll(self, job_id: int, timeout_seconds: float = 120) -> None:
        returned = self.returned[job_id] = threading.Event()

        async def wait() -> None:
            await self.board.wait(job_id, timeout_seconds)
            returned.set()

        asyncio.run_coroutine_threadsafe(wait(), self.loop)
        # the loop runs callbacks in order: once this no-op is done, wait() has put itself on the board
        asyncio.run_coroutine_threadsafe(asyncio.sleep(0), self.loop).result(timeout=10)

    def woken(self, job_id: int) -> bool:
        """Its poll returned long before its timeout: an order woke it."""
        return job_id in self.returned and self.returned[job_id].is_set()

    def close(self) -> None:
        async def cancel_all() -> None:
            tasks = [t for t in asyncio.all_tasks() if t is not asyncio.current_task()]
            for task in tasks:
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)

        asyncio.run_coroutine_threadsafe(cancel_all(), self.loop).result(timeout=10)
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(timeout=10)
        self.loop.close()


class LauncherHarness(Harness):
    """A real board with launchers long-polling it, and a loopback webhook that checks each push's signature."""

    name = "launcher"
    secrets = (SECRET,)
    JOB_ID = 7

    def __init__(self, request: pytest.FixtureRequest, tmp_path: Path):
        super().__init__(request, tmp_path)
        self.webhook = LoopbackReceiver().__enter__()
        self.board = OrderBoard()
        self.pollers = LongPollers(self.board)
        self._executor = LauncherExecutor(board=self.board, secret=lambda: SECRET)
        self.placement = [{"rank": 0, "node": "node-a", "accelerators": [GOOD_UUID], "agent_url": None}]

    @property
    def executor(self) -> Executor:
        return self._executor

    def job(self, job_id: int, webhook: str | None) -> JobRef:
        return JobRef(job_id, "trainer", attributes={"order_webhook": webhook} if webhook else {})

    def prepare(self, kind: str) -> Action:
        self.pollers.poll(self.JOB_ID)
        job = self.job(self.JOB_ID, f"{self.webhook.url}/jobs/{self.JOB_ID}/orders")
        return order_action(job, order_for(self.JOB_ID, 1, self.placement))

    def received(self) -> dict[str, Any]:
        """Orders the webhook got with a valid, fresh signature, by idempotency key."""
        return {r.headers.get("idempotency-key", ""): r.json()["order"] for r in self.webhook.requests
                if verify_signature(SECRET, r.body, r.headers.get("x-sentinel-signature"),
                                    max_age_seconds=REPLAY_TOLERANCE_SECONDS,
                                    timestamp_header=r.headers.get("x-sentinel-timestamp"))}

    def done(self, action: Action) -> bool:
        assert action.order is not None
        return self.pollers.woken(action.jobs[0].id) and self.received().get(action.order["id"]) == action.order

    def world(self) -> dict[str, Any]:
        return {"woken": sorted(j for j in self.pollers.returned if self.pollers.woken(j)), "orders": self.received()}

    def settle(self) -> None:
        for push in list(self._executor.pushes):
            push.join(timeout=WAIT_SECONDS)
            assert not push.is_alive(), f"webhook push {push.name} still running after {WAIT_SECONDS:g}s"

    def unknown(self, kind: str) -> Unknown:
        self.pollers.poll(self.JOB_ID)
        ghost = order_action(self.job(999, None), order_for(999, 1, self.placement))
        return Unknown(ghost, refused=False, says="0 waiting launcher(s) woken",
                       why="the launcher executor cannot know which jobs exist: an order is kept in SQL and a launcher "
                           "not polling now gets it on its next poll, so ok with nobody woken is the honest answer",
                       untouched=lambda: self.board.announce(self.JOB_ID) == 1)  # job 7's launcher still waits

    def away(self, kind: str) -> Away:
        self.pollers.poll(8)
        action = order_action(self.job(8, f"http://127.0.0.1:{closed_port()}/orders"), order_for(8, 1, self.placement))
        return Away(self.executor, action, says="webhook unreachable", still_ok=True,
                    still_done=lambda: self.pollers.woken(8))

    def close(self) -> None:
        self.settle()
        self.pollers.close()
        self.webhook.__exit__(None, None, None)


MARKER_ENV = "SENTINEL_CONTRACT_WORLD"


def live_processes(marker: str) -> dict[int, dict[str, str]]:
    """The environment of every live (not zombie) process on this machine started with `marker`."""
    found: dict[int, dict[str, str]] = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            environ = (entry / "environ").read_bytes()
            state = (entry / "stat").read_text().rsplit(")", 1)[1].split()[0]
        except (OSError, IndexError):
            continue  # gone meanwhile, or not ours to read
        env = dict(item.split("=", 1) for item in environ.decode(errors="replace").split("\0") if "=" in item)
        if env.get(MARKER_ENV) == marker and state != "Z":
            found[int(entry.name)] = env
    return found


class LocalHarness(Harness):
    """Real processes on this machine (a sleeping Python per rank, started cold), found again through /proc."""

    name = "local"
    JOB_ID = 7
    SLEEP = [sys.executable, "-c", "import time; time.sleep(120)"]

    def __init__(self, request: pytest.FixtureRequest, tmp_path: Path):
        super().__init__(request, tmp_path)
        self.marker = uuid.uuid4().hex
        self.made: list[LocalProcesses] = []
        self._executor = self.local(self.SLEEP)

    def local(self, argv: list[str]) -> LocalProcesses:
        executor = LocalProcesses(argv=argv, nproc=2, env={MARKER_ENV: self.marker}, warm=False, out=io.StringIO())
        executor.job_id = self.JOB_ID
        self.made.append(executor)
        return executor

    @property
    def executor(self) -> Executor:
        return self._executor

    @staticmethod
    def placement(*nodes: str) -> list[dict[str, Any]]:
        return [{"rank": rank, "node": node, "accelerators": [f"GPU-{node}-{rank}"], "agent_url": None}
                for rank, node in enumerate(nodes)]

    def ranks(self, attempt: int, placement: list[dict[str, Any]]) -> bool:
        got = sorted((env["RANK"], env["SENTINEL_ATTEMPT"], env["SENTINEL_NODE"], env["SENTINEL_ACCELERATORS"])
                     for env in live_processes(self.marker).values())
        return got == [(str(s["rank"]), str(attempt), s["node"], ",".join(s["accelerators"])) for s in placement]

    def running_attempt_zero(self) -> None:
        first = self.placement("node-a", "node-a")
        self._executor.start_attempt(first, 0)
        wait_until(lambda: self.ranks(0, first), "attempt 0 running")

    def prepare(self, kind: str) -> Action:
        self.running_attempt_zero()
        job = JobRef(self.JOB_ID, "trainer")
        return order_action(job, order_for(self.JOB_ID, 1, self.placement("node-a", "node-b")))

    def done(self, action: Action) -> bool:
        assert action.order is not None  # exactly its ranks, of its attempt, where it placed them: the old ones gone
        return self.ranks(int(action.order["attempt"]), action.order["placement"])

    def world(self) -> list[tuple[int, str, str]]:
        return sorted((pid, env["RANK"], env["SENTINEL_ATTEMPT"]) for pid, env in live_processes(self.marker).items())

    def unknown(self, kind: str) -> Unknown:
        self.running_attempt_zero()
        return Unknown(order_action(JobRef(8, "other"), order_for(8, 1, self.placement("node-a", "node-b"))))

    def away(self, kind: str) -> Away:
        executor = self.local([str(self.tmp_path / "no-such-command")])
        action = order_action(JobRef(self.JOB_ID, "trainer"), order_for(self.JOB_ID, 1, self.placement("node-a")))
        return Away(executor, action, says="not started")

    def close(self) -> None:
        for executor in self.made:
            executor.close()
        left = live_processes(self.marker)
        assert not left, f"processes left running after close(): {sorted(left)}"


HARNESSES: dict[str, type[Harness]] = {h.name: h for h in (SlurmHarness, KubernetesHarness, LauncherHarness,
                                                           LocalHarness)}
