"""deploy/slurm's prolog run by real Slurm daemons (tests/remediation/slurm_cluster.py: munged, slurmctld,
slurmd) against a real Sentinel server: a healthy node runs the job; a node cordoned in Sentinel fails the
prolog, so Slurm drains it and the job does not run there; a Sentinel that cannot be reached lets the job
run (fail open). The choice of accelerators (SLURM_JOB_GPUS) and the epilog's stricter rule are checked on
the script's own functions. The slurm.conf names a wrapper that only points the script at the test's
settings file, then runs the shipped deploy/slurm/sentinel-prolog.sh."""

from __future__ import annotations

import importlib.util
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest

from tests.factories import registration
from tests.live import LiveServer
from tests.remediation.slurm_cluster import SLURM_NODE, SlurmCluster, running_cluster

ROOT = Path(__file__).resolve().parents[2]
SLURM_DIR = ROOT / "deploy" / "slurm"

pytestmark = pytest.mark.slow


def load_check() -> ModuleType:
    spec = importlib.util.spec_from_file_location("sentinel_node_check", SLURM_DIR / "sentinel_node_check.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.fixture
def server(tmp_path: Path) -> Iterator[LiveServer]:
    live = LiveServer(tmp_path / "server", f"sqlite:///{tmp_path / 'sentinel.db'}").start()
    try:
        yield live
    finally:
        live.stop()


@pytest.fixture
def slurm(tmp_path: Path, server: LiveServer) -> Iterator[SlurmCluster]:
    token_file = tmp_path / "slurm-token"
    token_file.write_text(server.token("viewer", "slurm-prolog") + "\n")
    settings = tmp_path / "slurm.env"
    settings.write_text(f"SENTINEL_SERVER={server.url}\nSENTINEL_TOKEN_FILE={token_file}\n")
    wrapper = tmp_path / "prolog.sh"
    wrapper.write_text(f"#!/bin/sh\nexport SENTINEL_SLURM_ENV={settings}\nexec {SLURM_DIR / 'sentinel-prolog.sh'}\n")
    wrapper.chmod(0o755)
    agent = server.token("agent", "n1", node=SLURM_NODE)
    reply = server.api().post("/nodes/register", json=registration(SLURM_NODE, accelerators=2),
                              headers={"authorization": f"Bearer {agent}"})
    assert reply.status_code == 200, reply.text
    (tmp_path / "slurm").mkdir()
    with running_cluster(tmp_path / "slurm", f"Prolog={wrapper}\n") as cluster:
        yield cluster


def run_job(cluster: SlurmCluster) -> str:
    return cluster.run("sbatch", "--parsable", f"--chdir={cluster.root}", "--output=/dev/null", "--wrap", "true")


def test_a_healthy_node_runs_the_job(slurm: SlurmCluster) -> None:
    job = run_job(slurm)
    slurm.wait_job(job, "COMPLETED")
    assert slurm.node_state()[0] == "IDLE"


def test_a_node_cordoned_in_sentinel_is_drained_by_the_prolog_and_the_job_does_not_run_there(
        slurm: SlurmCluster, server: LiveServer) -> None:
    assert server.api().post(f"/nodes/{SLURM_NODE}/cordon", json={"reason": "xid 79 on gpu1"}).status_code == 200
    job = run_job(slurm)
    def drained() -> tuple[str, str] | None:
        state = slurm.node_state()
        return state if "DRAIN" in state[0] else None
    _, reason = slurm.wait(drained, "the prolog to drain the node")
    assert "prolog" in reason.lower(), reason
    assert slurm.job(job)["JobState"] != "COMPLETED"
    assert "refusing: cordoned in Sentinel: xid 79 on gpu1" in slurm.logs(chars=20_000)


def test_a_sentinel_that_cannot_be_reached_lets_the_job_run(slurm: SlurmCluster, server: LiveServer) -> None:
    server.stop()
    job = run_job(slurm)
    slurm.wait_job(job, "COMPLETED")
    assert slurm.node_state()[0] == "IDLE"


def node(*accelerators: tuple[int, str], admin_state: str = "active") -> dict[str, Any]:
    return {"admin_state": admin_state, "state_reason": "",
            "accelerators": [{"index": i, "uuid": f"GPU-{i}", "health": h, "health_reason": "xid 48"}
                             for i, h in accelerators]}


def test_the_prolog_refuses_only_for_the_jobs_own_accelerators_and_the_epilog_for_any() -> None:
    check = load_check()
    bad_second = node((0, "healthy"), (1, "quarantined"))
    assert check.job_gpus({"SLURM_JOB_GPUS": "0,2-3"}) == {0, 2, 3}
    assert check.job_gpus({"SLURM_JOB_GPUS": "gpu:a100"}) is None and check.job_gpus({}) is None
    assert check.verdict(bad_second, "prolog", {0}) is None
    assert check.verdict(bad_second, "prolog", {1}) == "accelerator 1 (GPU-1) quarantined by Sentinel: xid 48"
    assert check.verdict(bad_second, "prolog", None) is not None  # the job names no GPUs: any bad one counts
    assert check.verdict(bad_second, "epilog", {0}) is not None  # the next job may get it
    assert check.verdict(node((0, "suspect")), "prolog", None) is None
    assert check.verdict(node(admin_state="cordoned"), "prolog", None).startswith("cordoned in Sentinel")


def test_fail_closed_refuses_when_sentinel_cannot_be_asked(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                           capsys: pytest.CaptureFixture[str]) -> None:
    check = load_check()
    monkeypatch.setenv("SENTINEL_SLURM_ENV", str(tmp_path / "none.env"))
    monkeypatch.setenv("SENTINEL_SERVER", "http://127.0.0.1:9")  # discard port: nothing answers
    monkeypatch.setenv("SENTINEL_TOKEN_FILE", str(tmp_path / "token"))
    (tmp_path / "token").write_text("x")
    monkeypatch.setenv("SLURMD_NODENAME", "n9")
    assert check.main(["check", "prolog"]) == 0
    monkeypatch.setenv("SENTINEL_FAIL_CLOSED", "1")
    assert check.main(["check", "prolog"]) == 1
    assert "refusing (SENTINEL_FAIL_CLOSED)" in capsys.readouterr().err
    assert check.main(["check", "sideways"]) == 2
