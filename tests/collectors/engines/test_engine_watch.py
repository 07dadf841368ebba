"""The agent scrapes the engine targets it was given once per report and adds their sums to the placed task's
telemetry, with the task's pid from its assignment; a target whose task is not placed here is skipped, a bad
target is refused at start. The engine is played by an HTTP server serving vLLM exposition fixtures (written
from vLLM's documented metric definitions, not captured from a running engine)."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

from collectors.agent import Agent, AgentConfig
from collectors.engines.watch import EngineTarget
from sentinel.telemetry.schemas import Assignment

FIXTURES = Path(__file__).parent / "fixtures"


@pytest.fixture
def engine() -> Iterator[tuple[str, dict[str, str]]]:
    state = {"page": (FIXTURES / "vllm_before.txt").read_text()}

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            body = state["page"].encode()
            self.send_response(200)
            self.send_header("content-type", "text/plain; version=0.0.4")
            self.send_header("content-length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args: object) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield f"http://127.0.0.1:{server.server_address[1]}/metrics", state
    server.shutdown()
    server.server_close()


def test_the_agent_reports_an_engine_as_its_placed_task(tmp_path: Path, engine):  # type: ignore[no-untyped-def]
    url, state = engine
    config = AgentConfig(server_url="http://127.0.0.1:9", token="t", node="n1", sources=[], state_dir=tmp_path,
                         engines=[f"7/0=vllm@{url}#d0:decode", f"7/1=vllm@{url}"])
    agent = Agent(config, sources=[])
    agent.assignments = [Assignment(job_id=7, rank=0, pid=4242, accelerators=[])]
    [first] = agent.task_telemetry()
    assert (first.job_id, first.rank, first.pid) == (7, 0, 4242), "rank 1 is not placed here: skipped"
    assert first.serving is not None and first.serving.requests == 0, "the first scrape is the baseline"
    assert (first.serving.source, first.serving.replica, first.serving.stage) == ("vllm", "d0", "decode")
    state["page"] = (FIXTURES / "vllm_after.txt").read_text()
    [second] = agent.task_telemetry()
    assert second.serving is not None and second.serving.requests > 0 and second.serving.histograms["ttft"]


@pytest.mark.parametrize("spec", ["7=vllm@http://x/metrics", "7/0=tgi@http://x/metrics", "7/0=vllm@ftp://x",
                                  "7/0=vllm@http://x/metrics#d0:verify"])
def test_a_bad_target_is_refused_with_the_expected_form(spec: str):
    with pytest.raises(ValueError, match="JOB/RANK=KIND@URL"):
        EngineTarget.parse(spec)
