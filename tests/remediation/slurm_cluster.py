"""A real one-node Slurm 22.05 for tests: munged, slurmctld and slurmd started under a temp dir, stopped by PID.

Shared by tests/remediation/test_slurm_executor.py (a fresh cluster per test) and the Executor contract suite
(tests/contracts/test_executor_contract.py: one cluster for the module, `reset()` between tests). The daemons
run as root (slurmd needs it); without them or root the tests skip, and fail when CI is set.
"""

from __future__ import annotations

import contextlib
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

from sentinel.remediation.executors.slurm import SlurmExecutor
from tests.live import free_port

SLURM_NODE = "sentinel-n1"
DAEMONS = ("munged", "munge", "slurmctld", "slurmd", "scontrol", "sbatch", "scancel")


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

    def node_state(self) -> tuple[str, str]:
        """(state, reason) of `SLURM_NODE` as `scontrol show node` reports them."""
        return self.executor().node_state(SLURM_NODE)

    def wait_node_idle(self) -> None:
        def node_idle() -> bool:
            try:
                return self.node_state()[0] == "IDLE"
            except RuntimeError:
                return False
        self.wait(node_idle, f"{SLURM_NODE} IDLE")

    def cancel_all_jobs(self, timeout_seconds: float = 15) -> None:
        subprocess.run(["scancel", "--user=root"], env=self.env, capture_output=True, timeout=30, check=False)
        deadline = time.monotonic() + timeout_seconds
        while time.monotonic() < deadline and self.jobs_left():
            time.sleep(0.2)

    def reset(self) -> None:
        """Back to a fresh cluster's state for the next test: no jobs, the node resumed, idle, no reason."""
        self.cancel_all_jobs()
        self.wait(lambda: not self.jobs_left(), "no jobs left")
        if "DRAIN" in self.node_state()[0].split("+"):
            self.run("scontrol", "update", f"NodeName={SLURM_NODE}", "State=RESUME")
        self.wait(lambda: self.node_state() == ("IDLE", ""), lambda: f"{SLURM_NODE} IDLE, no reason, it is "
                  f"{self.node_state()}")

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


def write_config(root: Path, munge_socket: Path, extra: str = "") -> Path:
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
{extra}""")
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
        cluster.cancel_all_jobs()
    for proc in reversed(cluster.procs.values()):
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
            try:
                proc.wait(15)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(5)


@contextlib.contextmanager
def running_cluster(root: Path, extra_conf: str = "") -> Iterator[SlurmCluster]:
    """One node, `SLURM_NODE`, idle and ready (~1 s); every daemon stopped on the way out. `extra_conf`:
    slurm.conf lines added at the end (a Prolog, say)."""
    require_slurm()
    for sub in ("state", "spool"):
        (root / sub).mkdir()
    cluster = SlurmCluster(root=root, conf=root / "slurm.conf")
    try:
        write_config(root, start_munged(cluster), extra_conf)
        start(cluster, "slurmctld", ["slurmctld", "-D", "-i"])
        start(cluster, "slurmd", ["slurmd", "-D", "-N", SLURM_NODE])
        cluster.wait_node_idle()
        yield cluster
    finally:
        stop(cluster)
