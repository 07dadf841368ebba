"""The edge channel's frames: a request and an answer survive any split of the byte stream, and bytes that
are not frames break the channel instead of being read as a request."""

from __future__ import annotations

import pytest

from sentinel.edge.frames import (
    BODY,
    GONE,
    HEADER,
    LAST,
    REQUEST,
    START,
    ChannelBroken,
    Reader,
    frame,
    request_frame,
    scope_of,
    start_frame,
    start_of,
)

SCOPE = {"type": "http", "method": "POST", "path": "/api/v1/nodes/n-é/reports",
         "raw_path": b"/api/v1/nodes/n-%C3%A9/reports",
         "query_string": b"a=1&b=%00", "headers": [(b"authorization", b"Bearer x"), (b"x-bytes", b"\xe9\xff")],
         "client": ("10.1.2.3", 40000), "server": ("127.0.0.1", 9480), "scheme": "https", "http_version": "1.1",
         "root_path": ""}


def test_a_request_and_its_body_survive_every_split_of_the_stream():
    data = request_frame(7, SCOPE) + frame(BODY, 7, b"{\"a\":") + frame(LAST, 7, b"1}") + frame(GONE, 7)
    for size in (1, 2, 3, 9, 10, 64, len(data)):
        reader = Reader()
        frames = []
        for at in range(0, len(data), size):
            frames += reader.feed(data[at:at + size])
        assert [(kind, stream) for kind, stream, _ in frames] == [(REQUEST, 7), (BODY, 7), (LAST, 7), (GONE, 7)]
        assert b"".join(payload for kind, _, payload in frames if kind in (BODY, LAST)) == b'{"a":1}'
        scope = scope_of(frames[0][2])
        for key in ("method", "path", "raw_path", "query_string", "headers", "client", "server", "scheme"):
            assert scope[key] == SCOPE[key], key


def test_an_answer_keeps_its_status_headers_and_first_chunk():
    headers = [(b"content-type", b"application/json"), (b"retry-after", b"1")]
    data = start_frame(3, 429, headers, b'{"detail":"slow down"}', last=True)
    [(kind, stream, payload), (last, _, rest)] = Reader().feed(data)
    assert (kind, stream, last, rest) == (START, 3, LAST, b"")
    assert start_of(payload) == (429, headers, b'{"detail":"slow down"}')


@pytest.mark.parametrize("bad", [
    HEADER.pack(5, 99, 1) + b"12345",  # no such kind
    HEADER.pack(2**31, BODY, 1),  # longer than any request may be
])
def test_bytes_that_are_not_frames_break_the_channel(bad):
    with pytest.raises(ChannelBroken):
        Reader().feed(bad)


def test_a_request_frame_that_is_not_a_scope_breaks_the_channel():
    with pytest.raises(ChannelBroken):
        scope_of(b"not json")
    with pytest.raises(ChannelBroken):
        scope_of(b'{"m": "GET"}')
