"""The agent's HTTP endpoint (collectors/endpoint.py) on a real socket: what the SDK, Prometheus and curl-like
clients send, and what it answers."""

from __future__ import annotations

import http.client
import io
import json
import os
import socket
import threading
from collections.abc import Iterator

import pytest

from collectors.endpoint import BadRequest, read_request, serve
from collectors.sdk_gate import BatchRefused, Sender
from sentinel.telemetry.schemas import SdkBatch


class Recorder:
    """What the endpoint handed to the agent: identified connections and accepted batches."""

    def __init__(self) -> None:
        self.identified: list[tuple[tuple[str, int], int]] = []
        self.batches: list[SdkBatch] = []
        self.refuse_pid: int | None = None
        self.lock = threading.Lock()

    def identify(self, client: tuple[str, int], server: tuple[str, int], claimed_pid: int) -> Sender:
        with self.lock:
            self.identified.append((client, claimed_pid))
        return Sender(claimed_pid)

    def accept(self, batch: SdkBatch, sender: Sender) -> None:
        if batch.pid == self.refuse_pid:
            raise BatchRefused(f"pid {batch.pid} is not placed here")
        with self.lock:
            self.batches.append(batch)


@pytest.fixture
def endpoint() -> Iterator[tuple[int, Recorder]]:
    recorder = Recorder()
    server = serve("127.0.0.1", 0, metrics=lambda: (b"sentinel_up 1\n", "text/plain; version=0.0.4"),
                   identify=recorder.identify, accept=recorder.accept)
    yield int(server.server_address[1]), recorder
    server.shutdown()
    server.server_close()


def batch_body(pid: int = 4242, steps: int = 3) -> bytes:
    return json.dumps({"job_id": 1, "rank": 0, "pid": pid,
                       "steps": [[i, 1.7e9 + i, 0.01, 16, 0.001, None] for i in range(steps)],
                       "collectives": {"all_reduce": [steps, 0.003, 1024]}}).encode()


def exchange(port: int, raw: bytes) -> bytes:
    """Send raw bytes, read until the agent closes the connection."""
    with socket.create_connection(("127.0.0.1", port), timeout=5) as sock:
        sock.sendall(raw)
        sock.shutdown(socket.SHUT_WR)
        chunks = []
        while chunk := sock.recv(65536):
            chunks.append(chunk)
    return b"".join(chunks)


def test_batches_on_one_kept_alive_connection_are_taken_and_the_sender_found_once(endpoint):
    port, recorder = endpoint
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=5)
    for _ in range(3):
        conn.request("POST", "/v1/telemetry", body=batch_body(steps=90), headers={"content-type": "application/json"})
        response = conn.getresponse()
        assert (response.status, response.read()) == (204, b"")
        assert not response.will_close
    conn.close()
    assert [len(b.steps) for b in recorder.batches] == [90, 90, 90]
    assert len(recorder.identified) == 1 and recorder.identified[0][1] == 4242


def test_metrics_and_healthz_are_served_on_the_same_connection(endpoint):
    port, _ = endpoint
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=5)
    conn.request("GET", "/metrics?name[]=x", headers={"Accept-Encoding": "gzip"})
    response = conn.getresponse()
    assert (response.status, response.read()) == (200, b"sentinel_up 1\n")
    assert response.getheader("content-type") == "text/plain; version=0.0.4"
    assert response.getheader("date")
    conn.request("GET", "/healthz")
    response = conn.getresponse()
    assert (response.status, json.loads(response.read())) == (200, {"status": "ok"})
    conn.close()


@pytest.mark.parametrize(("request_bytes", "status"), [
    (b"GET /nowhere HTTP/1.1\r\nHost: x\r\n\r\n", 404),
    (b"POST /v1/other HTTP/1.1\r\ncontent-length: 2\r\n\r\n{}", 404),
    (b"DELETE /v1/telemetry HTTP/1.1\r\n\r\n", 501),
    (b"POST /v1/telemetry HTTP/1.1\r\ncontent-length: 9\r\n\r\nnot json!", 422),
    (b"POST /v1/telemetry HTTP/1.1\r\ncontent-length: 999999999\r\n\r\n", 413),
    (b"POST /v1/telemetry HTTP/1.1\r\ntransfer-encoding: chunked\r\n\r\n0\r\n\r\n", 411),
    (b"POST /v1/telemetry HTTP/1.1\r\ncontent-length: x\r\n\r\n", 400),
    (b"hello\r\n\r\n", 400),
    (b"GET /metrics HTTP/2.0\r\n\r\n", 505),
    (b"GET /metrics HTTP/1.1\r\nno colon here\r\n\r\n", 400),
    (b"GET /metrics HTTP/1.1\r\n" + b"x-h: 1\r\n" * 101 + b"\r\n", 431),
])
def test_what_cannot_be_taken_is_answered_with_its_status_and_the_connection_closed(endpoint, request_bytes, status):
    port, recorder = endpoint
    answer = exchange(port, request_bytes + b"GET /healthz HTTP/1.1\r\n\r\n")  # a second request is not read
    assert answer.startswith(f"HTTP/1.1 {status} ".encode())
    assert answer.count(b"HTTP/1.1 ") == 1 and b"\r\nconnection: close\r\n" in answer
    assert "detail" in json.loads(answer.partition(b"\r\n\r\n")[2])
    assert recorder.batches == []


def test_a_refused_batch_is_a_403_with_the_reason_and_closes_the_connection(endpoint):
    port, recorder = endpoint
    recorder.refuse_pid = 4242
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=5)
    conn.request("POST", "/v1/telemetry", body=batch_body())
    response = conn.getresponse()
    assert response.status == 403 and response.will_close
    assert json.loads(response.read()) == {"detail": "pid 4242 is not placed here"}


def test_expect_100_continue_and_http_1_0_are_answered_as_http_server_did(endpoint):
    port, recorder = endpoint
    body = batch_body()
    answer = exchange(port, b"POST /v1/telemetry HTTP/1.1\r\nExpect: 100-continue\r\nContent-Length: "
                      + str(len(body)).encode() + b"\r\nConnection: close\r\n\r\n" + body)
    assert answer.startswith(b"HTTP/1.1 100 Continue\r\n\r\nHTTP/1.1 204 No Content\r\n")
    answer = exchange(port, b"\r\nGET /healthz HTTP/1.0\r\n\r\nGET /healthz HTTP/1.0\r\n\r\n")
    assert answer.count(b"HTTP/1.1 200 OK") == 1 and b"connection: close" in answer  # 1.0: one request
    assert len(recorder.batches) == 1


def test_a_client_that_goes_away_mid_body_leaves_nothing_behind(endpoint):
    port, recorder = endpoint
    assert exchange(port, b"POST /v1/telemetry HTTP/1.1\r\ncontent-length: 500\r\n\r\n{\"job_id\"") == b""
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=5)  # the endpoint still serves others
    conn.request("POST", "/v1/telemetry", body=batch_body(pid=os.getpid()))
    assert conn.getresponse().status == 204
    assert [b.pid for b in recorder.batches] == [os.getpid()]


def test_read_request_takes_header_names_in_any_case_and_skips_the_rest():
    request = read_request(io.BytesIO(b"POST /v1/telemetry?x=1 HTTP/1.1\r\nHost: a\r\nCONTENT-LENGTH: 12\r\n"
                                      b"X-Other: y\r\nconnection: Close\r\n\r\n"))
    assert request is not None
    assert (request.method, request.path, request.content_length, request.keep_alive) == \
        (b"POST", "/v1/telemetry", 12, False)
    assert read_request(io.BytesIO(b"")) is None
    with pytest.raises(BadRequest) as bad:
        read_request(io.BytesIO(b"POST / HTTP/1.1\r\nContent-Length: 1\r\ncontent-length: 2\r\n\r\n"))
    assert bad.value.status == 400
