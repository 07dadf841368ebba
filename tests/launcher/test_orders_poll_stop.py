"""A server that stops while a launcher long-polls its orders stops cleanly: one log line, no traceback.

The real app under a real uvicorn on a loopback port; uvicorn cancels a request that outlives its graceful
shutdown (as `sentinel server` does with TLS, or on a second Ctrl-C), which is the stop the launcher sees.
"""

from __future__ import annotations

import logging
import threading
import time
from pathlib import Path
from typing import Any

import httpx
import pytest
import uvicorn

from sentinel.app import create_app
from sentinel.config import Settings
from tests.live import free_port


class Records(logging.Handler):
    def __init__(self) -> None:
        super().__init__(logging.DEBUG)
        self.records: list[logging.LogRecord] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.records.append(record)


@pytest.fixture
def served(tmp_path: Path) -> Any:
    settings = Settings(data_dir=tmp_path / "data", database_url=f"sqlite:///{tmp_path / 'sentinel.db'}")
    port = free_port()
    server = uvicorn.Server(uvicorn.Config(create_app(settings, run_scheduler=False), host="127.0.0.1", port=port,
                                           log_level="info", timeout_graceful_shutdown=1))
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    deadline = time.monotonic() + 30
    while not server.started and time.monotonic() < deadline:
        time.sleep(0.05)
    assert server.started
    yield server, f"http://127.0.0.1:{port}", settings
    server.should_exit = True
    thread.join(10)


def test_a_stop_during_an_orders_long_poll_logs_one_line_and_no_traceback(served: Any) -> None:
    server, url, settings = served
    token = settings.admin_token_file.read_text().strip()
    headers = {"authorization": f"Bearer {token}"}
    job = httpx.post(f"{url}/api/v1/jobs", json={"name": "poller", "kind": "training", "world_size": 1},
                     headers=headers, timeout=10).json()
    answers: list[Any] = []

    def poll() -> None:
        try:
            r = httpx.get(f"{url}/api/v1/jobs/{job['id']}/orders", params={"wait": 30}, headers=headers, timeout=40)
            answers.append(r.json() if r.status_code == 200 else r.status_code)
        except httpx.HTTPError as exc:
            answers.append(type(exc).__name__)

    records = Records()
    logging.getLogger().addHandler(records)
    said_by = logging.getLogger("sentinel.remediation")
    level = said_by.level
    said_by.setLevel(logging.INFO)  # as `sentinel server` runs (log_level INFO)
    try:
        poller = threading.Thread(target=poll)
        poller.start()
        time.sleep(0.5)  # the poll is waiting on the server
        server.should_exit = True
        poller.join(15)
    finally:
        logging.getLogger().removeHandler(records)
        said_by.setLevel(level)

    assert not poller.is_alive() and answers, "the long-poll ended with the stop"
    assert answers == [[]], "the launcher got an answer (nothing new), not a dropped connection"
    tracebacks = [r for r in records.records if r.exc_info or (r.levelno >= logging.ERROR
                  and "timeout graceful shutdown" not in r.getMessage())]
    assert tracebacks == [], [r.getMessage() for r in tracebacks]
    said = [r.getMessage() for r in records.records if r.name == "sentinel.remediation"]
    assert len([m for m in said if "long-poll" in m and f"job={job['id']}" in m]) == 1, said
