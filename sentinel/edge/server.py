"""`sentinel server --workers N`: N edge workers hold the HTTP connections, one core process holds the state.

    clients ──▶ one listening socket (host:port) ──▶ edge workers 1..N (uvicorn: HTTP/1.1, TLS, keep-alive)
                                                        │ one Unix stream each (edge/frames.py)
                                                        ▼
                                                      core (this process): the app, the live views, detection,
                                                      incidents, remediation, the group-commit writer, the lead

Why this split and not a fleet partitioned by node: the state is one — a job's ranks span nodes, detectors
compare peers across the fleet, and the leader's duties (lock, breaker, placement, notifications) are single
— while the per-request cost that grows with the fleet is mostly HTTP and TLS, which needs no state at all
(docs/scaling.md measures the split). The core makes the listening socket before the workers start and
restarts a worker that dies; a worker exits when the core's channel closes, so nothing outlives the core.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from sentinel.config import Settings
from sentinel.edge.core import ASGIApp, CoreChannel, Lifespan

log = logging.getLogger("sentinel.edge")
STOP_SECONDS = 8.0  # a worker's graceful stop (uvicorn waits 5 s for open requests), then SIGKILL
RESTARTS_ALLOWED = 5  # within RESTART_WINDOW_SECONDS; past that the server stops (its supervisor restarts it)
RESTART_WINDOW_SECONDS = 60.0


def listen(host: str, port: int) -> socket.socket:
    family, kind, proto, _, address = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM,
                                                         flags=socket.AI_PASSIVE)[0]
    sock = socket.socket(family, kind, proto)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind(address)
    sock.listen(2048)
    sock.set_inheritable(True)
    return sock


class Workers:
    """The edge worker processes: started, watched, restarted, stopped."""

    def __init__(self, count: int, listener: socket.socket, channel: Path, settings: Settings, access_log: bool):
        self.count = count
        self.listener = listener
        self.channel = channel
        self.settings = settings
        self.access_log = access_log
        self.procs: list[subprocess.Popen[bytes]] = []
        self.restarts: list[float] = []

    def command(self) -> list[str]:
        s = self.settings
        cmd = [sys.executable, "-m", "sentinel.edge.worker", "--fd", str(self.listener.fileno()),
               "--channel", str(self.channel), "--log-level", s.log_level.lower()]
        if self.access_log:
            cmd.append("--access-log")
        for flag, value in (("--tls-certfile", s.tls_certfile), ("--tls-keyfile", s.tls_keyfile),
                            ("--tls-ca-certs", s.tls_ca_certs)):
            if value is not None:
                cmd += [flag, str(value)]
        return cmd

    def spawn(self) -> subprocess.Popen[bytes]:
        proc = subprocess.Popen(self.command(), pass_fds=(self.listener.fileno(),))
        log.info("edge worker started: pid=%d", proc.pid)
        return proc

    def start(self) -> None:
        self.procs = [self.spawn() for _ in range(self.count)]

    def check(self, now: float) -> bool:
        """Restart the workers that exited; False when they keep dying (the server should stop)."""
        for i, proc in enumerate(self.procs):
            code = proc.poll()
            if code is None:
                continue
            self.restarts = [t for t in self.restarts if now - t < RESTART_WINDOW_SECONDS] + [now]
            if len(self.restarts) > RESTARTS_ALLOWED:
                log.critical("edge workers keep exiting (%d restarts in %.0f s, the last pid=%d code=%s): "
                             "stopping the server", len(self.restarts) - 1, RESTART_WINDOW_SECONDS, proc.pid, code)
                return False
            log.error("edge worker exited: pid=%d code=%s; starting another (its clients reconnect)", proc.pid, code)
            self.procs[i] = self.spawn()
        return True

    async def stop(self) -> None:
        for proc in self.procs:
            if proc.poll() is None:
                proc.send_signal(signal.SIGTERM)
        deadline = time.monotonic() + STOP_SECONDS
        while any(p.poll() is None for p in self.procs) and time.monotonic() < deadline:
            await asyncio.sleep(0.05)  # the core keeps answering their open requests meanwhile
        for proc in self.procs:
            if proc.poll() is None:
                log.warning("edge worker did not stop in %.0f s: pid=%d; killing it", STOP_SECONDS, proc.pid)
                proc.kill()
                proc.wait()


async def serve(app: ASGIApp, settings: Settings, workers: int, access_log: bool) -> int:
    """Run the core and its workers until SIGTERM or SIGINT; the exit status."""
    loop = asyncio.get_running_loop()
    lifespan = Lifespan(app)
    await lifespan.startup()  # migrations, the lead or standing by, the scheduler: as the one-process server
    run_dir = settings.data_dir / "run"
    run_dir.mkdir(mode=0o700, parents=True, exist_ok=True)
    os.chmod(run_dir, 0o700)
    channel = run_dir / f"core-{os.getpid()}.sock"
    with contextlib.suppress(FileNotFoundError):
        channel.unlink()
    core = await loop.create_unix_server(lambda: CoreChannel(app), str(channel))
    os.chmod(channel, 0o600)
    listener = listen(settings.host, settings.port)
    pool = Workers(workers, listener, channel, settings, access_log)
    stop = asyncio.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    status = 0
    try:
        pool.start()
        host, port = listener.getsockname()[:2]
        log.info("serving: address=%s:%d workers=%d core_pid=%d", host, port, workers, os.getpid())
        while not stop.is_set():
            with contextlib.suppress(asyncio.TimeoutError):
                await asyncio.wait_for(stop.wait(), 0.5)
            if not stop.is_set() and not pool.check(time.monotonic()):
                status = 1
                break
    finally:
        await pool.stop()
        listener.close()
        core.close()
        with contextlib.suppress(FileNotFoundError):
            channel.unlink()
        await lifespan.shutdown()
    return status


def run(app: Any, settings: Settings, workers: int, access_log: bool) -> int:
    try:
        import uvloop
    except ImportError:  # the [standard] extras are optional: asyncio's own loop serves as well
        return asyncio.run(serve(app, settings, workers, access_log))
    return uvloop.run(serve(app, settings, workers, access_log))
