"""The agent's report link: one kept-alive http.client connection to the server in use.

Reports are the agent's one steady cost on the wire (one POST a cycle). httpx spent ~3× the CPU of a plain
http.client request per POST (its request and response models, header normalisation, the transport's
pool), so the push thread sends reports here; registration, commands and the CLI keep httpx.

The failover rules are sentinel/ha/failover.py's: stick to the server that last answered, move to the next
one when a server cannot be reached or answers 503 as a standby, go round the list once per request. A
kept-alive connection that the server closed while idle is reopened once on the same server before it
counts as unreachable (the report is idempotent on (node, seq), so sending it again is safe).
"""

from __future__ import annotations

import http.client
import logging
import ssl
from dataclasses import dataclass
from urllib.parse import urlsplit

from sentinel.ha.failover import ROLE_HEADER, parse_servers

log = logging.getLogger("sentinel.agent.push")


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
        self._headers = {"authorization": f"Bearer {token}", "content-type": "application/json"}
        self._ssl = ssl_context
        self._connect_timeout, self._read_timeout = connect_timeout, read_timeout
        self._current = 0
        self._conn: http.client.HTTPConnection | None = None

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
        conn = self._conn or self._open()
        conn.request("POST", path, body=body, headers=self._headers)
        response = conn.getresponse()
        content = response.read()
        if response.will_close:
            self.close()
        return Reply(response.status, content, response.getheader(ROLE_HEADER, ""))

    def _open(self) -> http.client.HTTPConnection:
        server = self.servers[self._current]
        conn: http.client.HTTPConnection
        if server.https:
            conn = http.client.HTTPSConnection(server.host, server.port, timeout=self._connect_timeout,
                                               context=self._ssl or ssl.create_default_context())
        else:
            conn = http.client.HTTPConnection(server.host, server.port, timeout=self._connect_timeout)
        conn.connect()
        assert conn.sock is not None
        conn.sock.settimeout(self._read_timeout)
        self._conn = conn
        return conn

    def close(self) -> None:
        if self._conn is not None:
            self._conn.close()
            self._conn = None
