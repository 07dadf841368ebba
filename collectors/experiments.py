"""Experiments the server asks an agent to run for a diagnosis (sentinel/diagnosis/experiments.py): each
measures one thing now and returns a number, or says why it could not — never a made-up value.

| kind               | what it measures                                                        | unit          |
| ------------------ | ----------------------------------------------------------------------- | ------------- |
| `cpu`              | the task's run-queue wait over a short window, and who else ran         | ratio         |
| `memory_bandwidth` | a numpy copy of a large buffer                                          | bytes/s       |
| `disk_write`       | write + fsync of a file in a directory (the checkpoint directory)       | bytes/s       |
| `collective`       | a TCP exchange shaped like a 2-rank ring all-reduce with a peer agent:  | bytes/s       |
|                    | each side sends and receives S bytes; bus bandwidth = S / t (nccl-tests)|               |
| `gemm`             | the accelerator's GEMM rate ÷ expected (the sim source's probe)         | ratio         |

A peer's `collective` exchange is answered by `ExchangeListener` on the TCP port of the agent's probe address.
"""

from __future__ import annotations

import contextlib
import logging
import os
import socket
import struct
import tempfile
import threading
import time
from collections.abc import Callable
from typing import Any

import numpy as np
import psutil

from collectors.jobs import RunQueueMeter
from sentinel.telemetry.schemas import ExperimentResult, NodeCommand

log = logging.getLogger("sentinel.agent.experiments")

KINDS = ("cpu", "memory_bandwidth", "disk_write", "collective", "gemm")
MAGIC = b"SXCH"
MAX_EXCHANGE_BYTES = 256 * 2**20
MAX_WRITE_BYTES = 512 * 2**20
CHUNK = 1 << 20


class ExperimentError(Exception):
    """The experiment could not give a value: the reason goes back as its error."""


def run_experiment(spec: dict[str, Any], *, probe: Callable[[int], float | None] | None = None) -> tuple[float, str,
                                                                                                        str]:
    """(value, unit, detail) for one spec, or ExperimentError."""
    kind = spec.get("kind")
    if kind == "cpu":
        return cpu_contention([int(p) for p in spec.get("pids", [])], float(spec.get("seconds", 2.0)))
    if kind == "memory_bandwidth":
        return memory_bandwidth(int(spec.get("bytes", 256 * 2**20)))
    if kind == "disk_write":
        return disk_write(str(spec.get("path") or tempfile.gettempdir()), int(spec.get("bytes", 64 * 2**20)))
    if kind == "collective":
        return exchange(str(spec.get("peer", "")), int(spec.get("bytes", 32 * 2**20)),
                        float(spec.get("timeout", 30.0)))
    if kind == "gemm":
        if probe is None:
            raise ExperimentError("no GEMM probe on this node's source (only the sim source has one here)")
        ratio = probe(int(spec.get("accelerator_index", 0)))
        if ratio is None:
            raise ExperimentError("the GEMM probe gave no value")
        return ratio, "ratio", f"GEMM at {ratio:.0%} of the accelerator's expected rate"
    raise ExperimentError(f"unknown experiment kind {kind!r}; one of {', '.join(KINDS)}")


def cpu_contention(pids: list[int], seconds: float) -> tuple[float, str, str]:
    """The tasks' run-queue wait share over `seconds`, and the other processes that used most CPU meanwhile."""
    if not pids:
        raise ExperimentError("no task process to measure on this node")
    meter = RunQueueMeter()
    meter.measure(set(pids))
    ours = {os.getpid(), *pids}
    for pid in pids:
        with contextlib.suppress(psutil.Error):
            ours.update(c.pid for c in psutil.Process(pid).children(recursive=True))
    before = _cpu_times(ours)
    time.sleep(max(0.2, min(seconds, 10.0)))
    waits = meter.measure(set(pids))
    if not waits:
        raise ExperimentError(f"the task processes {pids} are gone or unreadable")
    after = _cpu_times(ours)
    used = sorted(((after[p][0] - before[p][0], p, after[p][1]) for p in after if p in before), reverse=True)
    cpus = _affinity(pids[0])
    busy = [(cpu, p, name, _affinity(p) <= cpus) for cpu, p, name in used[:10] if cpu / seconds >= 0.1]
    busy.sort(key=lambda b: (not b[3], -b[0]))  # those confined to the task's CPUs first: they compete for sure
    others = [f"pid {p} `{name}` {cpu / seconds:.2f} cores{' on its CPUs only' if mine else ''}"
              for cpu, p, name, mine in busy[:4]]
    wait = max(waits.values())
    return wait, "ratio", (f"the task waited {wait:.0%} of its runnable time for a CPU; "
                           + (f"also running: {', '.join(others)}" if others else "no other process used ≥ 0.1 core"))


def _affinity(pid: int) -> set[int]:
    try:
        return set(os.sched_getaffinity(pid))
    except OSError:
        return set(range(os.cpu_count() or 1))


def _cpu_times(exclude: set[int]) -> dict[int, tuple[float, str]]:
    out = {}
    for proc in psutil.process_iter(["pid", "name", "cpu_times"]):
        if proc.info["pid"] in exclude or proc.info["cpu_times"] is None:
            continue
        times = proc.info["cpu_times"]
        out[proc.info["pid"]] = (times.user + times.system, str(proc.info["name"])[:40])
    return out


def memory_bandwidth(nbytes: int) -> tuple[float, str, str]:
    nbytes = max(16 * 2**20, min(nbytes, 1024 * 2**20))
    source = np.ones(nbytes // 8, dtype=np.float64)
    target = np.empty_like(source)
    best = float("inf")
    for _ in range(3):
        started = time.perf_counter()
        np.copyto(target, source)
        best = min(best, time.perf_counter() - started)
    rate = 2 * nbytes / best  # read + write
    return rate, "bytes/s", f"copy of {nbytes / 2**20:.0f} MiB: {rate / 1e9:.2f} GB/s (read + write, best of 3)"


def disk_write(path: str, nbytes: int) -> tuple[float, str, str]:
    nbytes = max(CHUNK, min(nbytes, MAX_WRITE_BYTES))
    if not os.path.isdir(path):
        raise ExperimentError(f"{path} is not a directory on this node")
    block = os.urandom(CHUNK)
    try:
        fd, name = tempfile.mkstemp(prefix=".sentinel-disk-", dir=path)
    except OSError as exc:
        raise ExperimentError(f"cannot write in {path}: {exc}") from exc
    try:
        started = time.perf_counter()
        written = 0
        while written < nbytes:
            written += os.write(fd, block)
        os.fsync(fd)
        seconds = time.perf_counter() - started
    finally:
        os.close(fd)
        os.unlink(name)
    rate = written / seconds
    return rate, "bytes/s", f"wrote {written / 2**20:.0f} MiB + fsync in {path}: {rate / 1e6:.1f} MB/s"


def exchange(peer: str, nbytes: int, timeout: float) -> tuple[float, str, str]:
    """Send and receive `nbytes` with a peer agent's listener at the same time; bus bandwidth = nbytes / t."""
    host, _, port = peer.rpartition(":")
    if not host or not port.isdigit():
        raise ExperimentError(f"peer {peer!r} is not host:port")
    nbytes = max(CHUNK, min(nbytes, MAX_EXCHANGE_BYTES))
    started = time.perf_counter()
    try:
        with socket.create_connection((host.strip("[]"), int(port)), timeout=timeout) as sock:
            sock.settimeout(timeout)
            sock.sendall(MAGIC + struct.pack("!Q", nbytes))
            sender = threading.Thread(target=_send, args=(sock, nbytes), daemon=True)
            sender.start()
            _receive(sock, nbytes)
            sender.join(timeout)
            if sender.is_alive():
                raise ExperimentError(f"sending to {peer} did not finish within {timeout:.0f} s")
    except TimeoutError as exc:
        raise ExperimentError(f"exchange with {peer} timed out after {timeout:.0f} s") from exc
    except OSError as exc:
        raise ExperimentError(f"exchange with {peer} failed: {exc}") from exc
    seconds = time.perf_counter() - started
    rate = nbytes / seconds
    return rate, "bytes/s", (f"2-rank all-reduce-shaped exchange of {nbytes / 2**20:.0f} MiB with {peer}: "
                             f"bus bandwidth {rate / 1e6:.1f} MB/s in {seconds:.2f} s")


def _send(sock: socket.socket, nbytes: int) -> None:
    block = b"\0" * CHUNK
    sent = 0
    try:
        while sent < nbytes:
            sent += sock.send(block[:min(CHUNK, nbytes - sent)])
    except OSError:
        pass


def _receive(sock: socket.socket, nbytes: int) -> None:
    got = 0
    buffer = bytearray(CHUNK)
    while got < nbytes:
        n = sock.recv_into(buffer, min(CHUNK, nbytes - got))
        if n == 0:
            raise ExperimentError(f"the peer closed the exchange after {got} of {nbytes} bytes")
        got += n


class ExchangeListener:
    """Answers peers' `collective` exchanges on a TCP host:port (the agent's probe address, as TCP)."""

    def __init__(self, host: str, port: int):
        self._sock = socket.create_server((host, port), family=socket.AF_INET6 if ":" in host else socket.AF_INET)
        self._sock.settimeout(0.5)
        self._stop = threading.Event()
        self.address = f"{host}:{self._sock.getsockname()[1]}"
        self.served_total = 0

    def start(self) -> ExchangeListener:
        threading.Thread(target=self._accept, name="sentinel-agent-exchange", daemon=True).start()
        return self

    def close(self) -> None:
        self._stop.set()
        self._sock.close()

    def _accept(self) -> None:
        while not self._stop.is_set():
            try:
                conn, _ = self._sock.accept()
            except TimeoutError:
                continue
            except OSError:
                return
            threading.Thread(target=self._serve, args=(conn,), daemon=True).start()

    def _serve(self, conn: socket.socket) -> None:
        with conn:
            try:
                conn.settimeout(30.0)
                header = conn.recv(12, socket.MSG_WAITALL)
                if len(header) != 12 or header[:4] != MAGIC:
                    return
                nbytes = min(struct.unpack("!Q", header[4:])[0], MAX_EXCHANGE_BYTES)
                sender = threading.Thread(target=_send, args=(conn, nbytes), daemon=True)
                sender.start()
                _receive(conn, nbytes)
                sender.join(30.0)
                self.served_total += 1
            except (OSError, ExperimentError) as exc:
                log.info("experiment exchange ended early: %s", exc)


def result_of(command: NodeCommand, *, probe: Callable[[int], float | None] | None = None) -> ExperimentResult:
    """Run a command's experiment; any failure is the result's error."""
    spec = command.spec or {}
    ident, kind = str(spec.get("id", command.id)), str(spec.get("kind", "?"))[:32]
    started = time.time()
    try:
        value, unit, detail = run_experiment(spec, probe=probe)
        return ExperimentResult(id=ident, kind=kind, value=value, unit=unit, detail=detail, started_at=started,
                                ended_at=time.time())
    except ExperimentError as exc:
        error = str(exc)
    except Exception as exc:  # an experiment must never take the agent with it
        log.exception("experiment %s failed", ident)
        error = f"{type(exc).__name__}: {exc}"
    return ExperimentResult(id=ident, kind=kind, error=error[:1024], started_at=started, ended_at=time.time())
