"""Clients of a highly available Sentinel: a list of server URLs, tried in turn.

`SENTINEL_SERVER` (and every `--server`) takes one URL or several, comma-separated. A client sticks to the
server that last answered; it moves to the next one when a server cannot be reached, or answers 503 as a
standby (`X-Sentinel-Role: standby`), and it goes round the list once per request before giving up. The
request is the same bytes every time, so a report retried on another server is still idempotent on
(node, seq).
"""

from __future__ import annotations

import logging
import threading
from typing import Any

import httpx

log = logging.getLogger("sentinel.failover")

ROLE_HEADER = "X-Sentinel-Role"


def parse_servers(value: str | list[str] | None, default: str = "http://127.0.0.1:9480") -> list[str]:
    """'http://a:9480, http://b:9480' → ['http://a:9480', 'http://b:9480'] (trailing slashes dropped)."""
    items = value if isinstance(value, list) else (value or "").split(",")
    urls = [u.strip().rstrip("/") for u in items if u and u.strip()]
    return urls or [default]


def is_standby(response: httpx.Response) -> bool:
    return response.status_code == 503 and response.headers.get(ROLE_HEADER, "").lower() == "standby"


class FailoverTransport(httpx.BaseTransport):
    """An httpx transport over several servers. Give the client `base_url=servers[0]`; each request's
    scheme, host and port are rewritten to the server in use."""

    def __init__(self, servers: list[str], **transport_options: Any):
        self.servers = [httpx.URL(s) for s in servers]
        self._inner = httpx.HTTPTransport(**transport_options)
        self._current = 0
        self._lock = threading.Lock()

    @property
    def current(self) -> str:
        return str(self.servers[self._current]).rstrip("/")

    def handle_request(self, request: httpx.Request) -> httpx.Response:
        with self._lock:
            start = self._current
        last_error: Exception | None = None
        response: httpx.Response | None = None
        for step in range(len(self.servers)):
            index = (start + step) % len(self.servers)
            server = self.servers[index]
            request.url = request.url.copy_with(scheme=server.scheme, host=server.host, port=server.port)
            request.headers["host"] = request.url.netloc.decode("ascii")
            try:
                response = self._inner.handle_request(request)
            except httpx.TransportError as exc:
                last_error = exc
                response = None
            else:
                if not is_standby(response) or step == len(self.servers) - 1:
                    self._settle(index, start)
                    return response
                response.read()
                response.close()
            if len(self.servers) > 1:
                log.info("server %s %s; trying the next one", server,
                         "is a standby" if response is not None else f"unreachable ({last_error})")
        assert last_error is not None
        raise last_error

    def _settle(self, index: int, start: int) -> None:
        with self._lock:
            if index != start:
                log.warning("now talking to server %s", self.servers[index])
            self._current = index

    def close(self) -> None:
        self._inner.close()


def failover_client(servers: str | list[str] | None, *, headers: dict[str, str] | None = None,
                    timeout: httpx.Timeout | float = 15.0, **transport_options: Any) -> httpx.Client:
    """An httpx.Client over one or several servers (`transport_options` such as `verify` go to the transport)."""
    urls = parse_servers(servers)
    return httpx.Client(base_url=urls[0], headers=headers or {}, timeout=timeout,
                        transport=FailoverTransport(urls, **transport_options))
