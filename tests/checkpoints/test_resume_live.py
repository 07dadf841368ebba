"""Kill -9 a rank of a real 2-process gloo job in the middle of an asynchronous checkpoint save.

The server's recovery plan picks the last fully committed step, Sentinel restarts the job, every rank
resumes from that step, and at the end the weights are bitwise equal to a run that was never
interrupted (same seed, same data order). Real server, agents, launcher and torch processes; SQLite
only, as the other live tests (the catalog's SQL runs on both databases in test_catalog.py).
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from tests.live import DEMO_JOB, Cluster, free_port, wait_for

pytestmark = [pytest.mark.slow, pytest.mark.torch]
STEPS = 60


def events(out: Path) -> list[list[str]]:
    """[rank, attempt, event, step, …] from the job's checkpoints.log."""
    path = out / "checkpoints.log"
    return [line.split() for line in path.read_text().splitlines()] if path.exists() else []


def uninterrupted(out: Path) -> None:
    """The same job, never stopped and never checkpointing, for the bitwise comparison."""
    out.mkdir()
    port = str(free_port())
    procs = [subprocess.Popen([sys.executable, *DEMO_JOB], env={
        **os.environ, "RANK": str(rank), "WORLD_SIZE": "2", "MASTER_PORT": port, "OUT_DIR": str(out),
        "STEPS": str(STEPS), "FINAL_OUT": "1", "STEP_SLEEP": "0"}) for rank in (0, 1)]
    for proc in procs:
        assert proc.wait(120) == 0


def test_kill9_mid_save_resumes_from_the_last_committed_step_bitwise(tmp_path):
    torch = pytest.importorskip("torch")
    cluster = Cluster(tmp_path)
    out = tmp_path / "job"
    try:
        launcher = cluster.launch("resumable", {
            "STEPS": str(STEPS), "CKPT_EVERY": "10", "FINAL_OUT": "1",
            "CKPT_WRITE_BPS": "400000",  # a ~0.5 MB save takes over a second: time to kill in the middle
            "SENTINEL_CHECKPOINT_WHEN_BUSY": "wait",  # each save waits for the last: step 20 is not coalesced away
            "SENTINEL_CHECKPOINT_LOCAL_DIR": str(tmp_path / "ckpt" / "{node}")})
        job_id = 0

        def committed(step: int) -> bool:
            nonlocal job_id
            job_id = job_id or cluster.job("resumable").get("id", 0)
            rows = cluster.api.get(f"/jobs/{job_id}/checkpoints").json() if job_id else []
            return any(c["step"] == step and c["state"] == "committed" for c in rows)

        wait_for(lambda: committed(20), timeout=120, what="step 20 committed")
        saving = wait_for(lambda: next((e for e in events(out) if e[:4] == ["1", "0", "saving", "30"]), None),
                          timeout=60, what="rank 1 saving step 30")
        assert ["1", "0", "written", "30"] not in [e[:4] for e in events(out)], "the save finished too soon"
        os.kill(int(saving[4]), signal.SIGKILL)  # rank 1, mid-write

        assert launcher.wait(180) == 0, cluster.logs()
        restored = [e for e in events(out) if e[2] == "restored"]
        assert {(e[0], e[3]) for e in restored if e[1] == "1"} == {("0", "20"), ("1", "20")}, restored

        def settled() -> dict[str, Any] | None:  # lost_steps is set by the remediation tick once attempt 1 steps
            orders = cluster.api.get(f"/jobs/{job_id}/orders", params={"state": "all"}).json()
            return next((o for o in orders if o["attempt"] == 1 and o["lost_steps"] is not None), None)

        order = wait_for(settled, timeout=30, what="attempt 1's order to count its lost steps")
        assert order["checkpoint_step"] == 20
        assert 0 < order["lost_steps"] <= 20  # only what followed step 20
    finally:
        cluster.close()

    uninterrupted(tmp_path / "clean")
    for rank in (0, 1):
        resumed = torch.load(out / f"final-rank{rank}.pt")
        clean = torch.load(tmp_path / "clean" / f"final-rank{rank}.pt")
        assert resumed.keys() == clean.keys()
        assert all(torch.equal(resumed[k], clean[k]) for k in clean), f"rank {rank} diverged after the resume"
