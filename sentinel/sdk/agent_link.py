"""The SDK's one connection to the local agent: keep-alive HTTP, reopened after errors, one per process."""

from __future__ import annotations

import http.client
import json
import os
import threading
import urllib.parse
import weakref
from typing import Any


class AgentRefused(ValueError):
    """The agent answered 403, with its reason (collectors/sdk_gate.py)."""


class _AgentConnection:
    """One keep-alive connection to the agent, reopened after any error; safe from several threads.

    A forked child (a data-loader worker) gets a connection of its own: the agent takes each connection for
    the process that opened it, and two processes writing on one socket would interleave their requests."""

    def __init__(self, base_url: str):
        url = urllib.parse.urlsplit(base_url)
        self._host, self._port = url.hostname or "127.0.0.1", url.port or 80
        self._conn: http.client.HTTPConnection | None = None
        self._lock = threading.Lock()
        _CONNECTIONS.add(self)

    def _forget_after_fork(self) -> None:
        self._lock = threading.Lock()  # it may have been held by a thread the fork did not copy
        self._conn = None  # the parent's socket stays open for the parent

    def post_json(self, path: str, body: Any, timeout_seconds: float) -> None:
        payload = json.dumps(body, allow_nan=False)
        with self._lock:
            if self._conn is None:
                self._conn = http.client.HTTPConnection(self._host, self._port, timeout=timeout_seconds)
            conn = self._conn
            if conn.sock is not None:
                conn.sock.settimeout(timeout_seconds)
            try:
                conn.request("POST", path, body=payload, headers={"content-type": "application/json"})
                response = conn.getresponse()
                body = response.read()
            except BaseException:
                conn.close()
                self._conn = None
                raise
            if response.status == 403:
                raise AgentRefused(_detail(body))
            if response.status >= 300:
                raise ValueError(f"agent answered {response.status}")


_CONNECTIONS: weakref.WeakSet[_AgentConnection] = weakref.WeakSet()


def _detail(body: bytes) -> str:
    try:
        return str(json.loads(body)["detail"])
    except (ValueError, KeyError, TypeError):
        return f"agent answered 403: {body[:200]!r}"


def _after_fork_in_child() -> None:
    for connection in list(_CONNECTIONS):
        connection._forget_after_fork()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_after_fork_in_child)
