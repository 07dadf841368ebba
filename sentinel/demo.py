"""`sentinel demo`: the embedded default in one command — a server on SQLite and a local agent with
simulated accelerators, each a real process, with a note of where to look."""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx


def _wait_ready(url: str, timeout_seconds: float = 60.0) -> bool:
    deadline = time.monotonic() + timeout_seconds
    while time.monotonic() < deadline:
        try:
            if httpx.get(url + "/readyz", timeout=1.0).status_code == 200:
                return True
        except httpx.HTTPError:
            pass
        time.sleep(0.2)
    return False


def _sentinel(*args: str) -> list[str]:
    return [sys.executable, "-m", "sentinel.cli", *args]


def run_demo(*, data_dir: Path | None, port: int, agent_port: int, accelerators: int,
             duration: float | None) -> int:
    data_dir = data_dir or Path(tempfile.mkdtemp(prefix="sentinel-demo-"))
    env = {**os.environ, "SENTINEL_DATA_DIR": str(data_dir)}
    env.pop("SENTINEL_DATABASE_URL", None)
    url = f"http://127.0.0.1:{port}"
    log_path = data_dir / "demo.log"
    data_dir.mkdir(parents=True, exist_ok=True)
    log = open(log_path, "ab")  # noqa: SIM115 - kept open for the children's lifetime
    print(f"[1/3] starting the server on {url} (SQLite in {data_dir})", flush=True)
    server = subprocess.Popen(_sentinel("server", "--host", "127.0.0.1", "--port", str(port)), env=env,
                              stdout=log, stderr=log)
    procs = [server]
    try:
        if not _wait_ready(url):
            print(f"error: the server did not become ready; see {log_path}", file=sys.stderr)
            return 1
        token = subprocess.run(_sentinel("token", "create", "--role", "agent", "--name", "demo-agent"), env=env,
                               check=True, capture_output=True, text=True).stdout.strip().splitlines()[-1]
        print(f"[2/3] starting a local agent with {accelerators} SIMULATED accelerators (sim:{accelerators})",
              flush=True)
        agent = subprocess.Popen(
            _sentinel("collector", "--server", url, "--token", token, "--node-name", "demo-node-1",
                      "--source", "host", "--source", f"sim:{accelerators}", "--interval", "2",
                      "--listen", f"127.0.0.1:{agent_port}", "--state-dir", str(data_dir / "agent")),
            env=env, stdout=log, stderr=log)
        procs.append(agent)
        admin = (data_dir / "admin-token").read_text().strip()
        _wait_node(url, admin, "demo-node-1")
        print("[3/3] running. Where to look:\n"
              f"  API docs        {url}/docs\n"
              f"  fleet status    SENTINEL_DATA_DIR={data_dir} sentinel status --server {url}\n"
              f"  agent metrics   http://127.0.0.1:{agent_port}/metrics\n"
              f"  server metrics  curl -H \"Authorization: Bearer $(cat {data_dir}/admin-token)\" {url}/metrics\n"
              f"  fault drill     SENTINEL_DATA_DIR={data_dir} sentinel inject --server {url} "
              "--node demo-node-1 --accelerator 0 xid 79\n"
              f"  then incidents  SENTINEL_DATA_DIR={data_dir} sentinel incidents --server {url}\n"
              f"  admin token     {data_dir}/admin-token\n"
              f"  logs            {log_path}\n"
              "Press Ctrl-C to stop.", flush=True)
        deadline = time.monotonic() + duration if duration else None
        while deadline is None or time.monotonic() < deadline:
            if any(p.poll() is not None for p in procs):
                print(f"error: a demo process exited; see {log_path}", file=sys.stderr)
                return 1
            time.sleep(0.5)
        return 0
    except KeyboardInterrupt:
        return 0
    finally:
        for p in reversed(procs):
            p.terminate()
        for p in procs:
            try:
                p.wait(10)
            except subprocess.TimeoutExpired:
                p.kill()
        log.close()
        print("demo stopped", flush=True)


def _wait_node(url: str, token: str, node: str, timeout_seconds: float = 30.0) -> None:
    deadline = time.monotonic() + timeout_seconds
    while time.monotonic() < deadline:
        try:
            r = httpx.get(f"{url}/api/v1/nodes/{node}", headers={"authorization": f"Bearer {token}"}, timeout=2)
            if r.status_code == 200 and r.json()["last_seq"] > 0:
                return
        except httpx.HTTPError:
            pass
        time.sleep(0.3)
