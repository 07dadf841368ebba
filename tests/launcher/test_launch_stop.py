"""`sentinel launch` stopped by SIGTERM, SIGINT, SIGHUP or SIGKILL leaves no process of the job behind.

Real processes: a server, one agent with two simulated accelerators, and `sentinel launch --nproc 2` with warm
standbys (torch preloaded) of a small script whose ranks each start two helpers, one of them in a session of
its own. What "the job" is comes from the process tree under the launcher, taken once everything runs, and
from an environment marker every descendant inherits; never from process names.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import uuid
from pathlib import Path

import psutil
import pytest

from tests.live import Cluster, sentinel_cmd, wait_for

pytestmark = [pytest.mark.slow, pytest.mark.torch]

MARKER = "SENTINEL_TEST_STOP_MARKER"
JOB = """\
import os, subprocess, sys, time
sleep = [sys.executable, "-c", "import time; time.sleep(600)"]
helpers = [subprocess.Popen(sleep), subprocess.Popen(sleep, start_new_session=True)]
with open(os.path.join(os.environ["OUT_DIR"], "rank" + os.environ["RANK"]), "w") as fh:
    fh.write(" ".join(str(p) for p in [os.getpid(), *(h.pid for h in helpers)]))
time.sleep(600)
"""


def marked(marker: str) -> list[int]:
    """Live (not zombie) processes that carry the marker in their environment."""
    found = []
    for proc in psutil.process_iter(["environ", "status"]):
        try:
            if (proc.info["environ"] or {}).get(MARKER) == marker and proc.info["status"] != psutil.STATUS_ZOMBIE:
                found.append(proc.pid)
        except psutil.Error:
            continue
    return found


def alive(procs: list[psutil.Process]) -> list[psutil.Process]:
    left = []
    for p in procs:
        try:
            if p.is_running() and p.status() != psutil.STATUS_ZOMBIE:  # is_running also checks the start time
                left.append(p)
        except psutil.NoSuchProcess:
            continue
    return left


@pytest.fixture
def cluster(tmp_path: Path):  # type: ignore[no-untyped-def]
    made = Cluster(tmp_path, nodes={"node-a": 2})
    yield made
    made.close()


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGKILL, signal.SIGHUP, signal.SIGINT],
                         ids=lambda s: signal.Signals(s).name)
def test_a_stopped_launcher_leaves_no_rank_standby_or_helper(cluster: Cluster, tmp_path: Path, sig: int) -> None:
    script = tmp_path / "job.py"
    script.write_text(JOB)
    out = tmp_path / "job"
    out.mkdir()
    marker = uuid.uuid4().hex
    env = {**os.environ, "SENTINEL_SERVER": cluster.server.url, "OUT_DIR": str(out), MARKER: marker,
           "SENTINEL_TOKEN": cluster.server.token("launcher", "stopper")}
    log = tmp_path / "launch.log"
    with open(log, "ab") as fh:
        launch = subprocess.Popen(sentinel_cmd("launch", "--job", "stopper", "--nproc", "2", "--", sys.executable,
                                               str(script)), env=env, stdout=fh, stderr=fh, start_new_session=True)
    cluster.procs.append(launch)
    try:
        wait_for(lambda: (out / "rank0").exists() and (out / "rank1").exists()
                 and "warm standby(s) ready" in log.read_text(), timeout=120, what="ranks and standbys running")
        ranks = [[int(p) for p in (out / f"rank{r}").read_text().split()] for r in (0, 1)]
        tree = psutil.Process(launch.pid).children(recursive=True)
        pids = {p.pid for p in tree}
        assert all(pid in pids for rank in ranks for pid in rank), "ranks and helpers are under the launcher"
        [zygote] = psutil.Process(launch.pid).children()  # every process of the job is forked from it
        standbys = [p for p in zygote.children() if p.pid not in {r[0] for r in ranks}]
        assert len(standbys) == 2, f"two standbys waiting: {tree}"
        for standby in standbys:  # forked from the zygote: torch is in memory already
            assert any("libtorch" in m.path for m in standby.memory_maps()), "a warm standby has torch loaded"
        assert set(marked(marker)) == pids | {launch.pid}, "the marker finds the launcher and its tree"
        # the agent watches the ranks' pids once the server has told it of them (a rank gone before that is
        # never seen to exit: not what this test is about)
        wait_for(lambda: all(f"pid{rank[0]}" in (tmp_path / "agent-node-a.log").read_text() for rank in ranks),
                 timeout=20, what="the agent watching both ranks")

        os.kill(launch.pid, sig)
        code = launch.wait(30)

        assert code == (-signal.SIGKILL if sig == signal.SIGKILL else 128 + sig), log.read_text()[-2000:]
        wait_for(lambda: not alive(tree), timeout=20, what="every process of the job gone")
        assert marked(marker) == [], "nothing started later (a refill) is left either"
    finally:
        for pid in marked(marker):  # whatever a failing test left running
            os.kill(pid, signal.SIGKILL)
    job = cluster.job("stopper")
    if sig == signal.SIGKILL:  # no word from the launcher: the tether's kills are failures like any other
        assert job["state"] != "cancelled"
        return
    assert f"{signal.Signals(sig).name}: stopping the ranks and standbys" in log.read_text()
    # the launcher said so before it stopped the ranks: their exits are the cancellation, and page no one
    assert job["state"] == "cancelled"
    wait_for(lambda: all(t["state"] == "exited" for t in cluster.job("stopper")["tasks"]), timeout=20,
             what="both ranks' exits recorded")
    tasks = cluster.job("stopper")["tasks"]
    assert [(t["exit_signal"], t["failure_reason"]) for t in tasks] == [(signal.SIGTERM, "")] * 2
    assert [i["title"] for i in cluster.api.get("/incidents", params={"state": "all"}).json()["incidents"]
            if i["detector"] == "task_exit"] == []
