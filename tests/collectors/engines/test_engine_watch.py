"""The agent scrapes the engine targets it was given once per report and adds their sums to the placed task's
telemetry, with the task's pid from its assignment; a target whose task is not placed here is skipped, a bad
target is refused at start. The engine is played by an HTTP server serving vLLM exposition fixtures (written
from vLLM's documented metric definitions, not captured from a running engine)."""

from __future__ import annotations

from pathlib import Path

import pytest

from collectors.agent import Agent, AgentConfig
from collectors.engines.watch import EngineTarget
from sentinel.telemetry.schemas import Assignment

FIXTURES = Path(__file__).parent / "fixtures"


def test_the_agent_reports_an_engine_as_its_placed_task(tmp_path: Path, server: tuple[str, dict[str, str]]):
    base, pages = server
    url = f"{base}/metrics"
    pages["/metrics"] = (FIXTURES / "vllm_before.txt").read_text()
    config = AgentConfig(server_url="http://127.0.0.1:9", token="t", node="n1", sources=[], state_dir=tmp_path,
                         engines=[f"7/0=vllm@{url}#d0:decode", f"7/1=vllm@{url}"])
    agent = Agent(config, sources=[])
    agent.assignments = [Assignment(job_id=7, rank=0, pid=4242, accelerators=[])]
    [first] = agent.task_telemetry()
    assert (first.job_id, first.rank, first.pid) == (7, 0, 4242), "rank 1 is not placed here: skipped"
    assert first.serving is not None and first.serving.requests == 0, "the first scrape is the baseline"
    assert (first.serving.source, first.serving.replica, first.serving.stage) == ("vllm", "d0", "decode")
    pages["/metrics"] = (FIXTURES / "vllm_after.txt").read_text()
    [second] = agent.task_telemetry()
    assert second.serving is not None and second.serving.requests > 0 and second.serving.histograms["ttft"]


@pytest.mark.parametrize("spec", ["7=vllm@http://x/metrics", "7/0=tgi@http://x/metrics", "7/0=vllm@ftp://x",
                                  "7/0=vllm@http://x/metrics#d0:verify"])
def test_a_bad_target_is_refused_with_the_expected_form(spec: str):
    with pytest.raises(ValueError, match="JOB/RANK=KIND@URL"):
        EngineTarget.parse(spec)


def test_an_engine_the_server_assigns_is_scraped_until_its_assignment_goes(tmp_path: Path,
                                                                           server: tuple[str, dict[str, str]]):
    """A launcher's replica registered with its engine (`sentinel launch --serve … --engine vllm`): the agent
    needs no --engine of its own, and a replacement on a new port is followed from the next report."""
    base, pages = server
    pages["/metrics"] = (FIXTURES / "vllm_before.txt").read_text()
    config = AgentConfig(server_url="http://127.0.0.1:9", token="t", node="n1", sources=[], state_dir=tmp_path)
    agent = Agent(config, sources=[])
    engine = f"vllm@{base}/metrics#r1"
    agent.assignments = [Assignment(job_id=7, rank=1, pid=4242, accelerators=[], engine=engine),
                         Assignment(job_id=7, rank=0, pid=4241, accelerators=[])]
    [first] = agent.task_telemetry()
    assert (first.job_id, first.rank, first.pid) == (7, 1, 4242)
    assert first.serving is not None and (first.serving.source, first.serving.replica) == ("vllm", "r1")
    pages["/metrics"] = (FIXTURES / "vllm_after.txt").read_text()
    [second] = agent.task_telemetry()
    assert second.serving is not None and second.serving.requests > 0, "the same target: its baseline held"
    replaced = f"vllm@{base}/metrics#r1.a1"
    agent.assignments = [Assignment(job_id=7, rank=1, pid=4343, accelerators=[], engine=replaced)]
    [third] = agent.task_telemetry()
    assert (third.pid, third.serving.replica if third.serving else None) == (4343, "r1.a1")
    assert third.serving is not None and third.serving.requests == 0, "a new target starts from its baseline"
    agent.assignments = []
    assert agent.task_telemetry() == [] and agent.engines.assigned == {}, "its assignment gone, so is the target"
