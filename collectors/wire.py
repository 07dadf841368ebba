"""The agent's report link: one kept-alive connection to the server in use.

Reports are the agent's one steady cost on the wire (one POST a cycle). httpx spent ~3× the CPU of a plain
http.client request per POST (its request and response models, header normalisation, the transport's
pool), so the push thread sends reports here; registration, commands and the CLI keep httpx. http.client
itself still wrote a request's head and body in two writes and parsed each answer's headers through the
email package; here a connection is opened by http.client (TLS, TCP_NODELAY), and a request is one write
and its answer read by `read_reply`.

The failover rules are sentinel/ha/failover.py's: stick to the server that last answered, move to the next
one when a server cannot be reached or answers 503 as a standby, go round the list once per request. A
kept-alive connection that the server closed while idle is reopened once on the same server before it
counts as unreachable (the report is idempotent on (node, seq), so sending it again is safe).
"""

from __future__ import annotations

import http.client
import io
import logging
import socket
import ssl
from dataclasses import dataclass
from urllib.parse import urlsplit

from sentinel.ha.failover import ROLE_HEADER, parse_servers

log = logging.getLogger("sentinel.agent.push")
MAX_LINE_BYTES = 65536
MAX_HEADERS = 100
ROLE_NAME = ROLE_HEADER.lower().encode()


class LinkError(OSError):
    """No server on the list could be reached (the last server's error is the cause)."""


@dataclass(frozen=True)
class Reply:
    status_code: int
    content: bytes
    role: str = ""

    @property
    def text(self) -> str:
        return self.content.decode("utf-8", "replace")


@dataclass(frozen=True)
class _Server:
    url: str
    https: bool
    host: str
    port: int


def _server(url: str) -> _Server:
    parts = urlsplit(url)
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise ValueError(f"server URL {url!r}: expected http://HOST[:PORT] or https://HOST[:PORT]")
    https = parts.scheme == "https"
    return _Server(url, https, parts.hostname, parts.port or (443 if https else 80))


class ReportLink:
    def __init__(self, servers: str | list[str] | None, *, token: str, ssl_context: ssl.SSLContext | None = None,
                 connect_timeout: float = 3.0, read_timeout: float = 10.0):
        self.servers = [_server(u) for u in parse_servers(servers)]
        self._header_lines = f"authorization: Bearer {token}\r\ncontent-type: application/json\r\n"
        self._head = b""
        self._ssl = ssl_context
        self._connect_timeout, self._read_timeout = connect_timeout, read_timeout
        self._current = 0
        self._conn: tuple[socket.socket, io.BufferedReader] | None = None

    @property
    def current(self) -> str:
        return self.servers[self._current].url

    def post(self, path: str, body: bytes) -> Reply:
        """POST to the server in use, failing over as the module says; LinkError when none answers."""
        start, count = self._current, len(self.servers)
        last_error: Exception | None = None
        reply: Reply | None = None
        for step in range(count):
            index = (start + step) % count
            if index != self._current:
                self.close()
                self._current = index
            try:
                reply = self._post_here(path, body)
            except (OSError, http.client.HTTPException) as exc:
                self.close()
                last_error, reply = exc, None
            else:
                standby = reply.status_code == 503 and reply.role.lower() == "standby"
                if not standby or step == count - 1:
                    if index != start:
                        log.warning("now talking to server %s", self.servers[index].url)
                    return reply
            if count > 1:
                log.info("server %s %s; trying the next one", self.servers[index].url,
                         "is a standby" if reply is not None else f"unreachable ({last_error})")
        self._current = start
        raise LinkError(f"{self.servers[start].url}: {last_error}") from last_error

    def _post_here(self, path: str, body: bytes) -> Reply:
        reused = self._conn is not None
        try:
            return self._exchange(path, body)
        except (http.client.RemoteDisconnected, ConnectionResetError, BrokenPipeError):
            self.close()
            if not reused:
                raise
            return self._exchange(path, body)  # the server closed an idle kept-alive connection

    def _exchange(self, path: str, body: bytes) -> Reply:
        """One request and its answer: the head and the body in one write (http.client wrote them apart, each
        write on loopback a syscall that also runs the server's side of TCP), the answer read by read_reply."""
        conn, stream = self._conn or self._open()
        conn.sendall(f"POST {path} HTTP/1.1\r\n".encode() + self._head + str(len(body)).encode() + b"\r\n\r\n"
                     + body)
        reply, keep_alive = read_reply(stream)
        if not keep_alive:
            self.close()
        return reply

    def _open(self) -> tuple[socket.socket, io.BufferedReader]:
        server = self.servers[self._current]
        conn: http.client.HTTPConnection
        if server.https:
            conn = http.client.HTTPSConnection(server.host, server.port, timeout=self._connect_timeout,
                                               context=self._ssl or ssl.create_default_context())
        else:
            conn = http.client.HTTPConnection(server.host, server.port, timeout=self._connect_timeout)
        conn.connect()  # http.client's connect: TLS with the server's name, TCP_NODELAY
        sock = conn.sock
        assert sock is not None
        sock.settimeout(self._read_timeout)
        host = f"[{server.host}]" if ":" in server.host else server.host
        default_port = 443 if server.https else 80
        self._head = (f"Host: {host}{'' if server.port == default_port else f':{server.port}'}\r\n"
                      f"Accept-Encoding: identity\r\n{self._header_lines}content-length: ").encode("latin-1")
        self._conn = (sock, sock.makefile("rb"))
        return self._conn

    def close(self) -> None:
        if self._conn is not None:
            sock, stream = self._conn
            self._conn = None
            stream.close()
            sock.close()


def read_reply(stream: io.BufferedIOBase) -> tuple[Reply, bool]:
    """The next answer on `stream` and whether the connection stays open after it. Its body is framed by
    content-length, chunked transfer coding, or the connection's end; 1xx answers are skipped. Raises
    http.client's exceptions: RemoteDisconnected when the server closed the connection before answering."""
    while True:
        line = stream.readline(MAX_LINE_BYTES + 1)
        if not line:
            raise http.client.RemoteDisconnected("the server closed the connection without an answer")
        version, _, rest = line.partition(b" ")
        code = rest[:3]
        if not version.startswith(b"HTTP/1.") or not code.isdigit() or len(line) > MAX_LINE_BYTES:
            raise http.client.BadStatusLine(line[:200].decode("latin-1"))
        status = int(code)
        length: int | None = None
        chunked = close = False
        keep_alive_header = False
        role = ""
        for _ in range(MAX_HEADERS + 1):
            header = stream.readline(MAX_LINE_BYTES + 1)
            if header in (b"\r\n", b"\n", b""):
                break
            name, _, value = header.partition(b":")
            name = name.strip().lower()
            if name == b"content-length":
                if not value.strip().isdigit():
                    raise http.client.HTTPException(f"bad content-length {value[:40]!r}")
                length = int(value)
            elif name == b"transfer-encoding":
                chunked = value.strip().lower().endswith(b"chunked")
            elif name == b"connection":
                close = b"close" in value.lower()
                keep_alive_header = b"keep-alive" in value.lower()
            elif name == ROLE_NAME:
                role = value.strip().decode("latin-1")
        else:
            raise http.client.LineTooLong(f"more than {MAX_HEADERS} header lines")
        if 100 <= status < 200:
            continue
        if not keep_alive_header and version == b"HTTP/1.0":
            close = True
        if status in (204, 304):
            content = b""
        elif chunked:
            content = _read_chunked(stream)
        elif length is not None:
            content = stream.read(length)
            if len(content) < length:
                raise http.client.IncompleteRead(content, length - len(content))
        else:  # framed by the connection's end
            content, close = stream.read(), True
        return Reply(status, content, role), not close


def _read_chunked(stream: io.BufferedIOBase) -> bytes:
    parts: list[bytes] = []
    while True:
        size_line = stream.readline(MAX_LINE_BYTES + 1)
        try:
            size = int(size_line.split(b";", 1)[0], 16)
        except ValueError:
            raise http.client.IncompleteRead(b"".join(parts)) from None
        if size == 0:
            break
        chunk = stream.read(size + 2)  # its data and CRLF
        if len(chunk) < size + 2:
            raise http.client.IncompleteRead(b"".join(parts) + chunk)
        parts.append(chunk[:size])
    while stream.readline(MAX_LINE_BYTES + 1) not in (b"\r\n", b"\n", b""):  # the trailer
        pass
    return b"".join(parts)
