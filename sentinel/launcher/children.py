"""The launcher's side of the zygote (zygote.py): start it, ask it for processes, follow their exits.

Every rank and standby is a child of the zygote, not of the launcher, so `Child` gives the launcher what it
used from Popen (pid, poll, wait, kill) from the zygote's events. Stopping the zygote stops them all;
the zygote also stops them by itself when the launcher dies.
"""

from __future__ import annotations

import contextlib
import itertools
import json
import logging
import os
import signal
import subprocess
import threading
from collections.abc import Callable
from typing import Any

log = logging.getLogger("sentinel.launch")

START_SECONDS = 30.0  # a fork or exec is answered in milliseconds; this only bounds a wedged zygote


def signal_group(pid: int, sig: int) -> None:
    """`sig` to `pid`'s process group; to `pid` alone when it has not yet called setsid (just forked)."""
    try:
        os.killpg(pid, sig)
    except ProcessLookupError:  # no group led by pid yet: the child is still in its parent's group
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.kill(pid, sig)
    except PermissionError:
        pass


class Child:
    """A process the zygote started: a standby (until given its rank) or an exec'd command."""

    def __init__(self, ident: int, how: str):
        self.ident = ident
        self.how = how  # standby | forked | waited | cold: how the rank came to be (attempt labels)
        self.pid = 0
        self.returncode: int | None = None
        self.error: OSError | None = None
        self.started = threading.Event()  # pid known, or error set
        self.exited = threading.Event()

    def poll(self) -> int | None:
        return self.returncode

    def wait(self, timeout: float | None = None) -> int:
        if not self.exited.wait(timeout):
            raise subprocess.TimeoutExpired(f"pid {self.pid}", timeout or 0.0)
        assert self.returncode is not None
        return self.returncode

    def signal_group(self, sig: int) -> None:
        """`sig` to the child's process group (it leads its own session): the rank and whatever it started."""
        if self.pid and self.returncode is None:
            signal_group(self.pid, sig)

    def kill(self) -> None:
        self.signal_group(signal.SIGKILL)

    def __repr__(self) -> str:
        return f"Child(id={self.ident}, pid={self.pid}, how={self.how}, returncode={self.returncode})"


class Zygote:
    """One zygote process and the children it started; `on_exit` hears of each child's end (any thread)."""

    def __init__(self, interpreter: str, preload: list[str], *, grace_seconds: float,
                 on_exit: Callable[[Child], None] = lambda child: None):
        events_r, events_w = os.pipe()
        cmd = [interpreter, "-m", "sentinel.launcher.zygote", "--events-fd", str(events_w), "--grace",
               str(grace_seconds), *[a for m in preload for a in ("--preload", m)]]
        try:
            self.proc = subprocess.Popen(cmd, stdin=subprocess.PIPE, pass_fds=(events_w,), start_new_session=True)
        finally:
            os.close(events_w)
        self.preload = preload
        self.on_exit = on_exit
        self.ready = threading.Event()  # the preloads are imported: forks from now on are warm at once
        self.gone = threading.Event()  # its events ended: it exited, and its children with it
        self.failed_preloads: list[str] = []
        self.children: dict[int, Child] = {}
        self._ids = itertools.count(1)
        self._lock = threading.RLock()  # RLock: a stop may be hurried from a signal handler mid-send
        threading.Thread(target=self._follow, args=(events_r,), name="sentinel-zygote-events", daemon=True).start()

    @property
    def pid(self) -> int:
        return self.proc.pid

    def alive(self) -> bool:
        return not self.gone.is_set() and self.proc.poll() is None

    def _send(self, request: dict[str, Any]) -> bool:
        with self._lock:
            if self.proc.stdin is None or self.proc.stdin.closed:
                return False
            try:
                self.proc.stdin.write((json.dumps(request) + "\n").encode())
                self.proc.stdin.flush()
                return True
            except (BrokenPipeError, ValueError):
                return False

    def _new(self, how: str) -> Child:
        with self._lock:
            child = Child(next(self._ids), how)
            self.children[child.ident] = child
            return child

    # -- requests -------------------------------------------------------------------------------------
    def fork(self, how: str = "standby") -> Child:
        """A standby, forked as soon as the preloads are in; `started` is set when it waits for its spec."""
        child = self._new(how)
        if not self._send({"op": "fork", "id": child.ident}):
            self._fail(child, OSError("the zygote is gone"))
        return child

    def run(self, child: Child, spec: dict[str, Any]) -> None:
        """Make a standby the rank `spec` describes."""
        self._send({"op": "run", "id": child.ident, "spec": spec})

    def exec(self, argv: list[str], env: dict[str, str]) -> Child:
        """A cold start of `argv`; raises OSError as Popen would (no such command, not executable)."""
        child = self._new("cold")
        if not self._send({"op": "exec", "id": child.ident, "argv": argv, "env": env}):
            self._fail(child, OSError("the zygote is gone"))
        if not child.started.wait(START_SECONDS):
            raise OSError(f"the zygote did not start {argv[0]!r} within {START_SECONDS:g}s")
        if child.error is not None:
            raise child.error
        return child

    def stop(self, grace_seconds: float, wait: bool = True) -> None:
        """SIGTERM to every child's process group, SIGKILL after `grace_seconds`; then the zygote exits."""
        self._send({"op": "stop", "grace": grace_seconds})
        if not wait:
            return
        try:
            self.proc.wait(timeout=grace_seconds + 10)
        except subprocess.TimeoutExpired:
            log.error("zygote did not stop, killing it (its children die with it): pid=%d", self.pid)
            self.proc.kill()
            self.proc.wait(timeout=10)
        self.gone.wait(5)
        with self._lock, contextlib.suppress(OSError):
            if self.proc.stdin is not None:
                self.proc.stdin.close()

    # -- events ---------------------------------------------------------------------------------------
    def _fail(self, child: Child, error: OSError) -> None:
        child.error = error
        child.returncode = -signal.SIGKILL if child.pid else 127
        child.started.set()
        child.exited.set()

    def _follow(self, fd: int) -> None:
        with os.fdopen(fd, "rb") as events:
            for line in events:
                try:
                    self._event(json.loads(line))
                except (ValueError, KeyError) as exc:
                    log.warning("zygote event not understood: pid=%d error=%s", self.pid, exc)
        self.gone.set()
        with self._lock:
            left = [c for c in self.children.values() if not c.exited.is_set()]
            self.children.clear()
        for child in left:  # PR_SET_PDEATHSIG took them with the zygote
            self._fail(child, OSError("the zygote is gone"))
            self.on_exit(child)

    def _event(self, event: dict[str, Any]) -> None:
        if event["event"] == "ready":
            self.failed_preloads = list(event.get("failed", []))
            self.ready.set()
            return
        with self._lock:
            child = self.children.get(int(event["id"]))
            if child is not None and event["event"] == "exit":
                del self.children[child.ident]
        if child is None:
            return
        if event["event"] == "started":
            child.pid = int(event["pid"])
            child.started.set()
        elif event["event"] == "failed":
            number, text = int(event.get("errno") or 0), str(event.get("error", ""))
            self._fail(child, OSError(number, text) if number else OSError(text))
        elif event["event"] == "exit":
            child.returncode = int(event["code"])
            child.exited.set()
            self.on_exit(child)
