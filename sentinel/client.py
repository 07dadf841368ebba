"""A small REST client for the CLI and for launchers; errors carry the server's own message."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import httpx

from sentinel.config import default_data_dir

DEFAULT_SERVER = "http://127.0.0.1:9480"


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
    def __init__(self, server: str | None = None, token: str | None = None, timeout: float = 15.0):
        self.server = server or os.environ.get("SENTINEL_SERVER") or DEFAULT_SERVER
        self.token = token
        headers = {"authorization": f"Bearer {token}"} if token else {}
        self._http = httpx.Client(base_url=self.server, headers=headers, timeout=timeout)

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

    def post(self, path: str, body: Any = None) -> Any:
        return self.request("POST", path, json=body)

    def close(self) -> None:
        self._http.close()
