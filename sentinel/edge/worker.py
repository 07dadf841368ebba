"""An edge worker: a process that holds the server's HTTP connections and hands every request to the core.

    python -m sentinel.edge.worker --fd N --channel PATH [--log-level warning] [--access-log] [--tls-* …]

It accepts on the listening socket the core made (inherited as `--fd`; every worker accepts on it), speaks
HTTP/1.1 and TLS with uvicorn, and passes each request's scope and body to the core over one Unix stream
(edge/frames.py); the core's answer goes back to the client as it arrives. It holds no state and imports
none of the server: when the core's channel closes, the core is gone, and the worker exits.
"""

from __future__ import annotations

import argparse
import asyncio
import itertools
import logging
import os
import socket
import sys
import time
from collections.abc import Callable
from typing import Any

from sentinel.edge.channel import Channel, Mailbox
from sentinel.edge.frames import BODY, GONE, LAST, START, frame, request_frame, start_of

log = logging.getLogger("sentinel.edge")
CONNECT_SECONDS = 30.0  # the core listens before it starts a worker; this covers a slow machine
CORE_GONE = b'{"detail":"the server is restarting; retry"}'


EdgeStream = Mailbox[tuple[int, bytes]]  # the core's frames for one request: (kind, payload)


class EdgeChannel(Channel):
    """The worker's connection to the core, shared by all its requests."""

    def __init__(self, on_lost: Callable[[], None]):
        super().__init__()
        self.streams: dict[int, EdgeStream] = {}
        self.ids = itertools.count(1)
        self._on_lost = on_lost

    def on_frame(self, kind: int, stream_id: int, payload: bytes) -> None:
        stream = self.streams.get(stream_id)
        if stream is not None:
            stream.put((kind, payload))

    def on_lost(self) -> None:
        for stream in self.streams.values():
            stream.put((0, b""))
        self._on_lost()


class EdgeApp:
    """The worker's ASGI app: every HTTP request, whatever its route, goes to the core as a stream."""

    def __init__(self, channel_path: str):
        self.channel_path = channel_path
        self.channel: EdgeChannel | None = None

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] == "lifespan":
            await self._lifespan(receive, send)
        elif scope["type"] == "http":
            await self._http(scope, receive, send)
        # websockets: the server has none; returning without accepting closes one

    async def _lifespan(self, receive: Any, send: Any) -> None:
        while True:
            message = await receive()
            if message["type"] == "lifespan.startup":
                try:
                    await self._connect()
                except OSError as exc:
                    await send({"type": "lifespan.startup.failed", "message": f"the core does not answer: {exc}"})
                    return
                await send({"type": "lifespan.startup.complete"})
            elif message["type"] == "lifespan.shutdown":
                await send({"type": "lifespan.shutdown.complete"})
                return

    async def _connect(self) -> None:
        loop = asyncio.get_running_loop()
        deadline = time.monotonic() + CONNECT_SECONDS
        while True:
            try:
                _, channel = await loop.create_unix_connection(lambda: EdgeChannel(self._core_gone),
                                                               self.channel_path)
                self.channel = channel
                return
            except OSError:
                if time.monotonic() > deadline:
                    raise
                await asyncio.sleep(0.1)

    @staticmethod
    def _core_gone() -> None:
        # The core is the parent and the state: without it this worker can answer nothing. Its clients see
        # their connections close and retry (agents spool), as they would for a single-process server.
        log.critical("the core's channel closed: exiting (pid %d)", os.getpid())
        logging.shutdown()
        os._exit(3)

    async def _http(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        channel = self.channel
        if channel is None or channel.lost:
            await _refuse(send)
            return
        stream_id = next(channel.ids)
        stream = channel.streams[stream_id] = EdgeStream()
        try:
            first = await receive()
            if first["type"] != "http.request":
                return
            more = bool(first.get("more_body", False))
            await channel.write(request_frame(stream_id, scope) + frame(BODY if more else LAST, stream_id,
                                                                         first.get("body", b"")))
            pump = asyncio.get_running_loop().create_task(self._pump(channel, stream_id, receive, more))
            try:
                await self._answer(stream, send)
            finally:
                if not pump.done():
                    pump.cancel()
        finally:
            channel.streams.pop(stream_id, None)

    @staticmethod
    async def _pump(channel: EdgeChannel, stream_id: int, receive: Any, more: bool) -> None:
        """The rest of the body, then the client's going away (a long-poll ends when its client does)."""
        while True:
            message = await receive()
            if message["type"] == "http.disconnect":
                await channel.write(frame(GONE, stream_id))
                return
            if more:
                more = bool(message.get("more_body", False))
                await channel.write(frame(BODY if more else LAST, stream_id, message.get("body", b"")))

    @staticmethod
    async def _answer(stream: EdgeStream, send: Any) -> None:
        started = False
        while True:
            kind, payload = await stream.get()
            if kind == START:
                status, headers, body = start_of(payload)
                await send({"type": "http.response.start", "status": status, "headers": headers})
                started = True
                if stream.items and stream.items[0][0] == LAST:  # the whole answer came in one write
                    last = stream.items.popleft()[1]
                    await send({"type": "http.response.body", "body": body + last})
                    return
                if body:
                    await send({"type": "http.response.body", "body": body, "more_body": True})
            elif kind in (BODY, LAST) and started:
                await send({"type": "http.response.body", "body": payload, "more_body": kind == BODY})
                if kind == LAST:
                    return
            else:  # the channel closed
                if not started:
                    await _refuse(send)
                return


async def _refuse(send: Any) -> None:
    await send({"type": "http.response.start", "status": 503, "headers": [
        (b"content-type", b"application/json"), (b"content-length", b"%d" % len(CORE_GONE)),
        (b"retry-after", b"1"), (b"connection", b"close")]})
    await send({"type": "http.response.body", "body": CORE_GONE})


def main(argv: list[str] | None = None) -> int:
    import uvicorn

    p = argparse.ArgumentParser(prog="python -m sentinel.edge.worker")
    p.add_argument("--fd", type=int, required=True, help="the listening socket the core made")
    p.add_argument("--channel", required=True, help="the core's Unix socket")
    p.add_argument("--log-level", default="warning")
    p.add_argument("--access-log", action="store_true")
    p.add_argument("--tls-certfile")
    p.add_argument("--tls-keyfile")
    p.add_argument("--tls-ca-certs")
    args = p.parse_args(argv)
    logging.basicConfig(level=args.log_level.upper(), stream=sys.stderr,
                        format="%(asctime)s %(levelname)-7s %(name)s: %(message)s")
    tls: dict[str, Any] = {}
    if args.tls_certfile:
        import ssl

        tls = {"ssl_certfile": args.tls_certfile, "ssl_keyfile": args.tls_keyfile}
        if args.tls_ca_certs:
            tls |= {"ssl_ca_certs": args.tls_ca_certs, "ssl_cert_reqs": ssl.CERT_REQUIRED}
    # The socket itself, not uvicorn's `fd=`: uvicorn takes an fd for a Unix socket, and a TCP connection taken
    # for one gets no TCP_NODELAY (every answer then waited ~40 ms for the client's delayed ACK).
    listener = socket.socket(fileno=args.fd)
    config = uvicorn.Config(EdgeApp(args.channel), log_level="warning", access_log=args.access_log,
                            server_header=False, lifespan="on", timeout_graceful_shutdown=5, **tls)
    uvicorn.Server(config).run(sockets=[listener])
    return 0


if __name__ == "__main__":
    sys.exit(main())
