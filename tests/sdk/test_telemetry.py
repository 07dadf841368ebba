"""The SDK without torch: timing records, batching to a real agent endpoint, failure capture."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from threading import Thread
from typing import Any

import pytest

from sentinel.sdk import Telemetry
from sentinel.telemetry.schemas import SdkBatch


class RecordingAgent:
    """Test double for the agent's /v1/telemetry endpoint: keeps every batch it is sent."""

    def __init__(self) -> None:
        self.batches: list[dict[str, Any]] = []
        outer = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                body = self.rfile.read(int(self.headers["content-length"]))
                outer.batches.append(json.loads(body))
                self.send_response(204)
                self.end_headers()

            def log_message(self, *args: object) -> None:
                return

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        Thread(target=self.server.serve_forever, daemon=True).start()
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"

    def close(self) -> None:
        self.server.shutdown()


@pytest.fixture
def agent():  # type: ignore[no-untyped-def]
    a = RecordingAgent()
    yield a
    a.close()


def test_import_pulls_in_no_server_code():
    code = "import sys, sentinel.sdk; print(sorted(m for m in sys.modules if m.split('.')[0] in " \
           "('fastapi', 'sqlalchemy', 'pydantic', 'httpx', 'torch', 'numpy', 'starlette')))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]"


def test_steps_and_collectives_are_timed_and_the_batch_matches_the_agent_schema(agent):
    tel = Telemetry(job_id=7, rank=1, agent_url=agent.url, start_thread=False)
    for _ in range(3):
        with tel.step(tokens=512), tel.collective("all_reduce", nbytes=1024):
            time.sleep(0.01)
    tel.set_model(flops_per_token=6e9, peak_flops_per_accelerator=1e12)
    assert tel.flush()
    batch = SdkBatch.model_validate(agent.batches[0])
    assert (batch.job_id, batch.rank) == (7, 1)
    assert [s[0] for s in batch.steps] == [1, 2, 3]
    for _index, _started, duration, tokens, coll, exposed in batch.steps:
        assert tokens == 512 and 0.009 < coll <= duration and exposed == coll
    assert batch.collectives["all_reduce"] == (3, pytest.approx(sum(s[4] for s in batch.steps)), 3072)
    assert batch.model is not None and batch.model.flops_per_token == 6e9
    assert batch.memory_source == "rss" and batch.memory_peak_bytes and batch.memory_peak_bytes > 10 * 2**20


def test_a_step_that_raises_is_not_counted(agent):
    """A peer killed mid all-reduce fails the step: the rank did not get one step further."""
    tel = Telemetry(job_id=7, rank=0, agent_url=agent.url, start_thread=False)
    tel.resume_at(200)
    with tel.step(tokens=16):
        pass
    with pytest.raises(RuntimeError), tel.step(tokens=16), tel.collective("all_reduce"):
        raise RuntimeError("Connection closed by peer")
    assert tel.step_index == 201
    assert tel.flush()
    assert [s[0] for s in SdkBatch.model_validate(agent.batches[0]).steps] == [201]
    with tel.collective("barrier"):  # the failed step does not leave the next collective counted inside a step
        pass
    with tel.step(tokens=16):
        pass
    assert tel.flush()
    [(index, _started, _duration, _tokens, coll, _exposed)] = SdkBatch.model_validate(agent.batches[1]).steps
    assert index == 202 and coll == 0.0


def test_an_absent_agent_drops_and_counts_and_never_raises():
    tel = Telemetry(job_id=1, agent_url="http://127.0.0.1:9", start_thread=False)
    with tel.step(tokens=1):
        pass
    assert tel.flush(timeout_seconds=0.5) is False
    assert tel.dropped_batches == 1 and tel.take_batch() is None


def test_environment_configures_it_and_arguments_win(monkeypatch):
    monkeypatch.setenv("SENTINEL_JOB_ID", "12")
    monkeypatch.setenv("SENTINEL_RANK", "3")
    monkeypatch.setenv("SENTINEL_AGENT_URL", "http://127.0.0.1:1234")
    tel = Telemetry(start_thread=False)
    assert (tel.job_id, tel.rank, tel.agent_url) == (12, 3, "http://127.0.0.1:1234")
    assert Telemetry(rank=5, start_thread=False).rank == 5
    monkeypatch.setenv("TORCHELASTIC_RESTART_COUNT", "2")  # torchrun's restart count is the attempt
    assert Telemetry(start_thread=False).attempt == 2
    monkeypatch.setenv("SENTINEL_ATTEMPT", "3")
    assert Telemetry(start_thread=False).attempt == 3


def test_an_uncaught_exception_is_sent_before_the_process_dies(agent, tmp_path):
    script = tmp_path / "train.py"
    script.write_text(
        "import sentinel.sdk\n"
        f"tel = sentinel.sdk.init(job_id=4, rank=0, agent_url={agent.url!r})\n"
        "with tel.step(tokens=1):\n    pass\n"
        "raise RuntimeError('loss is NaN at step 1')\n")
    result = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=60)
    assert result.returncode == 1 and "loss is NaN" in result.stderr
    failures = [b["failure"] for b in agent.batches if b["failure"]]
    assert failures == [{"type": "RuntimeError", "message": "loss is NaN at step 1"}]


def test_peak_memory_is_the_process_own_not_its_launcher():
    """Linux carries ru_maxrss across fork and exec: a rank started by a large launcher must not report
    the launcher's size as its own peak."""
    ballast = bytearray(300 * 2**20)
    for i in range(0, len(ballast), 4096):
        ballast[i] = 1
    code = "from sentinel.sdk.telemetry import peak_memory_bytes; print(peak_memory_bytes()[0])"
    child = int(subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True,
                               timeout=60).stdout)
    assert 1 * 2**20 < child < 200 * 2**20, f"child peak {child} bytes includes the parent's 300 MiB"
    del ballast
