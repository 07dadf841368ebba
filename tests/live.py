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

from sentinel.alerting.notifiers.webhook import REPLAY_TOLERANCE_SECONDS, verify_signature

_HANDED_OUT: set[int] = set()


def free_port() -> int:
    """A port free on 127.0.0.1 now that this process has not handed out before: the kernel may offer one port
    to two binds in a row, and a config of two such ports puts two daemons on one (the likeliest cause of a CI
    failure: slurmctld found its port taken and slurmd answered its requests)."""
    while True:
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = int(s.getsockname()[1])
        if port not in _HANDED_OUT:
            _HANDED_OUT.add(port)
            return port


def sentinel_cmd(*args: str) -> list[str]:
    return [sys.executable, "-m", "sentinel.cli", *args]


class LiveServer:
    def __init__(self, data_dir: Path, database_url: str, extra_env: dict[str, str] | None = None,
                 host: str = "127.0.0.1"):
        self.data_dir = data_dir
        self.host = host  # another address only for a lab's bridge (tests/network/netlab.py)
        self.port = free_port()
        self.url = f"http://{host}:{self.port}"
        self.env = {**os.environ, "SENTINEL_DATA_DIR": str(data_dir), "SENTINEL_DATABASE_URL": database_url,
                    **(extra_env or {})}
        self.proc: subprocess.Popen[bytes] | None = None
        self.log_path = data_dir / "server.log"

    def start(self, timeout: float = 60.0) -> LiveServer:
        self.data_dir.mkdir(parents=True, exist_ok=True)
        log = open(self.log_path, "ab")  # noqa: SIM115 - the child keeps it
        self.proc = subprocess.Popen(sentinel_cmd("server", "--host", self.host, "--port", str(self.port)),
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

    def token(self, role: str, name: str, node: str | None = None) -> str:
        """An agent token without `node` acts for any node ('*'): some tests run several agents on one token."""
        node = node or ("*" if role == "agent" else None)
        bound = ("--node", node) if node else ()
        out = subprocess.run(sentinel_cmd("token", "create", "--role", role, "--name", name, *bound), env=self.env,
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
                if not verify_signature(secret, body, self.headers.get("X-Sentinel-Signature", ""),
                                        max_age_seconds=REPLAY_TOLERANCE_SECONDS,
                                        timestamp_header=self.headers.get("X-Sentinel-Timestamp")):
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


# -- a small cluster: a server, sim agents and `sentinel launch` of the demo job ----------------------------------
DEMO_JOB = ["-m", "sentinel.demo.job"]


def start_agent(server: LiveServer, token: str, name: str, work: Path, accelerators: int) -> subprocess.Popen[bytes]:
    log = open(work / f"agent-{name}.log", "ab")  # noqa: SIM115 - the child keeps it
    return subprocess.Popen(sentinel_cmd("collector", "--server", server.url, "--token", token, "--node-name", name,
                                         "--source", f"sim:{accelerators}", "--interval", "1", "--listen",
                                         f"127.0.0.1:{free_port()}", "--state-dir", str(work / "agents")),
                            env={**os.environ}, stdout=log, stderr=log, start_new_session=True)


def attempts(out: Path) -> dict[int, set[int]]:
    """attempt → ranks that logged a step in it."""
    seen: dict[int, set[int]] = {}
    log = out / "steps.log"
    if log.exists():
        for line in log.read_text().splitlines():
            parts = line.split()
            if len(parts) == 4:
                seen.setdefault(int(parts[1]), set()).add(int(parts[0]))
    return seen


class Cluster:
    def __init__(self, tmp_path: Path, env: dict[str, str] | None = None, nodes: dict[str, int] | None = None):
        self.work = tmp_path
        self.server = LiveServer(tmp_path / "server", f"sqlite:///{tmp_path / 'server' / 'sentinel.db'}",
                                 {"SENTINEL_RESOLVE_AFTER_SECONDS": "600", **(env or {})}).start()
        self.api = self.server.api()
        self.procs: list[subprocess.Popen[bytes]] = []
        self.agents: dict[str, subprocess.Popen[bytes]] = {}
        for name, count in (nodes or {"node-a": 2, "node-b": 2}).items():
            # one token per agent, bound to its node (an agent token may report only for its own node)
            made = self.api.post("/tokens", json={"name": f"agent-{name}", "role": "agent", "node": name})
            made.raise_for_status()
            self.agents[name] = start_agent(self.server, made.json()["token"], name, tmp_path, count)
            self.procs.append(self.agents[name])
        wait_for(lambda: all(self.api.get(f"/nodes/{n}").status_code == 200 for n in self.agents), timeout=30,
                 what="agents registered")

    def launch(self, name: str, extra: dict[str, str] | None = None, job: list[str] | None = None,
               kind: str = "training") -> subprocess.Popen[bytes]:
        """`sentinel launch` of 2 ranks of `python <job>` (default the demo job, which logs its steps to
        <work>/job/steps.log); OUT_DIR is <work>/job."""
        out = self.work / "job"
        out.mkdir(exist_ok=True)
        env = {**os.environ, "SENTINEL_SERVER": self.server.url, "SENTINEL_TOKEN": self.server.token("launcher", name),
               "OUT_DIR": str(out), "STEPS": "0", **(extra or {})}
        log = open(self.work / "launch.log", "ab")  # noqa: SIM115 - the child keeps it
        proc = subprocess.Popen(sentinel_cmd("launch", "--job", name, "--kind", kind, "--nproc", "2", "--",
                                             sys.executable, *(job or DEMO_JOB)),
                                env=env, stdout=log, stderr=log, start_new_session=True)
        self.procs.append(proc)
        return proc

    def job(self, name: str) -> dict[str, Any]:
        jobs = [j for j in self.api.get("/jobs").json() if j["name"] == name]
        return dict(self.api.get(f"/jobs/{jobs[0]['id']}").json()) if jobs else {}

    def close(self) -> None:
        for proc in self.procs:
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGINT)
        for proc in self.procs:
            try:
                proc.wait(20)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
        self.server.stop()

    def logs(self) -> str:
        return "\n".join(f"--- {p.name}\n{p.read_text()[-3000:]}" for p in sorted(self.work.glob("*.log")))


def running(job: dict[str, Any], attempt: int) -> list[dict[str, Any]]:
    return [t for t in job.get("tasks", []) if t["attempt"] == attempt]
