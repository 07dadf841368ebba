"""Real processes for end-to-end tests: the server and agents as `python -m sentinel.cli …`."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import httpx

from sentinel.alerting.notifiers.webhook import verify_signature


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def sentinel_cmd(*args: str) -> list[str]:
    return [sys.executable, "-m", "sentinel.cli", *args]


class LiveServer:
    def __init__(self, data_dir: Path, database_url: str, extra_env: dict[str, str] | None = None):
        self.data_dir = data_dir
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.env = {**os.environ, "SENTINEL_DATA_DIR": str(data_dir), "SENTINEL_DATABASE_URL": database_url,
                    **(extra_env or {})}
        self.proc: subprocess.Popen[bytes] | None = None
        self.log_path = data_dir / "server.log"

    def start(self, timeout: float = 60.0) -> LiveServer:
        self.data_dir.mkdir(parents=True, exist_ok=True)
        log = open(self.log_path, "ab")  # noqa: SIM115 - the child keeps it
        self.proc = subprocess.Popen(sentinel_cmd("server", "--host", "127.0.0.1", "--port", str(self.port)),
                                     env=self.env, stdout=log, stderr=log)
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"server exited: {self.log_path.read_text()[-2000:]}")
            try:
                if httpx.get(self.url + "/readyz", timeout=1).status_code == 200:
                    return self
            except httpx.HTTPError:
                pass
            time.sleep(0.1)
        raise RuntimeError("server did not become ready")

    def kill9(self) -> None:
        assert self.proc is not None
        self.proc.send_signal(signal.SIGKILL)
        self.proc.wait(10)

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(15)
            except subprocess.TimeoutExpired:
                self.proc.kill()

    @property
    def admin_token(self) -> str:
        return (self.data_dir / "admin-token").read_text().strip()

    def token(self, role: str, name: str) -> str:
        out = subprocess.run(sentinel_cmd("token", "create", "--role", role, "--name", name), env=self.env,
                             check=True, capture_output=True, text=True, timeout=60)
        return out.stdout.strip().splitlines()[-1]

    def api(self) -> httpx.Client:
        return httpx.Client(base_url=self.url + "/api/v1", headers={"authorization": f"Bearer {self.admin_token}"},
                            timeout=10)


def wait_for(predicate, timeout: float = 20.0, interval: float = 0.1, what: str = "condition"):  # type: ignore[no-untyped-def]
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(interval)
    raise AssertionError(f"timed out after {timeout}s waiting for {what}")


class Receiver:
    """A webhook receiver on loopback that checks Sentinel's signature and keeps every page."""

    def __init__(self, secret: str) -> None:
        self.pages: list[tuple[float, dict[str, Any]]] = []
        self.bad_signatures = 0
        outer = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                at = time.time()
                body = self.rfile.read(int(self.headers["Content-Length"]))
                if not verify_signature(secret, body, self.headers.get("X-Sentinel-Signature", "")):
                    outer.bad_signatures += 1
                self.send_response(204)
                self.end_headers()
                outer.pages.append((at, json.loads(body)))

            def log_message(self, *_: Any) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}/hook"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def find(self, event: str, detector: str) -> list[tuple[float, dict[str, Any]]]:
        return [(at, p) for at, p in list(self.pages) if p["event"] == event and p["incident"]["detector"] == detector]
