"""A tethered process (how `sentinel demo` starts its server, agents and launcher) ends with its parent, even
when the parent is SIGKILLed; real processes."""

from __future__ import annotations

import os
import signal
import subprocess
import sys

import psutil

from tests.live import wait_for

PARENT = """\
import subprocess, sys, time
from sentinel.launcher.tether import tethered
child = subprocess.Popen(tethered([sys.executable, "-c", "import time; time.sleep(120)"]), start_new_session=True)
print(child.pid, flush=True)
time.sleep(120)
"""


def start_parent() -> tuple[subprocess.Popen[str], psutil.Process]:
    parent = subprocess.Popen([sys.executable, "-c", PARENT], stdout=subprocess.PIPE, text=True,
                              env={**os.environ, "PYTHONPATH": os.getcwd()})
    assert parent.stdout is not None
    child = psutil.Process(int(parent.stdout.readline()))
    wait_for(lambda: "time.sleep(120)" in " ".join(child.cmdline()), timeout=10, what="the command exec'd")
    return parent, child


def test_a_tethered_command_runs_in_place_and_ends_when_its_parent_is_killed() -> None:
    parent, child = start_parent()
    try:
        assert child.ppid() == parent.pid, "exec'd in place: same pid, still the parent's child"
        assert child.is_running()

        parent.send_signal(signal.SIGKILL)
        parent.wait(10)

        wait_for(lambda: not child.is_running() or child.status() == psutil.STATUS_ZOMBIE, timeout=10,
                 what="the tethered command gone with its parent")
    finally:
        if child.is_running():
            child.kill()


# Each word is written whole (to a side file, then renamed): a plain write_text truncates first, and the test
# once read the empty file between the truncate and the write (CI, a loaded machine).
GRACEFUL = """\
import os, pathlib, signal, sys, time
def say(word):
    side = pathlib.Path(sys.argv[1] + ".part")
    side.write_text(word)
    os.replace(side, sys.argv[1])
signal.signal(signal.SIGTERM, lambda *_: (say("SIGTERM"), sys.exit(0)))
say("ready")
time.sleep(120)
"""


def test_the_tethered_command_gets_sigterm_so_it_can_stop_what_it_runs(tmp_path) -> None:  # type: ignore[no-untyped-def]
    said = tmp_path / "said"
    script = tmp_path / "graceful.py"
    script.write_text(GRACEFUL)
    parent = subprocess.Popen([sys.executable, "-c", PARENT.replace(
        '[sys.executable, "-c", "import time; time.sleep(120)"]', f"[sys.executable, {str(script)!r}, {str(said)!r}]")],
        stdout=subprocess.PIPE, text=True, env={**os.environ, "PYTHONPATH": os.getcwd()})
    assert parent.stdout is not None
    child = psutil.Process(int(parent.stdout.readline()))
    try:
        wait_for(lambda: said.exists(), timeout=10, what="the command running, its SIGTERM handler in place")
        parent.send_signal(signal.SIGKILL)
        parent.wait(10)
        wait_for(lambda: said.read_text() != "ready", timeout=10, what="the command told of its parent's end")
        assert said.read_text() == "SIGTERM"
    finally:
        if child.is_running():
            child.kill()
