"""A minimal HTTP/1.1 keep-alive client on asyncio streams, and the server list it fails over on."""

from __future__ import annotations

import asyncio
from urllib.parse import urlsplit


class HttpError(Exception):
    """The connection failed: try again, possibly on the next server."""


class Refused(HttpError):
    """The server answered, but not 200."""

    def __init__(self, status: int, text: str):
        super().__init__(f"{status}: {text}")
        self.status = status


class Connection:
    """One HTTP/1.1 keep-alive connection; one request at a time."""

    def __init__(self, host: str, port: int, timeout: float):
        self.host, self.port, self.timeout = host, port, timeout
        self._reader: asyncio.StreamReader | None = None
        self._writer: asyncio.StreamWriter | None = None

    async def request(self, method: str, path: str, token: str | None, body: bytes) -> tuple[int, bytes]:
        """A kept-alive connection the server closed while idle is reopened once, at no cost to the caller:
        what is sent here (registration, a report with its seq) is idempotent."""
        reused = self._writer is not None
        try:
            return await asyncio.wait_for(self._request(method, path, token, body), self.timeout)
        except (ConnectionError, asyncio.IncompleteReadError) as exc:
            self.close()
            if not reused:
                raise HttpError(f"{type(exc).__name__}: {exc}") from exc
        except (TimeoutError, OSError, ValueError) as exc:
            self.close()
            raise HttpError(f"{type(exc).__name__}: {exc}") from exc
        try:
            return await asyncio.wait_for(self._request(method, path, token, body), self.timeout)
        except (TimeoutError, OSError, asyncio.IncompleteReadError, ValueError) as exc:
            self.close()
            raise HttpError(f"{type(exc).__name__}: {exc}") from exc

    async def _request(self, method: str, path: str, token: str | None, body: bytes) -> tuple[int, bytes]:
        if self._writer is None:
            self._reader, self._writer = await asyncio.open_connection(self.host, self.port)
        assert self._reader is not None
        auth = f"Authorization: Bearer {token}\r\n" if token else ""
        head = (f"{method} {path} HTTP/1.1\r\nHost: {self.host}:{self.port}\r\n{auth}"
                f"Content-Type: application/json\r\nContent-Length: {len(body)}\r\n\r\n").encode()
        self._writer.write(head + body)
        header = await self._reader.readuntil(b"\r\n\r\n")
        status = int(header[9:12])
        length, close = 0, False
        for line in header.split(b"\r\n")[1:]:
            name, _, value = line.partition(b":")
            name = name.strip().lower()
            if name == b"content-length":
                length = int(value)
            elif name == b"connection" and value.strip().lower() == b"close":
                close = True
        answer = await self._reader.readexactly(length) if length else b""
        if close:
            self.close()
        return status, answer

    def close(self) -> None:
        if self._writer is not None:
            self._writer.close()
        self._reader = self._writer = None


class Servers:
    """The server URLs in failover order; all senders move to the next one together."""

    def __init__(self, urls: list[str]):
        self.urls = urls
        self.current = 0
        self.failovers = 0

    def address(self) -> tuple[str, int]:
        parts = urlsplit(self.urls[self.current])
        return parts.hostname or "127.0.0.1", parts.port or 80

    def fail(self, seen: int) -> None:
        """Move on from server `seen` (if no other sender has already)."""
        if len(self.urls) > 1 and seen == self.current:
            self.current = (self.current + 1) % len(self.urls)
            self.failovers += 1
