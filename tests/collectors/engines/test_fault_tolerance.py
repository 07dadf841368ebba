"""The agent's reader of an engine's fault-tolerance status (collectors/engines/fault_tolerance.py), on real HTTP:
against the project's demo engine with its stand-in of the API (a failed engine core waits; `retry` resumes it;
`scale_down` resumes it with half its batch limit; an instruction it does not take is refused), against one that
does not expose it (404: asked again only after a while, said once), and against bad answers (skipped, one log
line each, never raised). The engine watch carries the status on the wire, alone when /metrics does not answer."""

from __future__ import annotations

import json
import logging
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest

from collectors.engines.fault_tolerance import FaultToleranceReader, parse_status
from collectors.engines.watch import EngineWatch
from sentinel.demo.engine import Engine, serve
from sentinel.demo.fault_tolerance import FaultTolerance
from sentinel.launcher.fault_tolerance import apply
from sentinel.telemetry.schemas import Assignment
from tests.conftest import FakeClock
from tests.live import wait_for


@pytest.fixture
def engine(tmp_path: Path) -> Iterator[tuple[int, Path, Engine]]:
    fault = tmp_path / "fault"
    eng = Engine(step_seconds=0.005, per_request_seconds=0.0, fault_file=str(fault), max_batch=8,
                 ft=FaultTolerance(enabled=True, instructions=("retry", "scale_down")))
    httpd = serve(eng, "127.0.0.1", 0)
    try:
        yield httpd.server_address[1], fault, eng
    finally:
        httpd.shutdown()
        httpd.server_close()


def states(reader: FaultToleranceReader) -> list[tuple[int, str, str]]:
    status = reader.read()
    assert status is not None, reader.last_error
    return [(e.rank, e.state, e.fault) for e in status.engines]


def fail_core(port: int, fault: Path, eng: Engine) -> FaultToleranceReader:
    reader = FaultToleranceReader(f"http://127.0.0.1:{port}/metrics")
    assert states(reader) == [(0, "healthy", "")]
    fault.write_text("engine_core")
    eng.submit(4, 4)  # the scheduler's next step meets the fault
    wait_for(lambda: eng.ft.state == "unhealthy", timeout=5, what="the engine core failed")
    return reader


def test_a_failed_engine_core_says_so_and_a_retry_resumes_it(engine: tuple[int, Path, Engine]) -> None:
    port, fault, eng = engine
    reader = fail_core(port, fault, eng)
    assert states(reader) == [(0, "unhealthy", "EngineCoreFault")]
    assert reader.path == "/fault_tolerance/status", "vLLM 0.32's path, without a prefix"
    fault.write_text("")  # a transient fault: gone by the time the retry comes
    assert apply(port, "retry") == (True, "HTTP 202 Request accepted; poll /fault_tolerance/status for updates.")
    assert states(reader) == [(0, "healthy", "")]
    seq = eng.submit(4, 3)
    assert [seq.out.get(timeout=5) for _ in range(3)] == [" t1", " t2", " t3"], "it serves again"


def test_a_persistent_fault_fails_it_again_and_a_scale_down_resumes_it_smaller(
        engine: tuple[int, Path, Engine]) -> None:
    port, fault, eng = engine
    reader = fail_core(port, fault, eng)
    assert apply(port, "retry")[0]
    eng.submit(4, 4)
    wait_for(lambda: eng.ft.state == "unhealthy" and eng.ft.applied == ["retry"], timeout=5, what="failed again")
    assert states(reader)[0][1] == "unhealthy"
    accepted, answer = apply(port, "scale_down")
    assert accepted and answer.startswith("HTTP 202")
    assert states(reader) == [(0, "healthy", "")] and eng.max_batch == 4, "half its batch limit"
    seq = eng.submit(4, 2)
    assert [seq.out.get(timeout=5) for _ in range(2)] == [" t1", " t2"], "the fault no longer takes"


def test_an_instruction_it_cannot_take_is_refused(engine: tuple[int, Path, Engine]) -> None:
    port, fault, eng = engine
    eng.ft.instructions = ("retry",)  # as vLLM 0.32
    fail_core(port, fault, eng)
    assert apply(port, "scale_down") == (False, "HTTP 400 Invalid instruction: 'scale_down'.")
    assert eng.ft.state == "unhealthy", "still waiting"


def test_an_instruction_for_a_healthy_core_is_rejected_in_the_status(engine: tuple[int, Path, Engine]) -> None:
    port, _, _ = engine
    assert apply(port, "retry")[0], "202, as vLLM: the rejection comes from the engine core"
    reader = FaultToleranceReader(f"http://127.0.0.1:{port}")
    status = reader.read()
    assert status is not None
    assert status.engines[0].error == "[FT] Rejecting retry on engine 0: status is HEALTHY"


def test_an_engine_without_the_api_is_asked_again_only_after_a_while(tmp_path: Path,
                                                                     caplog: pytest.LogCaptureFixture) -> None:
    httpd = serve(Engine(fault_file=str(tmp_path / "none")), "127.0.0.1", 0)  # fault tolerance off: 404
    clock = FakeClock(1000.0)
    try:
        reader = FaultToleranceReader(f"http://127.0.0.1:{httpd.server_address[1]}", absent_seconds=600,
                                      clock=clock.time)
        with caplog.at_level(logging.INFO, logger="sentinel.agent.engines"):
            assert reader.read() is None and reader.absent_until == 1600.0
            clock.advance(599)
            assert reader.read() is None
            clock.advance(2)
            assert reader.read() is None and reader.absent_until == 2201.0
        said = [r.getMessage() for r in caplog.records if "does not expose it" in r.getMessage()]
        assert len(said) == 1, said
        assert apply(httpd.server_address[1], "retry") == (
            False, "HTTP 404 no /v1/fault_tolerance/apply: the engine does not expose /fault_tolerance/apply")
    finally:
        httpd.shutdown()
        httpd.server_close()


class _Canned(BaseHTTPRequestHandler):
    answers: dict[str, tuple[int, bytes]] = {}

    def do_GET(self) -> None:
        status, body = self.answers.get(self.path, (404, b'{"detail": "Not Found"}'))
        self.send_response(status)
        self.send_header("content-length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args: object) -> None:
        pass


@pytest.fixture
def canned() -> Iterator[tuple[str, dict[str, tuple[int, bytes]]]]:
    answers: dict[str, tuple[int, bytes]] = {}
    httpd = ThreadingHTTPServer(("127.0.0.1", 0), type("H", (_Canned,), {"answers": answers}))
    threading.Thread(target=httpd.serve_forever, daemon=True).start()
    try:
        yield f"http://127.0.0.1:{httpd.server_address[1]}", answers
    finally:
        httpd.shutdown()
        httpd.server_close()


def body(doc: Any) -> bytes:
    return json.dumps(doc).encode()


BAD = {
    "not-json": b"<html>oops</html>", "not-an-object": body([1, 2]), "no-engines": body({"schema_version": 1}),
    "newer-schema": body({"schema_version": 2, "engines": []}), "engine-not-object": body({"engines": ["x"]}),
    "id-not-a-number": body({"engines": [{"id": "zero", "status": "healthy"}]}),
    "id-a-bool": body({"engines": [{"id": True, "status": "healthy"}]}),
    "negative-id": body({"engines": [{"id": -1, "status": "healthy"}]}),
    "too-many-engines": body({"engines": [{"id": i, "status": "healthy"} for i in range(65)]}),
    "oversized": b'{"engines": [], "pad": "' + b"x" * (70 * 1024) + b'"}',
    "deeply-nested": b"[" * 100_000, "server-error": b"",
}


@pytest.mark.parametrize("answer", BAD.values(), ids=BAD.keys())
def test_a_bad_answer_is_skipped_with_one_log_line(canned: Any, answer: bytes,
                                                   caplog: pytest.LogCaptureFixture) -> None:
    url, answers = canned
    answers["/fault_tolerance/status"] = (500 if not answer else 200, answer)
    reader = FaultToleranceReader(url)
    with caplog.at_level(logging.WARNING, logger="sentinel.agent.engines"):
        assert reader.read() is None and reader.read() is None
    said = [r.getMessage() for r in caplog.records]
    assert len(said) == 1 and said[0].startswith("engine fault-tolerance status skipped"), said
    answers["/fault_tolerance/status"] = (200, body({"engines": [{"id": 0, "status": "healthy"}]}))
    assert states(reader) == [(0, "healthy", "")], "a good answer after a bad one is read"


def test_the_v1_path_and_sglang_states_are_read(canned: Any) -> None:
    url, answers = canned
    answers["/v1/fault_tolerance/status"] = (200, body({"engines": [
        {"id": 0, "status": "paused"}, {"id": 1, "status": "DEAD"}, {"id": 2, "status": "rebooting"}]}))
    reader = FaultToleranceReader(url)
    assert states(reader) == [(0, "paused", ""), (1, "dead", ""), (2, "unknown", "")]
    assert reader.path == "/v1/fault_tolerance/status"
    status = parse_status(answers["/v1/fault_tolerance/status"][1].decode(), 1.0)
    assert [e.rank for e in status.waiting] == [0, 1]


def test_the_engine_watch_carries_the_status_alone_when_metrics_does_not_answer(
        engine: tuple[int, Path, Engine]) -> None:
    port, fault, eng = engine
    fail_core(port, fault, eng)
    watch = EngineWatch([f"7/1=vllm@http://127.0.0.1:{port}/metrics#r1"])
    [batch] = watch.poll([Assignment(job_id=7, rank=1, pid=4242, accelerators=["GPU-1"])])
    assert batch.serving is not None and batch.serving.replica == "r1" and batch.serving.requests == 0
    ft = batch.serving.fault_tolerance
    assert ft is not None and [(e.rank, e.state) for e in ft.engines] == [(0, "unhealthy")]
