"""The zygote: `python -m sentinel.launcher.zygote --events-fd N [--preload torch …]`, one per launcher.

It imports the heavy modules once, then forks every process of the job on request, so a warm standby costs a
fork (milliseconds, pages shared copy-on-write) instead of an interpreter start and `import torch` (seconds).
It stays single-threaded and never touches torch's thread pools or an accelerator, so a fork is as safe as
torch's own multiprocessing 'fork' start method.

Control, one JSON object a line on stdin (from the launcher):
  {"op": "fork", "id": I}                     a standby: blocks on its own pipe until it is given a spec
  {"op": "run", "id": I, "spec": {...}}       that standby becomes a rank (standby.py: env, argv, module)
  {"op": "exec", "id": I, "argv": [...], "env": {...}}   a cold start: fork and exec, errors reported
  {"op": "stop", "grace": S}                  SIGTERM every child's process group, SIGKILL after S seconds, exit
Events, one JSON object a line on the fd `--events-fd`: ready, started (id, pid), failed (id, errno, error),
exit (id, pid, code as Popen's returncode).

Nothing of the job outlives the launcher: EOF on stdin (the launcher ended, even by SIGKILL) is a stop. Every
child runs in its own session (the launcher can killpg it) with PR_SET_PDEATHSIG=SIGKILL tied to this
single-threaded process, and the zygote is a child subreaper, so what a rank leaves behind is adopted here
and stopped with the rest.
"""

from __future__ import annotations

import argparse
import contextlib
import ctypes
import gc
import importlib
import json
import os
import select
import signal
import sys
import time
from dataclasses import dataclass
from typing import Any

PR_SET_PDEATHSIG, PR_SET_CHILD_SUBREAPER = 1, 36
STOP_SIGNALS = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP)
KILL_WAIT_SECONDS = 5.0  # after SIGKILL, how long a stop waits for the last children to be reaped
_libc = ctypes.CDLL(None, use_errno=True)


def prctl(option: int, value: int) -> None:
    _libc.prctl(option, value, 0, 0, 0)


@dataclass
class Kid:
    ident: int
    spec_w: int | None  # a standby's spec pipe (write end), None once given or for an exec'd child


class Zygote:
    def __init__(self, events_fd: int, grace_seconds: float):
        self.pid = os.getpid()
        self.events_fd = events_fd
        self.grace_seconds = grace_seconds
        self.kids: dict[int, Kid] = {}  # pid → kid
        self.pids: dict[int, int] = {}  # id → pid
        self.deadline: float | None = None  # while stopping: when SIGKILL goes out
        self.killed_at: float | None = None
        self.termed: set[int] = set()  # strays already sent SIGTERM
        self.wake_r, self.wake_w = os.pipe()
        os.set_blocking(self.wake_w, False)
        signal.set_wakeup_fd(self.wake_w)
        for sig in (signal.SIGCHLD, *STOP_SIGNALS):
            signal.signal(sig, lambda *_: None)  # the byte on the wakeup fd is what counts

    # -- events ---------------------------------------------------------------------------------------
    def emit(self, event: str, **fields: object) -> None:
        line = (json.dumps({"event": event, **fields}) + "\n").encode()
        try:
            os.write(self.events_fd, line)
        except OSError:  # the launcher is gone: stop
            self.begin_stop(self.grace_seconds)

    # -- the loop -------------------------------------------------------------------------------------
    def serve(self) -> int | None:
        """Until stopped (returns None), or, in a forked standby, its spec pipe's read end."""
        poller = select.poll()
        poller.register(0, select.POLLIN)
        poller.register(self.wake_r, select.POLLIN)
        pending = b""
        while True:
            wait = None if self.deadline is None else max(0, int(1000 * (self._next_tick() - time.monotonic())))
            for fd, _ in poller.poll(wait):
                if fd == self.wake_r:
                    self._signalled(os.read(self.wake_r, 256))
                    continue
                chunk = os.read(0, 1 << 16)
                if not chunk:
                    poller.unregister(0)
                    self.begin_stop(self.grace_seconds)
                pending += chunk
                while b"\n" in pending:
                    line, pending = pending.split(b"\n", 1)
                    role = self.handle(json.loads(line)) if line.strip() else None
                    if role is not None:
                        return role
            self.reap()
            if self.deadline is not None and self._stopped():
                return None

    def _next_tick(self) -> float:
        assert self.deadline is not None
        return self.deadline if self.killed_at is None else time.monotonic() + 0.05

    def _signalled(self, raw: bytes) -> None:
        if any(b in {int(s) for s in STOP_SIGNALS} for b in raw):
            self.begin_stop(self.grace_seconds)

    def handle(self, request: dict[str, Any]) -> int | None:
        op, ident = request.get("op"), int(request.get("id", 0))
        if op == "stop":
            self.begin_stop(float(request.get("grace", self.grace_seconds)))
        elif op == "run":
            self.give(ident, request.get("spec"))
        elif self.deadline is not None:
            self.emit("failed", id=ident, errno=0, error="stopping")
        elif op == "fork":
            return self.fork_standby(ident)
        elif op == "exec":
            env = {str(k): str(v) for k, v in request["env"].items()}
            self.exec_child(ident, [str(a) for a in request["argv"]], env)
        return None

    # -- children ---------------------------------------------------------------------------------------
    def _in_child(self, keep: int | None = None) -> None:
        """Right after fork, in the child: its own session, death with the zygote, none of the zygote's fds."""
        os.setsid()
        prctl(PR_SET_PDEATHSIG, signal.SIGKILL)
        if os.getppid() != self.pid:  # the zygote died before the line above
            os._exit(1)
        signal.set_wakeup_fd(-1)
        for sig in (signal.SIGCHLD, signal.SIGTERM, signal.SIGHUP):
            signal.signal(sig, signal.SIG_DFL)
        signal.signal(signal.SIGINT, signal.default_int_handler)
        devnull = os.open(os.devnull, os.O_RDONLY)
        os.dup2(devnull, 0)
        os.close(devnull)
        for fd in (self.events_fd, self.wake_r, self.wake_w, *(k.spec_w for k in self.kids.values())):
            if fd is not None and fd != keep:
                os.close(fd)

    def fork_standby(self, ident: int) -> int | None:
        spec_r, spec_w = os.pipe()
        sys.stdout.flush()
        sys.stderr.flush()
        pid = os.fork()
        if pid == 0:
            os.close(spec_w)
            self._in_child(keep=spec_r)
            return spec_r
        os.close(spec_r)
        self.kids[pid], self.pids[ident] = Kid(ident, spec_w), pid
        self.emit("started", id=ident, pid=pid)
        return None

    def give(self, ident: int, spec: object) -> None:
        kid = self.kids.get(self.pids.get(ident, -1))
        if kid is None or kid.spec_w is None:
            return  # gone already: its exit is (or was) reported
        fd, kid.spec_w = kid.spec_w, None
        with contextlib.suppress(OSError):  # it died meanwhile: its exit is reported
            os.write(fd, (json.dumps(spec) + "\n").encode())
        os.close(fd)

    def exec_child(self, ident: int, argv: list[str], env: dict[str, str]) -> None:
        err_r, err_w = os.pipe()  # close-on-exec: EOF when the exec succeeded, errno and text when not
        pid = os.fork()
        if pid == 0:
            os.close(err_r)
            self._in_child(keep=err_w)
            signal.signal(signal.SIGPIPE, signal.SIG_DFL)  # as subprocess does before exec
            try:
                os.execvpe(argv[0], argv, env)
            except OSError as exc:
                os.write(err_w, f"{exc.errno or 0} {exc.strerror or exc}".encode())
            os._exit(127)
        os.close(err_w)
        with os.fdopen(err_r, "rb") as fh:
            failure = fh.read().decode(errors="replace")
        if failure:
            number, _, text = failure.partition(" ")
            os.waitpid(pid, 0)
            self.emit("failed", id=ident, errno=int(number), error=f"{text}: {argv[0]!r}")
            return
        self.kids[pid], self.pids[ident] = Kid(ident, None), pid
        self.emit("started", id=ident, pid=pid)

    def reap(self) -> None:
        while True:
            try:
                pid, status = os.waitpid(-1, os.WNOHANG)
            except ChildProcessError:
                return
            if pid == 0:
                return
            kid = self.kids.pop(pid, None)
            if kid is None:
                continue  # an orphan of a rank, adopted (subreaper) and now reaped
            self.pids.pop(kid.ident, None)
            if kid.spec_w is not None:
                os.close(kid.spec_w)
            self.emit("exit", id=kid.ident, pid=pid, code=os.waitstatus_to_exitcode(status))

    # -- stopping -------------------------------------------------------------------------------------
    def strays(self) -> list[int]:
        """Processes whose parent is this one that it did not start: a rank's orphans, adopted here."""
        found = []
        for entry in os.listdir("/proc"):
            if not entry.isdigit() or int(entry) in self.kids:
                continue
            try:
                with open(f"/proc/{entry}/stat", "rb") as fh:
                    fields = fh.read().rsplit(b")", 1)[1].split()
            except (OSError, IndexError):
                continue
            if int(fields[1]) == self.pid and fields[0] != b"Z":
                found.append(int(entry))
        return found

    def _signal_all(self, sig: int) -> None:
        for pid in list(self.kids):
            for s in (sig, signal.SIGCONT):  # a stopped process acts on SIGTERM only once continued
                try:
                    os.killpg(pid, s)
                except ProcessLookupError:  # forked but not yet in its own session: the kid alone
                    with contextlib.suppress(ProcessLookupError, PermissionError):
                        os.kill(pid, s)
                except PermissionError:
                    pass
        for pid in self.strays():
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(pid, sig)
            self.termed.add(pid)

    def begin_stop(self, grace_seconds: float) -> None:
        now = time.monotonic()
        if self.deadline is None:
            self._signal_all(signal.SIGTERM)
            self.deadline = now + grace_seconds
        else:
            self.deadline = min(self.deadline, now + grace_seconds)

    def _stopped(self) -> bool:
        """While stopping: True once nothing is left; SIGKILL for whatever outlives the grace period."""
        assert self.deadline is not None
        strays = self.strays()
        if not self.kids and not strays:
            return True
        for pid in set(strays) - self.termed:  # adopted since the stop began: a rank's orphan
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(pid, signal.SIGTERM)
            self.termed.add(pid)
        now = time.monotonic()
        if now >= self.deadline:
            if self.killed_at is None:
                self.killed_at = now
            self._signal_all(signal.SIGKILL)
            return now - self.killed_at > KILL_WAIT_SECONDS
        return False


def preload(modules: list[str]) -> list[str]:
    failed = []
    for name in modules:
        try:
            importlib.import_module(name)
        except ImportError as exc:
            print(f"sentinel zygote: cannot preload {name}: {exc}", file=sys.stderr, flush=True)
            failed.append(name)
    return failed


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="sentinel-zygote")
    parser.add_argument("--events-fd", type=int, required=True)
    parser.add_argument("--grace", type=float, default=5.0, help="seconds from SIGTERM to SIGKILL when stopping")
    parser.add_argument("--preload", action="append", default=[], help="module to import now; repeat")
    args = parser.parse_args(argv)
    os.set_inheritable(args.events_fd, False)
    prctl(PR_SET_CHILD_SUBREAPER, 1)
    failed = preload(args.preload)
    gc.freeze()  # what the preloads built stays shared with every child, out of the collector's way
    zygote = Zygote(args.events_fd, args.grace)
    zygote.emit("ready", pid=zygote.pid, preloaded=[m for m in args.preload if m not in failed], failed=failed)
    spec_fd = zygote.serve()
    if spec_fd is None:
        return 0
    from sentinel.launcher import standby  # in a forked standby, from here on

    return standby.become(spec_fd)


if __name__ == "__main__":
    sys.exit(main())
