"""Replica failover through the launcher's serving executor (sentinel/launcher/replicas.py): real replica
processes of the project's own engine behind the router; a replace_replica order drains the marked replica,
starts its replacement, cuts over and stops the old one, and every request in flight at the fault is
accounted for: finished on the old replica, resumed on another, or failed (none here). An adjust order sets
the batch limit on the router and on the replicas that take it."""

from __future__ import annotations

import http.client
import io
import json
import sys
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from sentinel.launcher.replicas import ServingProcesses
from sentinel.remediation.executors.base import Action, JobRef
from sentinel.serving.router import Router
from tests.live import wait_for


def placement(replace: int | None = None) -> list[dict[str, Any]]:
    return [{"rank": r, "node": "node-a", "accelerators": [f"GPU-{r}"], **({"replace": True} if r == replace else {})}
            for r in range(2)]


def order(kind: str, attempt: int, **extra: Any) -> Action:
    body = {"id": f"o{attempt}-{kind}", "job_id": 7, "kind": kind, "attempt": attempt, "reason": "test", **extra}
    return Action("order", "node-a", "test", jobs=(JobRef(7, "chat", "serving"),), order=body)


@pytest.fixture
def serving(tmp_path: Path) -> Iterator[tuple[ServingProcesses, Router, io.StringIO, Path]]:
    router = Router(queue_seconds=10.0, read_seconds=5.0)
    out = io.StringIO()
    fault = tmp_path / "fault-{replica}"
    started: list[Any] = []
    local = ServingProcesses(argv=[sys.executable, "-m", "sentinel.demo.engine", "--no-telemetry",
                                   "--step-seconds", "0.02", "--per-request-seconds", "0"],
                             nproc=2, env={"ENGINE_FAULT_FILE": str(fault)}, warm=False, out=out, router=router,
                             drain_seconds=1.0, on_started=lambda ranks, attempt: started.append((ranks, attempt)))
    local.job_id = 7
    try:
        yield local, router, out, fault
    finally:
        local.close(grace_seconds=1)


def stream(router: Router, results: list[tuple[int, bool]], max_tokens: int = 150) -> None:
    conn = http.client.HTTPConnection("127.0.0.1", router.httpd.server_address[1], timeout=60)
    try:
        conn.request("POST", "/v1/completions", body=json.dumps({"prompt": "hi", "max_tokens": max_tokens,
                                                                 "stream": True}))
        response = conn.getresponse()
        try:
            body = response.read()
        except http.client.IncompleteRead as cut:
            body = cut.partial
        results.append((response.status, body.rstrip().endswith(b"data: [DONE]")))
    finally:
        conn.close()


def ready(router: Router, *names: str) -> bool:
    replicas = router.snapshot()["replicas"]
    return all(n in replicas and replicas[n]["ready"] for n in names)


@pytest.mark.parametrize("fault", ["", "freeze"], ids=["healthy", "frozen"])
def test_a_replica_is_replaced_with_its_requests_in_flight_accounted_for(serving: Any, fault: str) -> None:
    local, router, out, fault_file = serving
    local.start_attempt(placement(), 0)
    wait_for(lambda: ready(router, "r0", "r1"), timeout=30, what="both replicas answering")
    assert "replica r1 ready on port" in out.getvalue()
    results: list[tuple[int, bool]] = []
    clients = [threading.Thread(target=stream, args=(router, results)) for _ in range(6)]
    for c in clients:
        c.start()
    wait_for(lambda: router.snapshot()["replicas"]["r1"]["in_flight"] >= 2, timeout=10, what="r1 busy")
    old_pid = next(r.proc.pid for r in local.ranks if r.rank == 1)
    local.drain_seconds = 1.0 if fault else 10.0  # healthy: its 3 s streams finish on it; frozen: they cannot
    if fault:  # r1 alone freezes mid-stream; its replacement (r1.a1) reads its own file
        Path(str(fault_file).replace("{replica}", "r1")).write_text(fault)
    outcome = local.execute(order("replace_replica", 1, placement=placement(replace=1)))
    for c in clients:
        c.join(60)

    assert outcome.ok, outcome.detail
    assert "replica r1 → r1.a1" in outcome.detail and "0 failed" in outcome.detail, outcome.detail
    in_flight = int(outcome.detail.split(" request(s) in flight")[0].rsplit(" ", 1)[1])
    if fault:  # each stream cut: resumed from its text so far, or retried if it had sent no text yet (a load race)
        moved = outcome.detail.split("the rest cut at its stop; meanwhile ")[1].split(", 0 failed")[0]
        retried, resumed = (int(part.split()[0]) for part in moved.split(", "))
        assert retried + resumed == in_flight and resumed >= 1, outcome.detail
    else:
        assert "all finished on it; meanwhile 0 retried, 0 resumed" in outcome.detail
    assert [r.rank for r in local.ranks] == [0, 1] and local.ranks[1].proc.pid != old_pid
    assert local.ranks[0].proc.poll() is None, "the other replica was left alone"
    assert results == [(200, True)] * 6, "every client stream came to its [DONE]"
    snap = router.snapshot()
    assert set(snap["replicas"]) == {"r0", "r1.a1"} and snap["counts"]["failed"] == 0


def test_an_adjust_order_sets_the_batch_limit_on_the_router_and_the_replicas(serving: Any) -> None:
    local, router, out, _ = serving
    local.start_attempt(placement(), 0)
    wait_for(lambda: ready(router, "r0", "r1"), timeout=30, what="both replicas answering")
    outcome = local.execute(order("adjust", 0, placement=[], params={"batch_limit": 6}))
    assert outcome.ok and "batch limit none → 6 per replica (2 of 2 replica(s) took it" in outcome.detail
    assert "batch limit none → 6" in out.getvalue()
    assert router.limit == 6, "a replica added later that cannot take it is held to it by the router"
    assert {r["limit"] for r in router.snapshot()["replicas"].values()} == {None}, "both engines limit themselves"
    bad = local.execute(order("adjust", 0, placement=[], params={}))
    assert not bad.ok and "without a batch_limit" in bad.detail


def test_each_replica_is_registered_with_its_engine_and_a_replacement_with_its_new_port(serving: Any) -> None:
    local, router, _, _ = serving
    local.engine = "vllm"  # as `sentinel launch --serve … --engine vllm`: the node's agent scrapes each replica
    local.start_attempt(placement(), 0)
    wait_for(lambda: ready(router, "r0", "r1"), timeout=30, what="both replicas answering")
    assert [local.task_fields(r) for r in (0, 1)] == [
        {"engine": f"vllm@http://127.0.0.1:{local.ports[r]}/metrics#r{r}"} for r in (0, 1)]
    before = local.ports[1]
    assert local.execute(order("replace_replica", 1, placement=placement(replace=1))).ok
    assert local.ports[1] != before
    assert local.task_fields(1) == {"engine": f"vllm@http://127.0.0.1:{local.ports[1]}/metrics#r1.a1"}
    local.engine = None
    assert local.task_fields(0) == {}, "no engine named: the replicas' own SDK reports"


@pytest.mark.parametrize("option, words", [
    (["--slo", "0.5"], "expected TTFT,TPOT in seconds"), (["--slo", "0,0.05"], "over 0 s and under an hour"),
    (["--slo", "nan,0.05"], "over 0 s and under an hour"), (["--serve", "8000"], "expected HOST:PORT"),
    (["--batch-limit", "0"], "a whole number of 1 or more")])
def test_bad_serving_options_to_launch_are_refused_with_what_is_wrong(option: list[str], words: str,
                                                                      capsys: pytest.CaptureFixture[str]) -> None:
    from sentinel.cli import build_parser

    with pytest.raises(SystemExit) as exit_:
        build_parser().parse_args(["launch", "--job", "chat", "--nproc", "1", "--kind", "serving", *option,
                                   "--", "true"])
    assert exit_.value.code == 2 and words in capsys.readouterr().err
