"""The canary against the project's own serving engine (sentinel/demo/engine.py, a real HTTP server streaming
server-sent events, not a model): a healthy replica's answer passes; each fault the engine can play (an empty
200, a stream frozen mid-answer, a stream cut before [DONE], no engine at all, a 500) fails with its reason;
the agent's side starts one probe at a time, confirms a failure at once, and never blocks."""

from __future__ import annotations

import socket
import threading
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest

from collectors.engines.canary import Canary
from collectors.engines.watch import EngineWatch
from sentinel.demo.engine import Engine, serve
from sentinel.telemetry.schemas import Assignment
from tests.live import wait_for


@pytest.fixture
def engine(tmp_path: Path) -> Iterator[tuple[str, Path]]:
    fault = tmp_path / "fault"
    httpd = serve(Engine(step_seconds=0.005, per_request_seconds=0.0, fault_file=str(fault)), "127.0.0.1", 0)
    try:
        yield f"http://127.0.0.1:{httpd.server_address[1]}", fault
    finally:
        httpd.shutdown()
        httpd.server_close()


def probe(url: str, **options: Any) -> Any:
    return Canary(f"{url}/metrics", first_token_seconds=2.0, stall_seconds=0.5, **options).probe()


def test_a_healthy_replica_passes(engine: tuple[str, Path]) -> None:
    url, _ = engine
    result = probe(url)
    assert result.ok and result.reason is None and result.status == 200
    assert result.tokens == 8 and result.ttft_seconds is not None and 0 < result.ttft_seconds <= result.seconds
    assert result.detail == "finish_reason length"


@pytest.mark.parametrize("fault, reason, words", [
    ("empty", "empty", "200 and no text"),
    ("freeze", "timeout", "nothing for"),
    ("truncate", "truncated", "without [DONE]"),
])
def test_each_bad_answer_fails_with_its_reason(engine: tuple[str, Path], fault: str, reason: str,
                                               words: str) -> None:
    url, fault_file = engine
    assert probe(url).ok, "healthy first: the model name is learnt, as on a real replica"
    fault_file.write_text(fault)
    result = probe(url)
    assert not result.ok and result.reason == reason and result.status == 200, result
    assert words in result.detail


def test_a_stream_frozen_after_its_first_token_is_a_stall_not_a_slow_first_token(engine: tuple[str, Path]) -> None:
    url, fault_file = engine
    canary = Canary(f"{url}/metrics", first_token_seconds=2.0, stall_seconds=0.3, max_tokens=500)
    canary.model = "sentinel-demo-engine"
    threading.Timer(0.3, fault_file.write_text, args=("freeze",)).start()
    result = canary.probe()
    assert result.reason == "timeout" and result.tokens > 0 and "stream stopped after" in result.detail
    assert result.seconds < 2.0, "the stall limit, not the first-token limit, applied once tokens came"


class _Refusing(BaseHTTPRequestHandler):
    def do_GET(self) -> None:
        self.send_response(200)
        self.send_header("content-length", "40")
        self.end_headers()
        self.wfile.write(b'{"data": [{"id": "m", "object": "model"}]}'[:40])

    def do_POST(self) -> None:
        body = b'{"error": "EngineDeadError"}'
        self.send_response(500)
        self.send_header("content-length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args: object) -> None:
        pass


def test_a_500_and_no_engine_at_all_are_errors() -> None:
    httpd = ThreadingHTTPServer(("127.0.0.1", 0), _Refusing)
    threading.Thread(target=httpd.serve_forever, daemon=True).start()
    try:
        result = probe(f"http://127.0.0.1:{httpd.server_address[1]}", model="m")
        assert result.reason == "error" and result.status == 500 and "EngineDeadError" in result.detail
    finally:
        httpd.shutdown()
        httpd.server_close()
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    result = probe(f"http://127.0.0.1:{port}")
    assert result.reason == "error" and result.status is None and "ConnectionRefusedError" in result.detail


def test_an_engine_not_listening_yet_is_starting_and_once_it_has_answered_a_refusal_is_a_failure() -> None:
    """vLLM loads its weights for a minute before it listens: a canary refused then would have the replica
    replaced before it ever served (it did, in the first vLLM failover run)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    canary = Canary(f"http://127.0.0.1:{port}/metrics", every_seconds=0.0, model="m")
    results: list[Any] = []
    for _ in range(5):
        canary.tick()
        time.sleep(0.1)
        results.append(canary.tick())
    assert [r for r in results if r is not None] == [], "not listening yet: starting, nothing reported"
    httpd = ThreadingHTTPServer(("127.0.0.1", port), _Refusing)
    threading.Thread(target=httpd.serve_forever, daemon=True).start()
    try:
        first = wait_for(lambda: canary.tick(), timeout=10, what="a canary answered")
        assert (first.reason, first.status) == ("error", 500), "it answers: its 500 is a failure"
    finally:
        httpd.shutdown()
        httpd.server_close()
    gone = wait_for(lambda: (r := canary.tick()) is not None and r.status is None and r, timeout=10,
                    what="the refusal after it had answered")
    assert gone.reason == "error" and "Connection" in gone.detail  # refused, or reset by the closing server


def test_the_agent_starts_one_probe_at_a_time_and_confirms_a_failure_at_once(engine: tuple[str, Path]) -> None:
    url, fault_file = engine
    clock = [1000.0]
    canary = Canary(f"{url}/metrics", every_seconds=60.0, first_token_seconds=2.0, stall_seconds=0.5,
                    clock=lambda: clock[0])
    assert canary.tick() is None, "the first tick starts a probe; nothing is finished yet"
    assert wait_for_result(canary).ok
    fault_file.write_text("empty")
    clock[0] += 60.0
    canary.tick()
    first = wait_for_result(canary)
    assert first.reason == "empty"
    second = wait_for_result(canary)  # no time passed: the confirming probe went at once
    assert second.reason == "empty"
    started = time.monotonic()
    assert canary.tick() is None and time.monotonic() - started < 0.1, "a third waits for its period"


def wait_for_result(canary: Canary) -> Any:
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        result = canary.tick()
        if result is not None:
            return result
        time.sleep(0.02)
    raise AssertionError("no canary result within 10 s")


def test_the_watch_sends_the_canary_even_when_the_metrics_page_does_not_answer(engine: tuple[str, Path]) -> None:
    url, fault_file = engine
    fault_file.write_text("empty")
    watch = EngineWatch([f"7/0=vllm@{url}/metrics#d0:decode"], canary_seconds=60.0)
    placed = [Assignment(job_id=7, rank=0, pid=4242, accelerators=[])]
    batches: list[Any] = []
    wait_for(lambda: bool(batches.extend(watch.poll(placed)) or batches), timeout=10, what="a batch with a canary")
    stats = batches[0].serving
    assert stats.canary.reason == "empty" and stats.replica == "d0" and stats.stage == "decode"
    assert stats.requests == 0, "the demo engine has no vllm /metrics page: only the canary speaks"
