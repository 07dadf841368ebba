"""A small REST client for the CLI and for launchers; errors carry the server's own message."""

from __future__ import annotations

import logging
import os
import time
from pathlib import Path
from typing import Any

import httpx

from sentinel.auth.tls import client_ssl_context
from sentinel.config import default_data_dir
from sentinel.ha.failover import failover_client

DEFAULT_SERVER = "http://127.0.0.1:9480"
log = logging.getLogger("sentinel.client")


class ApiError(RuntimeError):
    def __init__(self, status: int, detail: Any):
        self.status = status
        self.detail = detail
        super().__init__(f"HTTP {status}: {detail}")


def resolve_token(token: str | None, data_dir: Path | None = None) -> str | None:
    """Explicit token, then SENTINEL_TOKEN, then the local bootstrap admin token file if it is readable."""
    if token:
        return token
    if os.environ.get("SENTINEL_TOKEN"):
        return os.environ["SENTINEL_TOKEN"]
    path = (data_dir or Path(os.environ.get("SENTINEL_DATA_DIR") or default_data_dir())) / "admin-token"
    try:
        return path.read_text().strip() or None
    except OSError:
        return None


class SentinelClient:
    """`server` is one URL or a comma-separated list (a leader and its standbys): see sentinel/ha/failover.py."""

    def __init__(self, server: str | None = None, token: str | None = None, timeout: float = 15.0):
        self.server = server or os.environ.get("SENTINEL_SERVER") or DEFAULT_SERVER
        self.token = token
        headers = {"authorization": f"Bearer {token}"} if token else {}
        self._http = failover_client(self.server, headers=headers, timeout=timeout, verify=client_ssl_context())

    def request(self, method: str, path: str, **kwargs: Any) -> Any:
        response = self._http.request(method, "/api/v1" + path, **kwargs)
        if response.status_code >= 400:
            try:
                detail = response.json().get("detail")
            except ValueError:
                detail = response.text
            raise ApiError(response.status_code, detail)
        return response.json() if response.content else None

    def get(self, path: str, **params: Any) -> Any:
        return self.request("GET", path, params={k: v for k, v in params.items() if v is not None})

    def post(self, path: str, body: Any = None, *, retry_seconds: float = 0.0) -> Any:
        """With `retry_seconds`, a server that is away or has no leader yet (5xx, no connection) is asked
        again until then: what a launcher does while a standby takes over."""
        deadline = time.monotonic() + retry_seconds
        delay = 0.2
        while True:
            try:
                return self.request("POST", path, json=body)
            except (ApiError, httpx.TransportError) as exc:
                retryable = not isinstance(exc, ApiError) or exc.status in (429, 502, 503, 504)
                if not retryable or time.monotonic() + delay > deadline:
                    raise
                log.warning("POST %s failed, retrying: %s", path, exc)
                time.sleep(delay)
                delay = min(2.0, delay * 2)

    def close(self) -> None:
        self._http.close()
