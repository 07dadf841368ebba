"""What the benchmarks share: free ports, subprocesses that are always stopped, a tiny HTTP client, and the
file of measured figures (`benchmarks/measured.json`) that other code (the fault-schedule simulator) reads.

Imported as `support` (each benchmark runs as `python benchmarks/NAME.py`, which puts this folder
first on sys.path).
"""

from __future__ import annotations

import argparse
import contextlib
import fcntl
import http.client
import json
import math
import os
import platform
import shlex
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
HOST = "127.0.0.1"
MEASURED = Path(__file__).resolve().parent / "measured.json"
UNITS = ("s", "s/GiB")
ABOUT = ("Figures Sentinel's benchmarks measured; the fault-schedule simulator (sentinel/simulate/costs.py) costs "
         "its events with them. Each names the command, the date and what must be true for it.")


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


# --- measured figures ------------------------------------------------------------------------------------------


def add_record_arguments(parser: argparse.ArgumentParser) -> None:
    """`--no-record` and `--record PATH`: where (and whether) the run merges its figures."""
    group = parser.add_mutually_exclusive_group()
    group.add_argument("--record", type=Path, default=MEASURED, metavar="PATH",
                       help=f"merge this run's figures into PATH (default: {MEASURED.relative_to(REPO)})")
    group.add_argument("--no-record", dest="record", action="store_const", const=None,
                       help="do not write the measured figures anywhere")


def command_line() -> str:
    """The command that ran this benchmark, as typed from the repository root (paths relative to it)."""

    def rel(path: str) -> str:
        with contextlib.suppress(ValueError):
            return str(Path(os.path.abspath(path)).relative_to(REPO))
        return path

    pythonpath = os.environ.get("PYTHONPATH")
    prefix = f"PYTHONPATH={shlex.quote(rel(pythonpath) if pythonpath else '')} " if pythonpath is not None else ""
    return prefix + shlex.join([rel(sys.executable), rel(sys.argv[0]), *sys.argv[1:]])


def machine() -> str:
    """E.g. "Linux x86_64, AMD EPYC, 2 CPUs": what the figures were measured on."""
    model = platform.processor() or platform.machine()
    with contextlib.suppress(OSError):
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                model = line.split(":", 1)[1].strip()
                break
    return f"{platform.system()} {platform.machine()}, {model}, {os.cpu_count()} CPUs"


def load() -> str:
    one, five, _ = os.getloadavg()
    return f"{one:.2f} (1 min), {five:.2f} (5 min)"


def figure(values: Sequence[float], unit: str = "s", value: float | None = None, **extra: Any) -> dict[str, Any]:
    """A figure from the rounds' values: their median (or `value`, where the benchmark computes its figure
    otherwise, e.g. a difference of medians), how many, their range. `extra` (e.g. conditions) is kept."""
    if not values:
        raise BenchError("a figure needs at least one measured value")
    return {"value": float(statistics.median(values) if value is None else value), "unit": unit,
            "median_of": len(values), "range": [float(min(values)), float(max(values))], **extra}


def record_figures(figures: dict[str, dict[str, Any]], *, source: str, conditions: str,
                   path: Path = MEASURED) -> Path:
    """Merge `figures` into the JSON file at `path`, keeping every figure another benchmark wrote there.

    Each figure is {"value", "unit" ("s" or "s/GiB"), "median_of", "range": [min, max]}, and optionally its own
    "conditions" (else `conditions`); "source" (`source`) and "measured_at" (now, UTC) are added. The file is
    replaced atomically (a temp file beside it, fsynced, renamed), under an exclusive lock on its folder so that
    two benchmarks finishing together do not lose each other's figures. A file that exists but is not such an
    object is an error, never overwritten."""
    measured_at = datetime.now(UTC).isoformat(timespec="seconds").replace("+00:00", "Z")
    entries: dict[str, dict[str, Any]] = {}
    for name, given in figures.items():
        entry = {"value": given.get("value"), "unit": given.get("unit"), "median_of": given.get("median_of"),
                 "range": given.get("range"), "source": source, "measured_at": measured_at,
                 "conditions": given.get("conditions", conditions)}
        numbers = [entry["value"], *(entry["range"] if isinstance(entry["range"], list) else [None])]
        if (entry["unit"] not in UNITS or not isinstance(entry["median_of"], int) or entry["median_of"] < 1
                or not isinstance(entry["range"], list) or len(entry["range"]) != 2
                or not all(isinstance(v, int | float) and not isinstance(v, bool) and math.isfinite(v)
                           for v in numbers)):
            raise BenchError(f"figure {name!r} is malformed: {given!r}")
        if not entry["conditions"] or not source:
            raise BenchError(f"figure {name!r} needs its source and conditions")
        entries[name] = entry
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    folder = os.open(path.parent, os.O_RDONLY)
    try:
        fcntl.flock(folder, fcntl.LOCK_EX)
        data: dict[str, Any] = {"about": ABOUT, "figures": {}}
        if path.exists():
            try:
                data = json.loads(path.read_text())
            except json.JSONDecodeError as exc:
                raise BenchError(f"{path} is not JSON ({exc}); not overwriting it") from None
            if not isinstance(data, dict) or not isinstance(data.get("figures"), dict):
                raise BenchError(f"{path} is not an object with 'figures'; not overwriting it")
        data["figures"] = dict(sorted({**data["figures"], **entries}.items()))
        fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
        try:
            with os.fdopen(fd, "w") as fh:
                json.dump(data, fh, indent=2, ensure_ascii=False)
                fh.write("\n")
                fh.flush()
                os.fsync(fh.fileno())
            os.chmod(tmp, 0o644)
            os.replace(tmp, path)
        except BaseException:
            with contextlib.suppress(OSError):
                os.unlink(tmp)
            raise
    finally:
        os.close(folder)  # releases the lock
    return path


def report_recorded(path: Path | None, figures: dict[str, dict[str, Any]]) -> None:
    if path is None:
        say("measured figures not recorded (--no-record)")
        return
    say(f"recorded {len(figures)} figure(s) in {path}: " + ", ".join(
        f"{name} {f['value']:.4g} {f['unit']} [{f['range'][0]:.4g}–{f['range'][1]:.4g}]"
        for name, f in figures.items()))
