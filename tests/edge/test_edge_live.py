"""`sentinel server --workers 2`, for real: two edge workers hold the connections, the core holds the state.

What a client sees must not change: every report acknowledged is stored, refusals say the same thing as the
one-process server, a long-poll waits and answers, a streamed (chunked) body and a large answer pass whole.
And the processes behave: a worker killed is replaced, a core killed takes its workers with it, a stop stops
everything.
"""

from __future__ import annotations

import http.client
import json
import os
import signal
import socket
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from sqlalchemy import create_engine, text

from tests.live import LiveServer, wait_for

pytestmark = pytest.mark.slow

WORKERS = 2
NO_RATE_LIMIT = {"SENTINEL_RATE_LIMIT_PER_SECOND": "0"}  # eight nodes share one token here


def workers_of(server: LiveServer) -> list[int]:
    assert server.proc is not None
    found = []
    for task in os.listdir(f"/proc/{server.proc.pid}/task"):
        with open(f"/proc/{server.proc.pid}/task/{task}/children") as fh:
            found += [int(pid) for pid in fh.read().split()]
    return found


def alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as fh:
            return fh.read().rpartition(")")[2].split()[0] != "Z"
    except OSError:
        return False


@pytest.fixture
def edge(tmp_path: Path) -> Iterator[LiveServer]:
    server = LiveServer(tmp_path / "edge", f"sqlite:///{tmp_path / 'edge.db'}",
                        extra_env={"SENTINEL_WORKERS": str(WORKERS), **NO_RATE_LIMIT}).start()
    yield server
    server.stop()


@pytest.fixture
def single(tmp_path: Path) -> Iterator[LiveServer]:
    server = LiveServer(tmp_path / "single", f"sqlite:///{tmp_path / 'single.db'}", extra_env=NO_RATE_LIMIT).start()
    yield server
    server.stop()


def register(server: LiveServer, token: str, node: str) -> None:
    answer = httpx.post(server.url + "/api/v1/nodes/register", headers={"authorization": f"Bearer {token}"},
                        json={"name": node, "sources": ["sim"], "interval_seconds": 1.0}, timeout=10)
    assert answer.status_code == 200, answer.text


def report(node: str, seq: int) -> bytes:
    return json.dumps({"node": node, "seq": seq, "sent_at": time.time(), "interval_seconds": 1.0}).encode()


def post(conn: http.client.HTTPConnection, path: str, token: str, body: bytes,
         headers: dict[str, str] | None = None) -> tuple[int, bytes]:
    conn.request("POST", path, body=body, headers={"authorization": f"Bearer {token}",
                                                   "content-type": "application/json", **(headers or {})})
    answer = conn.getresponse()
    return answer.status, answer.read()


def oversized(server: LiveServer, token: str) -> tuple[int, bytes]:
    """A report declaring 2 MB: refused on its headers (the client is still sending when the answer comes)."""
    with socket.create_connection(("127.0.0.1", server.port), timeout=10) as sock:
        sock.sendall(b"POST /api/v1/nodes/edge-0/reports HTTP/1.1\r\nhost: x\r\ncontent-type: application/json\r\n"
                     b"authorization: Bearer " + token.encode() + b"\r\ncontent-length: 2000000\r\n\r\n{")
        answer = http.client.HTTPResponse(sock)
        answer.begin()
        return answer.status, answer.read()


def test_every_report_acknowledged_through_the_workers_is_stored(edge: LiveServer, tmp_path: Path):
    token = edge.token("agent", "fleet")
    nodes = [f"edge-{i}" for i in range(8)]
    for node in nodes:
        register(edge, token, node)
    acked: dict[str, list[int]] = {node: [] for node in nodes}
    refused: list[tuple[int, bytes]] = []

    def send(node: str) -> None:  # one keep-alive connection per node, as an agent has
        conn = http.client.HTTPConnection("127.0.0.1", edge.port, timeout=30)
        for seq in range(1, 41):
            status, body = post(conn, f"/api/v1/nodes/{node}/reports", token, report(node, seq))
            if status != 200 or json.loads(body)["seq"] != seq:
                refused.append((status, body))
                break
            acked[node].append(seq)
        conn.close()

    threads = [threading.Thread(target=send, args=(node,)) for node in nodes]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not refused
    engine = create_engine(f"sqlite:///{tmp_path / 'edge.db'}")
    with engine.connect() as conn:
        stored = conn.execute(text("SELECT n.name, r.seq FROM report_receipts r JOIN nodes n ON n.id = r.node_id"))
        kept: dict[str, list[int]] = {}
        for name, seq in stored:
            kept.setdefault(name, []).append(int(seq))
    engine.dispose()
    assert {n: sorted(s) for n, s in kept.items()} == acked
    metrics = httpx.get(edge.url + "/metrics", headers={"authorization": f"Bearer {edge.admin_token}"}).text
    assert "sentinel_ingest_reports_total 320.0" in metrics


def test_refusals_are_the_one_process_servers(edge: LiveServer, single: LiveServer):
    """Status, body and the headers a client acts on, for each refusal, with and without the workers."""
    answers = []
    for server in (edge, single):
        token = server.token("agent", "one", node="edge-0")
        register(server, token, "edge-0")
        conn = http.client.HTTPConnection("127.0.0.1", server.port, timeout=30)
        seen = [
            post(conn, "/api/v1/nodes/edge-0/reports", "wrong", report("edge-0", 1)),
            post(conn, "/api/v1/nodes/edge-1/reports", token, report("edge-1", 1)),
            post(conn, "/api/v1/nodes/edge-0/reports", token, b"{not json"),
            post(conn, "/api/v1/nodes/edge-0/reports", token, report("edge-0", 5)),
            post(conn, "/api/v1/nodes/edge-0/reports", token, report("edge-0", 5)),
        ]
        conn.close()
        seen.append(oversized(server, token))
        answers.append([(status, json.loads(body)) for status, body in seen])
    assert [status for status, _ in answers[0]] == [401, 403, 400, 200, 200, 413]
    assert [body["status"] for _, body in answers[0][3:5]] == ["accepted", "duplicate"]
    assert answers[0] == answers[1]


def test_a_long_poll_waits_for_what_arrives_meanwhile(edge: LiveServer):
    token = edge.token("agent", "poller", node="edge-0")
    register(edge, token, "edge-0")
    got: list[httpx.Response] = []
    poll = threading.Thread(target=lambda: got.append(httpx.get(
        edge.url + "/api/v1/nodes/edge-0/commands", params={"wait": 10},
        headers={"authorization": f"Bearer {token}"}, timeout=20)))
    started = time.monotonic()
    poll.start()
    time.sleep(1.0)
    with edge.api() as api:
        pushed = api.post("/nodes/edge-0/inject", json={"accelerator_index": 0, "fault": "xid", "argument": 79})
    assert pushed.status_code == 202, pushed.text
    poll.join(15)
    assert got and got[0].status_code == 200, got
    assert [c["kind"] for c in got[0].json()] == ["inject"]
    assert 1.0 <= time.monotonic() - started < 5.0, "answered when the command came, not at the wait's end"


def test_a_chunked_body_and_a_large_answer_pass_whole(edge: LiveServer):
    token = edge.token("agent", "chunky", node="edge-0")
    register(edge, token, "edge-0")
    body = report("edge-0", 1)

    def pieces() -> Iterator[bytes]:
        for at in range(0, len(body), 7):
            yield body[at:at + 7]

    answer = httpx.post(edge.url + "/api/v1/nodes/edge-0/reports", content=pieces(),
                        headers={"authorization": f"Bearer {token}", "content-type": "application/json"})
    assert answer.status_code == 200, answer.text
    assert answer.json()["status"] == "accepted"
    spec = httpx.get(edge.url + "/openapi.json", timeout=10)
    assert spec.status_code == 200 and len(spec.content) > 100_000
    assert "/api/v1/nodes/{node}/reports" in spec.json()["paths"]


def test_a_worker_killed_is_replaced_and_the_server_answers_on(edge: LiveServer):
    before = workers_of(edge)
    assert len(before) == WORKERS
    os.kill(before[0], signal.SIGKILL)
    wait_for(lambda: len([p for p in workers_of(edge) if p not in before]) == 1 and len(workers_of(edge)) == WORKERS,
             timeout=10, what="a new worker")
    for _ in range(20):  # whichever worker takes the connection
        assert httpx.get(edge.url + "/healthz", timeout=5).json()["role"] == "leader"
    assert "edge worker exited" in edge.log_path.read_text()


def test_a_core_killed_takes_its_workers_with_it(edge: LiveServer):
    workers = workers_of(edge)
    edge.kill9()
    wait_for(lambda: not any(alive(p) for p in workers), timeout=10, what="the workers gone")
    with pytest.raises(httpx.ConnectError):
        httpx.get(edge.url + "/healthz", timeout=2)


def test_a_stop_stops_the_workers_and_the_core(edge: LiveServer):
    workers = workers_of(edge)
    assert edge.proc is not None
    edge.proc.send_signal(signal.SIGTERM)
    assert edge.proc.wait(15) == 0
    assert not any(alive(p) for p in workers)
    assert not list((edge.data_dir / "run").glob("*.sock")), "the core's socket is removed"
