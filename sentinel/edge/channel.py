"""One end of the edge channel: frames in, frames out, over a Unix stream (edge/frames.py).

Writes made in one turn of the event loop leave in one `write` at its end: under load an edge worker's
requests, and the core's answers, share a system call instead of paying one each.
"""

from __future__ import annotations

import asyncio
import logging
from abc import ABC, abstractmethod
from collections import deque
from typing import Generic, TypeVar

from sentinel.edge.frames import ChannelBroken, Reader

log = logging.getLogger("sentinel.edge")
T = TypeVar("T")


class Mailbox(Generic[T]):
    """What arrived for one stream, in order; cheaper than an asyncio.Queue, and one per request."""

    def __init__(self) -> None:
        self.items: deque[T] = deque()
        self._arrived = asyncio.Event()

    def put(self, item: T) -> None:
        self.items.append(item)
        self._arrived.set()

    async def get(self) -> T:
        while not self.items:
            self._arrived.clear()
            await self._arrived.wait()
        return self.items.popleft()


class Channel(asyncio.Protocol, ABC):
    """The frames' protocol, shared by both ends; the core's (edge/core.py) and a worker's (edge/worker.py) say
    what a frame and a lost channel mean to them."""

    def __init__(self) -> None:
        self.reader = Reader()
        self.transport: asyncio.Transport | None = None
        self.lost = False
        self._out: list[bytes] = []
        self._writable = asyncio.Event()
        self._writable.set()

    # -- what a side does with its frames ---------------------------------------------------------------
    @abstractmethod
    def on_frame(self, kind: int, stream: int, payload: bytes) -> None: ...

    @abstractmethod
    def on_lost(self) -> None: ...

    # -- the protocol ---------------------------------------------------------------------------------
    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]

    def data_received(self, data: bytes) -> None:
        try:
            frames = self.reader.feed(data)
        except ChannelBroken as exc:
            self.close(str(exc))
            return
        for kind, stream, payload in frames:
            self.on_frame(kind, stream, payload)

    def close(self, why: str) -> None:
        log.error("edge channel closed: %s", why)
        if self.transport is not None:
            self.transport.close()

    def connection_lost(self, exc: Exception | None) -> None:
        self.lost = True
        self._writable.set()
        self.on_lost()

    def pause_writing(self) -> None:
        self._writable.clear()

    def resume_writing(self) -> None:
        self._writable.set()

    async def write(self, data: bytes) -> None:
        if not self._writable.is_set():
            await self._writable.wait()
        if self.lost or self.transport is None:
            return  # the other side is gone, and what was meant for it with it
        if not self._out:
            asyncio.get_running_loop().call_soon(self._flush)
        self._out.append(data)

    def _flush(self) -> None:
        data = self._out[0] if len(self._out) == 1 else b"".join(self._out)
        self._out.clear()
        if not self.lost and self.transport is not None:
            self.transport.write(data)
