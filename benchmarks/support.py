"""What the benchmarks share: free ports, subprocesses that are always stopped, a tiny HTTP client.

Imported as `support` (each benchmark runs as `python benchmarks/NAME.py`, which puts this folder
first on sys.path).
"""

from __future__ import annotations

import contextlib
import http.client
import json
import os
import signal
import socket
import subprocess
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
HOST = "127.0.0.1"


class BenchError(Exception):
    pass


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((HOST, 0))
        return int(s.getsockname()[1])


def tail(log: Path | None, lines: int = 30) -> str:
    if log is None or not log.exists():
        return ""
    text = log.read_text(errors="replace").splitlines()[-lines:]
    return "\n".join(f"    | {line}" for line in text)


class Processes:
    """Every subprocess started, each in its own session; stopped (SIGINT, then SIGKILL) on exit."""

    def __init__(self) -> None:
        self.procs: list[tuple[str, subprocess.Popen[bytes], Path]] = []

    def start(self, name: str, argv: list[str], env: dict[str, str], log: Path,
              stdin: int | None = subprocess.DEVNULL, stdout: int | None = None) -> subprocess.Popen[bytes]:
        """Output goes to `log` (stderr only, when `stdout` is given, e.g. a pipe)."""
        with open(log, "ab") as fh:
            proc = subprocess.Popen(argv, cwd=REPO, env=env, stdin=stdin,
                                    stdout=stdout if stdout is not None else fh,
                                    stderr=fh, start_new_session=True)
        self.procs.append((name, proc, log))
        return proc

    def check_alive(self, proc: subprocess.Popen[bytes]) -> None:
        if proc.poll() is not None:
            name, _, log = next(p for p in self.procs if p[1] is proc)
            raise BenchError(f"{name} exited with status {proc.returncode}\n{tail(log)}")

    def stop(self, proc: subprocess.Popen[bytes], timeout: float = 15.0) -> None:
        if proc.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGINT)
        with contextlib.suppress(subprocess.TimeoutExpired):
            proc.wait(timeout=timeout)
        if proc.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGKILL)
            with contextlib.suppress(subprocess.TimeoutExpired):
                proc.wait(timeout=5)

    def stop_all(self) -> None:
        for _, proc, _ in reversed(self.procs):
            if proc.poll() is None:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(proc.pid, signal.SIGINT)
        deadline = time.monotonic() + 15
        for _, proc, _ in reversed(self.procs):
            self.stop(proc, timeout=max(0.1, deadline - time.monotonic()))


def http_call(port: int, method: str, path: str, body: Any = None, token: str | None = None,
              timeout: float = 30.0) -> tuple[int, bytes]:
    conn = http.client.HTTPConnection(HOST, port, timeout=timeout)
    try:
        headers = {"Content-Type": "application/json"}
        if token:
            headers["Authorization"] = f"Bearer {token}"
        data = body if isinstance(body, bytes) else (json.dumps(body).encode() if body is not None else None)
        conn.request(method, path, body=data, headers=headers)
        resp = conn.getresponse()
        return resp.status, resp.read()
    finally:
        conn.close()


def say(text: str) -> None:
    print(text, flush=True)


def wait(what: str, probe: Any, timeout: float, procs: Processes, watched: list[subprocess.Popen[bytes]],
         poll: float = 0.01) -> Any:
    """Poll `probe` until it returns something true; fail at once if a watched process exits."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        for proc in watched:
            procs.check_alive(proc)
        value = probe()
        if value:
            return value
        time.sleep(poll)
    raise BenchError(f"timed out after {timeout:.0f}s waiting for {what}")


def ready(port: int, path: str = "/readyz") -> bool:
    try:
        return http_call(port, "GET", path, timeout=2)[0] == 200
    except OSError:
        return False


def api(port: int, method: str, path: str, token: str, body: Any = None) -> Any:
    """One call to Sentinel's REST API; any answer but 2xx is a BenchError."""
    status, answer = http_call(port, method, path, body, token)
    if status >= 300:
        raise BenchError(f"{method} {path} answered {status}: {answer[:300]!r}")
    return json.loads(answer) if answer else None
