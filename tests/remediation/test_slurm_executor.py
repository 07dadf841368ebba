"""SlurmExecutor against a real one-node Slurm 22.05: munged, slurmctld and slurmd started here under tmp_path.

Covered: drain (state and Sentinel's reason as `scontrol show node` reports them), resume, requeue of a
running `sbatch` job that then stays pending while the node is drained (with and without ExcNodeList),
a job running again after release, scontrol's own error for a bad node, a missing scontrol binary.
Not covered: with one node, a requeued job landing on *another* node is not exercised; neither are
multi-node jobs, job arrays, accounting, or slurmctld being unreachable (scontrol's timeout path).
The daemons run as root (slurmd needs it); without them or root the tests skip, and fail when CI is set.
"""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from sentinel.remediation.executors.base import EXECUTORS, Action, ActionKind, JobRef
from sentinel.remediation.executors.slurm import SlurmExecutor
from tests.live import free_port

SLURM_NODE = "sentinel-n1"
DAEMONS = ("munged", "munge", "slurmctld", "slurmd", "scontrol", "sbatch", "scancel")
DRAINED_REASON = "Nodes_required_for_job_are_DOWN,_DRAINED"  # pending reason while the only node is drained

slow = pytest.mark.slow


@dataclass
class SlurmCluster:
    root: Path
    conf: Path
    procs: dict[str, subprocess.Popen[bytes]] = field(default_factory=dict)

    @property
    def env(self) -> dict[str, str]:
        return {**os.environ, "SLURM_CONF": str(self.conf)}

    def executor(self, **options: Any) -> SlurmExecutor:
        return SlurmExecutor({"env": {"SLURM_CONF": str(self.conf)}, **options})

    def run(self, *argv: str) -> str:
        done = subprocess.run(argv, env=self.env, capture_output=True, text=True, timeout=30, check=False)
        assert done.returncode == 0, f"{argv} failed: {done.stderr}\n{self.logs()}"
        return done.stdout.strip()

    def submit_sleep(self) -> str:
        return self.run("sbatch", "--parsable", f"--chdir={self.root}", "--output=/dev/null", "--wrap", "sleep 300")

    def job(self, job_id: str) -> dict[str, str]:
        line = self.run("scontrol", "show", "job", "-o", job_id)
        return dict(item.split("=", 1) for item in line.split() if "=" in item)

    def wait(self, predicate: Callable[[], Any], what: str | Callable[[], str], timeout_seconds: float = 30) -> Any:
        deadline = time.monotonic() + timeout_seconds
        while time.monotonic() < deadline:
            if value := predicate():
                return value
            time.sleep(0.2)
        described = what() if callable(what) else what
        raise AssertionError(f"timed out after {timeout_seconds}s waiting for {described}\n{self.logs()}")

    def wait_job(self, job_id: str, state: str, reason_prefix: str = "") -> dict[str, str]:
        def matches() -> dict[str, str] | None:
            job = self.job(job_id)
            return job if job["JobState"] == state and job["Reason"].startswith(reason_prefix) else None

        def what() -> str:
            now = self.job(job_id)
            return f"job {job_id} {state} {reason_prefix} (it is {now['JobState']} {now['Reason']})"
        return self.wait(matches, what)

    def jobs_left(self) -> bool:
        done = subprocess.run(["squeue", "-h"], env=self.env, capture_output=True, text=True, timeout=30, check=False)
        return bool(done.stdout.strip())

    def logs(self, chars: int = 1500) -> str:
        parts = [f"--- {p.name}\n{p.read_text(errors='replace')[-chars:]}" for p in sorted(self.root.glob("*.log"))]
        return "\n".join(parts)


def require_slurm() -> None:
    missing = [name for name in DAEMONS if shutil.which(name) is None]
    problem = f"missing {', '.join(missing)} (apt-get install -y slurm-wlm munge)" if missing else None
    if problem is None and os.geteuid() != 0:
        problem = "slurmd must run as root"
    if problem is not None:
        if os.environ.get("CI"):
            pytest.fail(f"Slurm is required in CI: {problem}")
        pytest.skip(problem)


def write_config(root: Path, munge_socket: Path) -> Path:
    host = socket.gethostname().split(".")[0]
    conf = root / "slurm.conf"
    conf.write_text(f"""\
ClusterName=sentinel-test
SlurmctldHost={host}(127.0.0.1)
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
AuthInfo=socket={munge_socket}
CredType=cred/munge
SlurmctldPort={free_port()}
SlurmdPort={free_port()}
StateSaveLocation={root / "state"}
SlurmdSpoolDir={root / "spool"}
SlurmctldPidFile={root / "slurmctld.pid"}
SlurmdPidFile={root / "slurmd.pid"}
SlurmctldLogFile={root / "slurmctld.log"}
SlurmdLogFile={root / "slurmd.log"}
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
SelectType=select/cons_tres
SelectTypeParameters=CR_Core
ReturnToService=2
MpiDefault=none
SchedulerParameters=batch_sched_delay=0,sched_interval=5
NodeName={SLURM_NODE} NodeHostname={host} NodeAddr=127.0.0.1 CPUs=1 RealMemory=100 State=UNKNOWN
PartitionName=debug Nodes={SLURM_NODE} Default=YES MaxTime=INFINITE State=UP
""")
    return conf


def start(cluster: SlurmCluster, name: str, argv: list[str]) -> None:
    log = open(cluster.root / f"{name}.out.log", "ab")  # noqa: SIM115 - the daemon keeps it
    cluster.procs[name] = subprocess.Popen(argv, env=cluster.env, stdout=log, stderr=subprocess.STDOUT)


def start_munged(cluster: SlurmCluster) -> Path:
    munge_dir = cluster.root / "munge"
    munge_dir.mkdir()
    munge_dir.chmod(0o711)  # munged insists that every user can reach its socket
    key = munge_dir / "munge.key"
    key.write_bytes(os.urandom(1024))
    key.chmod(0o400)
    sock = munge_dir / "munge.sock"
    # --force: pytest's base temp dir is 0700, which munged would otherwise refuse as a socket parent
    start(cluster, "munged", ["munged", "--foreground", "--force", f"--socket={sock}", f"--key-file={key}",
                              f"--pid-file={munge_dir / 'munged.pid'}", f"--seed-file={munge_dir / 'munged.seed'}",
                              f"--log-file={cluster.root / 'munged.log'}"])
    cluster.wait(sock.exists, "munged's socket", timeout_seconds=10)
    return sock


def stop(cluster: SlurmCluster) -> None:
    """Cancel jobs first (slurmstepd outlives slurmd), then stop the daemons by PID, newest first."""
    if "slurmd" in cluster.procs:
        subprocess.run(["scancel", "--user=root"], env=cluster.env, capture_output=True, timeout=30, check=False)
        deadline = time.monotonic() + 15
        while time.monotonic() < deadline and cluster.jobs_left():
            time.sleep(0.2)
    for proc in reversed(cluster.procs.values()):
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
            try:
                proc.wait(15)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(5)


@pytest.fixture
def slurm(tmp_path: Path) -> Iterator[SlurmCluster]:
    """One node, `sentinel-n1`, idle and ready (~1 s)."""
    require_slurm()
    for sub in ("state", "spool"):
        (tmp_path / sub).mkdir()
    cluster = SlurmCluster(root=tmp_path, conf=tmp_path / "slurm.conf")
    try:
        write_config(tmp_path, start_munged(cluster))
        start(cluster, "slurmctld", ["slurmctld", "-D", "-i"])
        start(cluster, "slurmd", ["slurmd", "-D", "-N", SLURM_NODE])
        executor = cluster.executor()

        def node_idle() -> bool:
            try:
                return executor.node_state(SLURM_NODE)[0] == "IDLE"
            except RuntimeError:
                return False
        cluster.wait(node_idle, f"{SLURM_NODE} IDLE")
        yield cluster
    finally:
        stop(cluster)


def drain(cluster: SlurmCluster, reason: str = "xid 79 on gpu0") -> None:
    outcome = cluster.executor().execute(Action("drain_node", SLURM_NODE, reason))
    assert outcome.ok, f"{outcome.detail}\n{cluster.logs()}"


def test_registered_as_slurm() -> None:
    assert EXECUTORS["slurm"] is SlurmExecutor


@slow
def test_drain_node_sets_drain_with_sentinels_reason(slurm: SlurmCluster) -> None:
    executor = slurm.executor(node_map={"gpu-node-1": SLURM_NODE})  # Sentinel's name → Slurm's

    outcome = executor.execute(Action("drain_node", "gpu-node-1", 'XID 79 on gpu0:\n"fallen off the bus"',
                                      incident_id=7))

    assert outcome.ok, outcome.detail
    assert SLURM_NODE in outcome.detail
    state, reason = executor.node_state("gpu-node-1")
    assert "DRAIN" in state.split("+")
    assert reason == 'sentinel: XID 79 on gpu0: "fallen off the bus"'


@slow
def test_release_node_resumes_a_drained_node(slurm: SlurmCluster) -> None:
    drain(slurm)
    executor = slurm.executor()

    outcome = executor.execute(Action("release_node", SLURM_NODE, "repaired"))

    assert outcome.ok, outcome.detail
    # right after RESUME slurmctld pings slurmd and shows IDLE+NOT_RESPONDING for a moment
    slurm.wait(lambda: executor.node_state(SLURM_NODE) == ("IDLE", ""), lambda: f"IDLE, no reason, it is "
               f"{executor.node_state(SLURM_NODE)}")


@slow
def test_move_work_requeues_and_job_runs_again_only_after_release(slurm: SlurmCluster) -> None:
    executor = slurm.executor(exclude_node=False)  # one node: an excluded job could never come back
    job_id = slurm.submit_sleep()
    slurm.wait_job(job_id, "RUNNING")
    drain(slurm)
    jobs = (JobRef(1, "trainer", attributes={"slurm_job_id": job_id}), JobRef(2, "notebook"))

    outcome = executor.execute(Action("move_work", SLURM_NODE, "xid 79", jobs=jobs))

    assert outcome.ok, outcome.detail
    assert f"job {job_id} requeued" in outcome.detail
    assert "skipped, no slurm_job_id: jobs 2 (notebook)" in outcome.detail
    pending = slurm.wait_job(job_id, "PENDING", DRAINED_REASON)  # eligible now (no BeginTime), held by drain
    assert pending["Restarts"] == "1"
    assert slurm.executor().execute(Action("release_node", SLURM_NODE, "repaired")).ok
    running = slurm.wait_job(job_id, "RUNNING")
    assert running["NodeList"] == SLURM_NODE


@slow
def test_move_work_excludes_the_node_for_the_job_even_after_release(slurm: SlurmCluster) -> None:
    job_id = slurm.submit_sleep()
    slurm.wait_job(job_id, "RUNNING")
    drain(slurm)

    outcome = slurm.executor().execute(
        Action("move_work", SLURM_NODE, "xid 79", jobs=(JobRef(1, "trainer", attributes={"slurm_job_id": job_id}),)))

    assert outcome.ok, outcome.detail
    assert f"ExcNodeList+={SLURM_NODE}" in outcome.detail
    pending = slurm.wait_job(job_id, "PENDING", DRAINED_REASON)
    assert pending["ExcNodeList"] == SLURM_NODE
    assert slurm.executor().execute(Action("release_node", SLURM_NODE, "repaired")).ok
    # the only node is now excluded for this job, so Slurm says it can never run here
    slurm.wait_job(job_id, "PENDING", "BadConstraints")


@slow
def test_failing_scontrol_gives_its_message(slurm: SlurmCluster) -> None:
    outcome = slurm.executor().execute(Action("drain_node", "no-such-node", "xid 79"))

    assert not outcome.ok
    assert "Invalid node name specified" in outcome.detail
    assert "\n" not in outcome.detail


def test_missing_scontrol_binary_gives_not_ok(tmp_path: Path) -> None:
    executor = SlurmExecutor({"scontrol": str(tmp_path / "no-scontrol")})

    kinds: tuple[ActionKind, ...] = ("drain_node", "release_node", "move_work")
    for kind in kinds:
        jobs = (JobRef(1, "trainer", attributes={"slurm_job_id": "12"}),)
        outcome = executor.execute(Action(kind, "gpu-node-1", "xid 79", jobs=jobs))
        assert not outcome.ok
        assert "scontrol not found" in outcome.detail
