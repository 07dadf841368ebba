"""The channel between edge workers and the core: ASGI HTTP messages as frames on one Unix stream per worker.

A frame is a 9-byte header — payload length (u32), kind (u8), stream id (u32) — then the payload. An edge
worker numbers its requests (streams); the core runs the app once per stream and answers on the same id.

    edge → core   REQUEST  the scope's HTTP fields as JSON (method, path, raw path, query, headers, client…)
                  BODY     a chunk of the request body, more to come       LAST  the final chunk (may be empty)
                  GONE     the client went away (the app's receive() answers http.disconnect)
    core → edge   START    status and headers as JSON, with the first chunk of the response body after them
                  BODY     a chunk of the response body, more to come      LAST  the final chunk

A request whose body fits one read travels as REQUEST + LAST in one write, and a response whose body is one
`send` as one START frame with its LAST: a report is one write each way.
"""

from __future__ import annotations

import json
import struct
from typing import Any

HEADER = struct.Struct("!IBI")
REQUEST, BODY, LAST, GONE, START = 1, 2, 3, 4, 5
MAX_PAYLOAD_BYTES = 64 * 1024 * 1024  # a frame longer than this is a broken channel, not a request
START_HEAD = struct.Struct("!HI")  # status, length of the headers' JSON (the body follows it)


class ChannelBroken(Exception):
    """The bytes on the channel are not frames: the connection is closed (both sides are ours)."""


def frame(kind: int, stream: int, payload: bytes = b"") -> bytes:
    return HEADER.pack(len(payload), kind, stream) + payload


def request_frame(stream: int, scope: dict[str, Any]) -> bytes:
    """The fields of an HTTP scope the core's app reads; header names and values as latin-1 text."""
    client = scope.get("client")
    server = scope.get("server")
    fields = {"m": scope["method"], "p": scope["path"], "r": (scope.get("raw_path") or b"").decode("latin-1"),
              "q": scope.get("query_string", b"").decode("latin-1"), "s": scope.get("scheme", "http"),
              "v": scope.get("http_version", "1.1"), "rp": scope.get("root_path", ""),
              "h": [[k.decode("latin-1"), v.decode("latin-1")] for k, v in scope["headers"]],
              "c": list(client) if client else None, "sv": list(server) if server else None}
    return frame(REQUEST, stream, json.dumps(fields, separators=(",", ":")).encode())


def scope_of(payload: bytes) -> dict[str, Any]:
    """The HTTP scope a REQUEST frame carries, as an ASGI server would build it."""
    try:
        f = json.loads(payload)
        raw = f["r"].encode("latin-1")
        return {"type": "http", "asgi": {"version": "3.0", "spec_version": "2.3"}, "http_version": f["v"],
                "method": f["m"], "scheme": f["s"], "path": f["p"], "raw_path": raw or None,
                "query_string": f["q"].encode("latin-1"), "root_path": f["rp"],
                "headers": [(k.encode("latin-1"), v.encode("latin-1")) for k, v in f["h"]],
                "client": tuple(f["c"]) if f["c"] else None, "server": tuple(f["sv"]) if f["sv"] else None}
    except (ValueError, KeyError, TypeError, AttributeError) as exc:
        raise ChannelBroken(f"a request frame that is not a scope: {exc}") from exc


def start_frame(stream: int, status: int, headers: list[tuple[bytes, bytes]], body: bytes, last: bool) -> bytes:
    head = json.dumps([[k.decode("latin-1"), v.decode("latin-1")] for k, v in headers],
                      separators=(",", ":")).encode()
    return frame(START, stream, START_HEAD.pack(status, len(head)) + head + body) + (
        frame(LAST, stream) if last else b"")


def start_of(payload: bytes) -> tuple[int, list[tuple[bytes, bytes]], bytes]:
    """(status, headers, the first chunk of the body) of a START frame."""
    try:
        status, length = START_HEAD.unpack_from(payload)
        at = START_HEAD.size
        headers = [(k.encode("latin-1"), v.encode("latin-1")) for k, v in json.loads(payload[at:at + length])]
        return status, headers, payload[at + length:]
    except (struct.error, ValueError, TypeError) as exc:
        raise ChannelBroken(f"a start frame that is not one: {exc}") from exc


class Reader:
    """Frames out of a byte stream that arrives in arbitrary pieces."""

    def __init__(self) -> None:
        self._buffer = bytearray()

    def feed(self, data: bytes) -> list[tuple[int, int, bytes]]:
        """(kind, stream, payload) of every whole frame received so far."""
        buffer = self._buffer
        buffer += data
        frames = []
        at = 0
        while len(buffer) - at >= HEADER.size:
            length, kind, stream = HEADER.unpack_from(buffer, at)
            if length > MAX_PAYLOAD_BYTES or not REQUEST <= kind <= START:
                raise ChannelBroken(f"a frame header that is not one (kind {kind}, length {length})")
            end = at + HEADER.size + length
            if len(buffer) < end:
                break
            frames.append((kind, stream, bytes(buffer[at + HEADER.size:end])))
            at = end
        del buffer[:at]
        return frames
