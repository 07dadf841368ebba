"""SlurmExecutor against a real one-node Slurm 22.05: munged, slurmctld and slurmd started here under tmp_path.

Covered: drain (state and Sentinel's reason as `scontrol show node` reports them), resume, requeue of a
running `sbatch` job that then stays pending while the node is drained (with and without ExcNodeList),
a job running again after release, scontrol's own error for a bad node, a missing scontrol binary.
Not covered: with one node, a requeued job landing on *another* node is not exercised; neither are
multi-node jobs, job arrays, accounting, or slurmctld being unreachable (scontrol's timeout path).
The daemons run as root (slurmd needs it); without them or root the tests skip, and fail when CI is set.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from sentinel.remediation.executors.base import EXECUTORS, Action, ActionKind, JobRef
from sentinel.remediation.executors.slurm import SlurmExecutor
from tests.remediation.slurm_cluster import SLURM_NODE, SlurmCluster, running_cluster

DRAINED_REASON = "Nodes_required_for_job_are_DOWN,_DRAINED"  # pending reason while the only node is drained

slow = pytest.mark.slow


@pytest.fixture
def slurm(tmp_path: Path) -> Iterator[SlurmCluster]:
    """One node, `sentinel-n1`, idle and ready (~1 s)."""
    with running_cluster(tmp_path) as cluster:
        yield cluster


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
