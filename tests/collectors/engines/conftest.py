"""The engine played by a real HTTP server on 127.0.0.1 serving exposition text the test sets (written from the
engines' documented metric definitions, not captured from a running engine); `/broken` answers 500."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest


class _Pages(BaseHTTPRequestHandler):
    pages: dict[str, str] = {}

    def do_GET(self) -> None:
        if self.path == "/broken":
            self.send_response(500)
            self.end_headers()
            return
        body = self.pages.get("/metrics", "").encode()
        self.send_response(200)
        self.send_header("content-type", "text/plain; version=0.0.4")
        self.send_header("content-length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args: object) -> None:
        pass


@pytest.fixture
def server() -> Iterator[tuple[str, dict[str, str]]]:
    pages: dict[str, str] = {}
    handler = type("Handler", (_Pages,), {"pages": pages})
    httpd = ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=httpd.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{httpd.server_address[1]}", pages
    finally:
        httpd.shutdown()
        httpd.server_close()
        thread.join(timeout=5)
