"""The agent takes an SDK batch only from the process it names, for the task placed here: real agent, real
server, a real rank using the SDK, and real unrelated processes trying to pass for it."""

from __future__ import annotations

import http.client
import json
import os
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import httpx
import pytest

from collectors import peers
from collectors.agent import Agent, AgentConfig
from collectors.sdk_gate import MAX_SEARCHES_PER_SECOND, BatchRefused, SdkGate, Sender
from sentinel.telemetry.schemas import ReportAck, SdkBatch
from tests.live import LiveServer, wait_for

pytestmark = pytest.mark.slow

# One process using the SDK, driven over stdin (a JSON command a line, a JSON answer a line). With `run` it is
# a rank: it steps on its own (100 tokens a 50 ms step) and its SDK thread flushes every 0.2 s.
SDK_PROCESS = r'''
import http.client, json, os, subprocess, sys, threading, time, urllib.parse
from sentinel.sdk.telemetry import Telemetry

url, job, rank, mode = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), sys.argv[4]
if mode == "run":
    tel = Telemetry(job_id=job, rank=rank, agent_url=url, flush_interval_seconds=0.2)
    def loop():
        while True:
            with tel.step(tokens=100):
                time.sleep(0.05)
    threading.Thread(target=loop, daemon=True).start()
once = Telemetry(job_id=job, rank=rank, agent_url=url, start_thread=False)

def post(cmd):
    once.pid = cmd.get("pid") or os.getpid()
    once.record_step(cmd.get("seconds", 0.05), tokens=cmd.get("tokens", 100))
    return {"ok": once.flush(), "refused": once.refused_batches, "pid": os.getpid()}

def raw(cmd):
    where = urllib.parse.urlsplit(url)
    conn = http.client.HTTPConnection(where.hostname, where.port, timeout=10)
    batch = {"job_id": job, "rank": rank, "pid": cmd["pid"], "steps": [[1, time.time(), 0.001, cmd["tokens"], 0, None]]}
    conn.request("POST", "/v1/telemetry", body=json.dumps(batch), headers={"content-type": "application/json"})
    answer = conn.getresponse()
    body = answer.read()
    return {"status": answer.status, "detail": json.loads(body)["detail"] if body else None, "pid": os.getpid()}

def child(cmd):
    worker = subprocess.Popen([sys.executable, __file__, url, str(job), str(rank), "once"], stdin=subprocess.PIPE,
                              stdout=subprocess.PIPE, text=True)
    out, _ = worker.communicate(json.dumps({"op": "post", "pid": os.getpid()}) + "\n", timeout=30)
    return json.loads(out.splitlines()[0])

def fork(cmd):
    post({})  # the connection is open when the worker is forked
    reader, writer = os.pipe()
    pid = os.fork()
    if pid == 0:
        fresh = once._sender._conn is None
        answer = post({"pid": os.getppid()})
        os.write(writer, json.dumps({**answer, "fresh_connection": fresh}).encode())
        os._exit(0)
    os.close(writer)
    answer = json.loads(os.read(reader, 4096))
    os.waitpid(pid, 0)
    return {**answer, "parent_after": post({})["ok"]}

def status(cmd):
    return {"sent": tel.sent_batches, "refused": tel.refused_batches, "dropped": tel.dropped_batches}

for line in sys.stdin:
    cmd = json.loads(line)
    print(json.dumps(globals()[cmd.pop("op")](cmd)), flush=True)
'''


class SdkProcess:
    """A real process using the SDK (see SDK_PROCESS)."""

    def __init__(self, script: Path, url: str, job_id: int, rank: int = 0, run: bool = False):
        self.proc = subprocess.Popen([sys.executable, str(script), url, str(job_id), str(rank),
                                      "run" if run else "once"], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                     stderr=subprocess.PIPE, text=True)
        self.pid = self.proc.pid

    def ask(self, op: str, **args: Any) -> dict[str, Any]:
        assert self.proc.stdin is not None and self.proc.stdout is not None
        self.proc.stdin.write(json.dumps({"op": op, **args}) + "\n")
        self.proc.stdin.flush()
        line = self.proc.stdout.readline()
        assert line, f"the SDK process ended: {self.stop()}"
        return dict(json.loads(line))

    def stop(self) -> str:
        """End it; its standard error (the SDK's log)."""
        if self.proc.poll() is None:
            assert self.proc.stdin is not None
            self.proc.stdin.close()
        try:
            self.proc.wait(10)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        assert self.proc.stderr is not None
        return self.proc.stderr.read()


@pytest.fixture
def script(tmp_path: Path) -> Path:
    path = tmp_path / "sdk_process.py"
    path.write_text(SDK_PROCESS)
    return path


def refused(agent: Agent) -> float:
    value = agent.registry.get_sample_value("sentinel_agent_sdk_batches_refused_total", {"node": agent.config.node})
    assert value is not None, "the agent exposes the counter"
    return value


def test_a_spoofed_batch_for_a_running_rank_is_refused_and_the_job_signals_do_not_move(tmp_path, script, caplog):
    server = LiveServer(tmp_path / "server", f"sqlite:///{tmp_path / 'server.db'}").start()
    agent = Agent(AgentConfig(server_url=server.url, token=server.token("agent", "a"), node="cpu-1",
                              sources=["sim:1"], interval_seconds=0.5, listen_port=0, state_dir=tmp_path / "agent"))
    agent.serve_http()
    agent.start()
    threading.Thread(target=agent.run_forever, daemon=True).start()
    procs: list[SdkProcess] = []
    try:
        api = server.api()
        wait_for(lambda: api.get("/nodes/cpu-1").status_code == 200, what="node")
        launcher = {"authorization": f"Bearer {server.token('launcher', 'l')}"}
        job_id = httpx.post(f"{server.url}/api/v1/jobs", json={"name": "j", "world_size": 1}, headers=launcher
                            ).json()["id"]
        rank = SdkProcess(script, agent.url, job_id, run=True)
        procs.append(rank)
        task = {"rank": 0, "node": "cpu-1", "accelerators": ["SIM-cpu-1-0"], "pid": rank.pid}
        assert httpx.post(f"{server.url}/api/v1/jobs/{job_id}/tasks", json=task, headers=launcher).is_success
        wait_for(lambda: any(a.pid == rank.pid for a in agent.assignments), what="the placement to reach the agent")

        def rate() -> float:
            return float(wait_for(lambda: api.get(f"/jobs/{job_id}/metrics").json()["tokens_per_second"],
                                  what="tokens/s"))

        honest = rate()
        assert 1000 < honest < 2100, honest  # 100 tokens a ≥50 ms step

        spoofer = SdkProcess(script, agent.url, job_id)  # unrelated: another tenant's process on the node
        procs.append(spoofer)
        answer = spoofer.ask("raw", pid=rank.pid, tokens=10**9)
        assert answer == {"status": 403, "pid": spoofer.pid,
                          "detail": f"batch names pid {rank.pid} but was sent by pid {spoofer.pid}"}
        through_sdk = [spoofer.ask("post", pid=rank.pid, tokens=10**9, seconds=0.001) for _ in range(3)]
        assert [(a["ok"], a["refused"]) for a in through_sdk] == [(False, 1), (False, 2), (False, 3)]
        squatter = spoofer.ask("post", tokens=10**9, seconds=0.001)  # its own pid, the running rank's job and rank
        assert (squatter["ok"], squatter["refused"]) == (False, 4)
        assert refused(agent) == 5
        lines = [r.getMessage() for r in caplog.records if r.name == "sentinel.agent.sdk"]
        assert lines == [f"SDK batch refused: node=cpu-1 job={job_id} rank=0 pid={rank.pid} sender={spoofer.pid}: "
                         f"batch names pid {rank.pid} but was sent by pid {spoofer.pid}"], "one line per 10 s"

        worker = rank.ask("child")  # a data-loader-like worker of the rank, naming the rank's pid
        assert worker["ok"] and worker["refused"] == 0 and worker["pid"] != rank.pid
        time.sleep(2.0)  # four report intervals
        after = rate()
        assert 1000 < after < 2100 and abs(after - honest) < 0.25 * honest, (honest, after)
        tasks = api.get(f"/jobs/{job_id}").json()["tasks"]
        assert [(t["pid"], t["state"]) for t in tasks] == [(rank.pid, "running")]
        own = rank.ask("status")
        assert own["refused"] == 0 and own["dropped"] == 0 and own["sent"] >= 10
        assert refused(agent) == 5
        log = spoofer.stop()
        assert log.count("refuses this process's telemetry") == 1, log  # once, however many are refused
    finally:
        for p in procs:
            p.stop()
        agent.stop(drain_seconds=0)
        server.stop()


@pytest.fixture
def lone_agent(tmp_path: Path):
    """An agent whose server is away: placement reaches it only through `_on_ack`, as a report's answer would."""
    agent = Agent(AgentConfig(server_url="http://127.0.0.1:9", token="t", node="n1", sources=["host"],
                              listen_port=0, state_dir=tmp_path / "agent"))
    agent.serve_http()
    yield agent
    agent.stop(drain_seconds=0)


def place(agent: Agent, job_id: int, rank: int, pid: int | None) -> None:
    agent._on_ack(ReportAck.model_validate({"status": "accepted", "node": "n1", "seq": 1, "assignments": [
        {"job_id": job_id, "rank": rank, "pid": pid, "accelerators": []}]}))


def test_before_the_server_names_a_pid_the_first_real_process_keeps_the_task(lone_agent, script):
    first, second = SdkProcess(script, lone_agent.url, 9), SdkProcess(script, lone_agent.url, 9)
    try:
        assert first.ask("post")["ok"]
        assert first.ask("post")["ok"]
        assert second.ask("post") == {"ok": False, "refused": 1, "pid": second.pid}
        assert second.ask("raw", pid=second.pid, tokens=1)["detail"] == (
            f"job 9 rank 0 reports from pid {first.pid} on this node, not pid {second.pid}")
        first.stop()
        assert second.ask("post")["ok"], "once the first has ended, a restart takes the task"
        place(lone_agent, 9, 0, first.pid)  # the server's word, even for a pid that has ended, wins over binding
        assert second.ask("post")["ok"], "the placed pid has ended: a restart the server has not told us of yet"
        other = subprocess.Popen(["sleep", "60"])  # placed as a running process that is not `second`
        place(lone_agent, 9, 0, other.pid)
        assert second.ask("raw", pid=second.pid, tokens=1)["detail"] == (
            f"job 9 rank 0 runs here as pid {other.pid} (placed by the server), not as pid {second.pid}")
        assert refused(lone_agent) == 3
        other.kill()
        other.wait()
    finally:
        first.stop()
        second.stop()


def test_processes_under_the_placed_pid_and_forked_workers_are_taken(lone_agent, script):
    """A torchrun agent is placed; its workers report with their own pids. A forked data-loader worker still
    names its parent's pid, and gets a connection of its own."""
    place(lone_agent, 4, 1, os.getpid())  # this test process stands for the launcher that the server placed
    worker = SdkProcess(script, lone_agent.url, 4, rank=1)
    try:
        assert worker.ask("post")["ok"]
        forked = worker.ask("fork")
        assert forked["ok"] and forked["fresh_connection"] and forked["parent_after"]
        assert forked["pid"] != worker.pid
        assert refused(lone_agent) == 0
    finally:
        worker.stop()


def test_a_connection_from_outside_this_node_is_refused():
    gate = SdkGate("n1")
    sender = gate.identify(("192.0.2.7", 40000), ("127.0.0.1", 9481), claimed_pid=os.getpid())
    assert sender.pid is None and "not from a process on this node" in sender.unknown_because


def test_the_agent_names_the_sender_of_a_batch_that_names_another_pid(lone_agent):
    """The check is on the connection, not on anything the request says: this process posts for its child."""
    host, port = lone_agent.url.removeprefix("http://").split(":")
    child = subprocess.Popen(["sleep", "60"])
    try:
        conn = http.client.HTTPConnection(host, int(port), timeout=10)
        conn.request("POST", "/v1/telemetry", body=json.dumps({"job_id": 1, "rank": 0, "pid": child.pid}))
        answer = conn.getresponse()
        assert answer.status == 403
        assert json.loads(answer.read())["detail"] == f"batch names pid {child.pid} but was sent by pid {os.getpid()}"
    finally:
        child.kill()
        child.wait()


def test_both_socket_lookups_find_the_client_end_of_a_local_connection():
    """sock_diag where the kernel answers it, /proc/net/tcp where it does not: the same socket."""
    listener = socket.create_server(("127.0.0.1", 0))
    client = socket.create_connection(listener.getsockname())
    accepted, _ = listener.accept()
    try:
        inode = os.fstat(client.fileno()).st_ino
        here, there = client.getsockname()[:2], client.getpeername()[:2]
        assert peers.client_socket(here, there) == (inode, os.geteuid())
        assert peers._proc_net_lookup(here, there, peers.PROC) == (inode, os.geteuid())
        assert peers.client_socket(there, here) is not None, "the agent's end is a socket too, but not this one"
        assert peers.client_socket(there, here) != (inode, os.geteuid())
        assert peers.socket_owner(inode, hint=None) == os.getpid()
    finally:
        for s in (client, accepted, listener):
            s.close()


def test_searching_past_the_claimed_pid_is_limited_so_a_flood_cannot_take_the_agent_cpu():
    listener = socket.create_server(("127.0.0.1", 0))
    client = socket.create_connection(listener.getsockname())
    accepted, _ = listener.accept()
    other = subprocess.Popen(["sleep", "60"])
    gate = SdkGate("n1", clock=lambda: 100.0)  # all in the same second
    try:
        here, there = client.getsockname()[:2], client.getpeername()[:2]
        senders = [gate.identify(here, there, claimed_pid=other.pid) for _ in range(MAX_SEARCHES_PER_SECOND + 1)]
        assert [s.pid for s in senders[:-1]] == [os.getpid()] * MAX_SEARCHES_PER_SECOND
        assert senders[-1].pid is None and "not searched further" in senders[-1].unknown_because
        assert gate.identify(here, there, claimed_pid=os.getpid()).pid == os.getpid(), "the claimed pid is checked"
    finally:
        other.kill()
        other.wait()
        for s in (client, accepted, listener):
            s.close()


def test_refusals_are_logged_at_most_once_per_interval_with_a_count_of_the_rest(caplog):
    now = [0.0]
    gate = SdkGate("n1", clock=lambda: now[0], log_every_seconds=10.0)
    batch = SdkBatch.model_validate({"job_id": 2, "rank": 1, "pid": 4242})
    for at in (0.0, 1.0, 2.0, 11.0):
        now[0] = at
        with pytest.raises(BatchRefused):
            gate.admit(batch, Sender(None, "it came from 192.0.2.7:1, not from a process on this node"), [])
    lines = [r.getMessage() for r in caplog.records if r.name == "sentinel.agent.sdk"]
    assert len(lines) == 2 and gate.refused_total == 4
    assert lines[1].endswith("(2 more refused since the last such line)")
