"""The core's end of the edge channel: every stream an edge worker opens is one call of the app.

The core holds the state (live windows, detection, incidents, the group-commit writer) and runs the app as
the single-process server would, but the HTTP connections — parsing, keep-alive, TLS — are the edge
workers' (edge/worker.py). What reaches the app is the scope, the body and, for a client that went away,
`http.disconnect`: routes, middlewares and the report fast path see no difference.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable
from typing import Any

from sentinel.edge.channel import Channel, Mailbox
from sentinel.edge.frames import BODY, GONE, LAST, REQUEST, ChannelBroken, frame, scope_of, start_frame

log = logging.getLogger("sentinel.edge")

ASGIApp = Callable[[dict[str, Any], Callable[[], Awaitable[dict[str, Any]]],
                    Callable[[dict[str, Any]], Awaitable[None]]], Awaitable[None]]
INTERNAL_ERROR = b'{"detail":"internal error; the server logged it"}'
JSON = [(b"content-type", b"application/json")]
DISCONNECT = {"type": "http.disconnect"}


class Stream:
    """One request: its receive() and send() for the app."""

    def __init__(self, channel: CoreChannel, stream_id: int):
        self.channel = channel
        self.id = stream_id
        self.messages: Mailbox[dict[str, Any]] = Mailbox()
        self.start: dict[str, Any] | None = None  # held until the first body, to go in one frame with it
        self.started = False
        self.finished = False

    async def receive(self) -> dict[str, Any]:
        return await self.messages.get()

    async def send(self, message: dict[str, Any]) -> None:
        if self.finished:
            return
        kind = message["type"]
        if kind == "http.response.start":
            self.start, self.started = message, True
            return
        if kind != "http.response.body":
            return
        body, more = bytes(message.get("body", b"")), bool(message.get("more_body", False))
        if self.start is not None:
            data = start_frame(self.id, self.start["status"], list(self.start.get("headers", [])), body,
                               last=not more)
            self.start = None
        else:
            data = frame(LAST if not more else BODY, self.id, body)
        self.finished = not more
        await self.channel.write(data)

    async def finish(self) -> None:
        """After the app returned: whatever it left unsaid (no response: a 500; no last body: the end)."""
        if self.finished:
            return
        if not self.started:
            await self.channel.write(start_frame(self.id, 500, [*JSON, (b"content-length", b"%d" % len(
                INTERNAL_ERROR))], INTERNAL_ERROR, last=True))
        else:
            await self.send({"type": "http.response.body", "body": b"", "more_body": False})
        self.finished = True


class CoreChannel(Channel):
    """One edge worker's connection to the core."""

    def __init__(self, app: ASGIApp):
        super().__init__()
        self.app = app
        self.streams: dict[int, Stream] = {}

    def on_frame(self, kind: int, stream_id: int, payload: bytes) -> None:
        if kind == REQUEST:
            try:
                scope = scope_of(payload)
            except ChannelBroken as exc:
                self.close(str(exc))
                return
            stream = self.streams[stream_id] = Stream(self, stream_id)
            asyncio.get_running_loop().create_task(self._run(stream, scope))
            return
        found = self.streams.get(stream_id)
        if found is None:  # answered already: the rest of its body, or its client leaving, is moot
            return
        if kind in (BODY, LAST):
            found.messages.put({"type": "http.request", "body": payload, "more_body": kind == BODY})
        elif kind == GONE:
            found.messages.put(DISCONNECT)

    async def _run(self, stream: Stream, scope: dict[str, Any]) -> None:
        try:
            await self.app(scope, stream.receive, stream.send)
        except Exception:
            log.exception("unhandled error: %s %s", scope["method"], scope["path"])
        finally:
            try:
                await stream.finish()
            finally:
                self.streams.pop(stream.id, None)

    def on_lost(self) -> None:
        for stream in self.streams.values():
            stream.messages.put(DISCONNECT)


class Lifespan:
    """The ASGI lifespan protocol, driven by the core itself (no HTTP server runs in it)."""

    def __init__(self, app: ASGIApp):
        self.app = app
        self._to_app: asyncio.Queue[dict[str, Any]] = asyncio.Queue()
        self._from_app: asyncio.Queue[dict[str, Any]] = asyncio.Queue()
        self._task: asyncio.Task[None] | None = None

    async def startup(self) -> None:
        self._task = asyncio.get_running_loop().create_task(self._main())
        await self._to_app.put({"type": "lifespan.startup"})
        answer = await self._from_app.get()
        if answer["type"] != "lifespan.startup.complete":
            raise RuntimeError(f"the app did not start: {answer.get('message', answer['type'])}")

    async def shutdown(self) -> None:
        if self._task is None or self._task.done():
            return
        await self._to_app.put({"type": "lifespan.shutdown"})
        answer = await self._from_app.get()
        if answer["type"] != "lifespan.shutdown.complete":
            log.error("the app did not stop cleanly: %s", answer.get("message", answer["type"]))
        await self._task

    async def _main(self) -> None:
        scope = {"type": "lifespan", "asgi": {"version": "3.0", "spec_version": "2.0"}, "state": {}}
        try:
            await self.app(scope, self._to_app.get, self._from_app.put)
        except BaseException as exc:  # the app's startup raised: say so to whoever waits
            await self._from_app.put({"type": "lifespan.startup.failed", "message": repr(exc)})
            raise
