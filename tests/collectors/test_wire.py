"""The agent's report link (collectors/wire.py) against real HTTP servers: failover as failover_client does it,
one kept-alive connection, and a connection the server closed while idle reopened without losing the report."""

from __future__ import annotations

import contextlib
import http.client
import io
import shutil
import socket
import ssl
import subprocess
import threading
from typing import Any

import pytest

from collectors.wire import LinkError, ReportLink, read_reply
from tests.ha.test_leader import Fake
from tests.live import free_port


class KeepAlive:
    """An HTTP/1.1 server that keeps connections open, counts them, and can drop them all (an idle timeout)."""

    def __init__(self, tls: ssl.SSLContext | None = None) -> None:
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.url = f"http{'s' if tls else ''}://127.0.0.1:{self.listener.getsockname()[1]}"
        if tls is not None:
            self.listener = tls.wrap_socket(self.listener, server_side=True)
        self.connections: list[socket.socket] = []
        self.accepted = 0
        self.bodies: list[bytes] = []
        self.headers: list[str] = []
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while True:
            try:
                conn, _ = self.listener.accept()
            except OSError:
                return
            self.connections.append(conn)
            self.accepted += 1
            threading.Thread(target=self._serve, args=(conn,), daemon=True).start()

    def _serve(self, conn: socket.socket) -> None:
        stream = conn.makefile("rb")
        try:
            while True:
                head = b""
                while not head.endswith(b"\r\n\r\n"):
                    line = stream.readline()
                    if not line:
                        return
                    head += line
                text = head.decode()
                self.headers.append(text)
                lengths = [h.split(":", 1)[1] for h in text.split("\r\n") if h.lower().startswith("content-length")]
                length = int(lengths[0])
                self.bodies.append(stream.read(length))
                conn.sendall(b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\ncontent-type: application/json\r\n\r\n{}")
        except OSError:
            return

    def drop_all(self) -> None:
        while self.connections:
            conn = self.connections.pop()
            with contextlib.suppress(OSError):
                conn.shutdown(socket.SHUT_RDWR)
            conn.close()

    def close(self) -> None:
        self.listener.close()
        self.drop_all()


@pytest.fixture
def keep_alive() -> Any:
    server = KeepAlive()
    yield server
    server.close()


def test_reports_share_one_kept_alive_connection_with_the_token(keep_alive: KeepAlive):
    link = ReportLink(keep_alive.url, token="t0k")
    for n in range(5):
        assert link.post("/api/v1/nodes/n/reports", f"r{n}".encode()).status_code == 200
    assert keep_alive.accepted == 1
    assert keep_alive.bodies == [b"r0", b"r1", b"r2", b"r3", b"r4"]
    assert "authorization: Bearer t0k" in keep_alive.headers[0]
    assert "content-type: application/json" in keep_alive.headers[0]
    link.close()


def test_a_connection_closed_by_the_server_while_idle_is_reopened_and_the_report_sent(keep_alive: KeepAlive):
    link = ReportLink(keep_alive.url, token="t")
    link.post("/r", b"before")
    keep_alive.drop_all()
    assert link.post("/r", b"after").status_code == 200
    assert keep_alive.bodies == [b"before", b"after"] and keep_alive.accepted == 2
    link.close()


def test_the_link_skips_a_dead_server_and_a_standby_and_sticks_to_the_leader():
    dead = f"http://127.0.0.1:{free_port()}"
    standby, leader = Fake(standby=True), Fake(standby=False)
    try:
        link = ReportLink(f"{dead},{standby.url},{leader.url}", token="t", connect_timeout=2.0)
        assert link.post("/r", b"report-1").status_code == 200
        assert standby.bodies == [b"report-1"] and leader.bodies == [b"report-1"]
        assert link.current == leader.url
        link.post("/r", b"report-2")
        assert standby.bodies == [b"report-1"], "the link sticks to the server that answered"
        leader.close()
        standby.standby = False  # promoted: the next report finds it
        assert link.post("/r", b"report-3").status_code == 200 and standby.bodies[-1] == b"report-3"
        assert link.current == standby.url
    finally:
        standby.close()


def test_with_only_standbys_the_503_comes_back_to_retry_later():
    only = Fake(standby=True)
    try:
        reply = ReportLink(only.url, token="t").post("/r", b"x")
        assert reply.status_code == 503 and reply.role == "standby"
    finally:
        only.close()


def test_all_servers_away_raise_link_error_naming_the_server():
    first = f"http://127.0.0.1:{free_port()}"
    link = ReportLink(f"{first},http://127.0.0.1:{free_port()}", token="t", connect_timeout=1.0)
    with pytest.raises(LinkError, match=first):
        link.post("/r", b"x")
    assert link.current == first, "the link starts from the same server next time"


def test_a_url_that_is_not_http_is_refused_at_once():
    with pytest.raises(ValueError, match="expected http"):
        ReportLink("ftp://example", token="t")


@pytest.mark.parametrize(("answer", "status", "content", "role", "keep_alive"), [
    (b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\n{}", 200, b"{}", "", True),
    (b"HTTP/1.1 100 Continue\r\n\r\nHTTP/1.1 200 OK\r\ncontent-length: 2\r\n\r\n{}", 200, b"{}", "", True),
    (b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n3;x=1\r\n{\"a\r\n4\r\n\":1}\r\n0\r\nX-T: 1\r\n\r\n",
     200, b'{"a":1}', "", True),
    (b"HTTP/1.1 503 Service Unavailable\r\nX-Sentinel-Role: standby\r\nContent-Length: 0\r\n\r\n", 503, b"", "standby",
     True),
    (b"HTTP/1.1 200 OK\r\nConnection: close\r\nContent-Length: 2\r\n\r\n{}", 200, b"{}", "", False),
    (b"HTTP/1.0 200 OK\r\nContent-Length: 2\r\n\r\n{}", 200, b"{}", "", False),
    (b"HTTP/1.0 200 OK\r\nConnection: keep-alive\r\nContent-Length: 2\r\n\r\n{}", 200, b"{}", "", True),
    (b"HTTP/1.1 200 OK\r\n\r\nto the end", 200, b"to the end", "", False),
    (b"HTTP/1.1 204 No Content\r\n\r\n", 204, b"", "", True),
])
def test_an_answer_is_read_by_its_framing(answer, status, content, role, keep_alive):
    reply, keep = read_reply(io.BytesIO(answer))
    assert (reply.status_code, reply.content, reply.role, keep) == (status, content, role, keep_alive)


@pytest.mark.parametrize(("answer", "error"), [
    (b"", http.client.RemoteDisconnected),
    (b"SSH-2.0-OpenSSH\r\n", http.client.BadStatusLine),
    (b"HTTP/1.1 200 OK\r\nContent-Length: 10\r\n\r\nshort", http.client.IncompleteRead),
    (b"HTTP/1.1 200 OK\r\nContent-Length: many\r\n\r\n", http.client.HTTPException),
])
def test_an_answer_that_cannot_be_read_raises_what_http_client_raised(answer, error):
    with pytest.raises(error):
        read_reply(io.BytesIO(answer))


@pytest.mark.skipif(shutil.which("openssl") is None, reason="openssl is not installed")
def test_reports_go_over_https_to_a_server_the_context_trusts(tmp_path):
    subprocess.run(["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-keyout", "key.pem", "-out",
                    "cert.pem", "-days", "1", "-subj", "/CN=localhost", "-addext", "subjectAltName=IP:127.0.0.1"],
                   cwd=tmp_path, check=True, capture_output=True, timeout=60)
    tls = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    tls.load_cert_chain(tmp_path / "cert.pem", tmp_path / "key.pem")
    server = KeepAlive(tls)
    try:
        link = ReportLink(server.url, token="t", ssl_context=ssl.create_default_context(cafile=tmp_path / "cert.pem"))
        assert [link.post("/r", body).status_code for body in (b"one", b"two")] == [200, 200]
        assert server.bodies == [b"one", b"two"] and server.accepted == 1
        link.close()
        with pytest.raises(LinkError):  # a server the context does not trust is not talked to
            ReportLink(server.url, token="t", ssl_context=ssl.create_default_context()).post("/r", b"three")
        assert server.bodies == [b"one", b"two"]
    finally:
        server.close()
