"""The zygote behind the local executor: real processes forked from it, exit codes seen through it, attempts
labelled as they really started, idle standbys asleep on a pipe."""

from __future__ import annotations

import contextlib
import io
import os
import platform
import signal
import sys
import time
from pathlib import Path
from typing import Any

import psutil
import pytest

from sentinel.launcher.children import signal_group
from sentinel.launcher.local import LocalProcesses
from sentinel.remediation.executors.base import Action, JobRef
from tests.live import wait_for

SCRIPT = """\
import os, sys, time
code = int(os.environ.get("EXIT_CODE", "-1"))
with open(os.path.join(os.environ["OUT_DIR"], f"rank{os.environ['RANK']}-{os.environ['SENTINEL_ATTEMPT']}"), "w") as fh:
    fh.write(str(os.getpid()))
if code >= 0:
    sys.exit(code)
time.sleep(60)
"""


def placement() -> list[dict[str, Any]]:
    return [{"rank": r, "node": "node-a", "accelerators": [f"GPU-{r}"]} for r in range(2)]


def order(attempt: int) -> Action:
    return Action("order", "node-a", "test", jobs=(JobRef(7, "job"),),
                  order={"id": f"o{attempt}", "job_id": 7, "kind": "restart", "attempt": attempt,
                         "placement": placement()})


@pytest.fixture
def make(tmp_path: Path) -> Any:
    script = tmp_path / "job.py"
    script.write_text(SCRIPT)
    made: list[tuple[LocalProcesses, io.StringIO]] = []

    def build(warm: bool = True, **env: str) -> tuple[LocalProcesses, io.StringIO]:
        out = io.StringIO()
        local = LocalProcesses(argv=[sys.executable, str(script)], nproc=2, env={"OUT_DIR": str(tmp_path), **env},
                               warm=warm, preload=["json"], out=out)
        local.job_id = 7
        made.append((local, out))
        return local, out

    yield build
    for local, _ in made:
        local.close(grace_seconds=1)


def started_line(out: io.StringIO, attempt: int) -> str:
    return next(line for line in out.getvalue().splitlines() if f"attempt {attempt} started" in line)


def standbys_ready(out: io.StringIO, count: int) -> bool:
    return out.getvalue().count("warm standby(s) ready") >= count


def test_a_restart_with_ready_standbys_is_warm_and_its_ranks_are_those_standbys(make: Any) -> None:
    local, out = make()
    local.start_attempt(placement(), 0)
    wait_for(lambda: standbys_ready(out, 1), timeout=30, what="standbys after attempt 0")
    zygote = local.zygote()
    waiting = {s.pid for s in local.standbys}
    assert len(waiting) == 2 and {p.pid for p in psutil.Process(zygote.pid).children()} >= waiting

    outcome = local.execute(order(1))

    assert outcome.ok, outcome.detail
    assert "(warm, port" in started_line(out, 1)
    assert {r.proc.pid for r in local.ranks} == waiting, "the ranks are the standbys that were waiting"
    assert "(not warm: " in started_line(out, 0), "attempt 0 had no standby ready: it waited for the preloads"


def test_an_attempt_without_ready_standbys_says_so(make: Any) -> None:
    local, out = make()
    local.start_attempt(placement(), 0)
    wait_for(lambda: standbys_ready(out, 1), timeout=30, what="standbys after attempt 0")
    for standby in list(local.standbys):  # the standbys are gone when the fault comes
        standby.kill()
        standby.wait(10)

    assert local.execute(order(1)).ok

    assert "(not warm: 2 forked on demand, port" in started_line(out, 1)


def test_a_cold_launcher_says_every_rank_started_cold(make: Any) -> None:
    local, out = make(warm=False)
    local.start_attempt(placement(), 0)
    assert "(cold: 2 of 2 rank(s) started fresh, no standby, port" in started_line(out, 0)
    assert local.standbys == []


@pytest.mark.parametrize("warm", [True, False], ids=["warm", "cold"])
def test_exit_codes_come_through_the_zygote(make: Any, warm: bool) -> None:
    local, _ = make(warm=warm, EXIT_CODE="3")
    local.start_attempt(placement(), 0)
    wait_for(lambda: local.exit_codes() == [3, 3], timeout=30, what="both ranks exited 3")


@pytest.mark.parametrize("warm", [True, False], ids=["warm", "cold"])
def test_a_killed_rank_reads_as_popen_would(make: Any, warm: bool) -> None:
    local, _ = make(warm=warm)
    local.start_attempt(placement(), 0)
    assert local.exit_codes() == [None, None]

    psutil.Process(local.ranks[1].proc.pid).send_signal(signal.SIGKILL)

    wait_for(lambda: local.exit_codes() == [None, -signal.SIGKILL], timeout=10, what="rank 1's end seen")


READ_SYSCALL = {"x86_64": "0", "aarch64": "63"}


@pytest.mark.skipif(platform.machine() not in READ_SYSCALL, reason="read(2)'s number known for x86-64 and arm64")
def test_an_idle_standby_sleeps_in_a_read_on_its_pipe(make: Any) -> None:
    local, out = make()
    local.fill_standbys(announce=True)
    assert standbys_ready(out, 1)
    for standby in local.standbys:
        syscall = Path(f"/proc/{standby.pid}/syscall")
        wait_for(lambda s=syscall: s.read_text().split()[0] == READ_SYSCALL[platform.machine()], timeout=10,
                 what="the standby blocked in read(2)")
        time.sleep(0.2)
        assert syscall.read_text().split()[0] == READ_SYSCALL[platform.machine()], "still in read(2): not polling"
        assert psutil.Process(standby.pid).status() == psutil.STATUS_SLEEPING



def reaped_within(pid: int, seconds: float) -> int | None:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        done, status = os.waitpid(pid, os.WNOHANG)
        if done:
            return os.waitstatus_to_exitcode(status)
        time.sleep(0.01)
    return None


def test_a_child_killed_before_it_leads_its_own_group_still_dies() -> None:
    """The window between the zygote's fork and the child's setsid: killpg(pid) finds no group there, so a
    standby killed in it (CI: its start reported, the child not yet scheduled) lived on, and no exit came."""
    pid = os.fork()
    if pid == 0:  # still in the test's process group, as a fresh fork is in the zygote's
        time.sleep(30)
        os._exit(0)
    try:
        signal_group(pid, signal.SIGKILL)
        assert reaped_within(pid, 10) == -signal.SIGKILL
    finally:
        with contextlib.suppress(ChildProcessError, ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
            os.waitpid(pid, 0)
