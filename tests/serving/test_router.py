"""The serving router in front of real replicas (the project's own engine, sentinel/demo/engine.py, on
loopback): the least-loaded ready replica gets each request, at most `limit` at once; a replica that refuses
or answers 500 is retried elsewhere; a stream cut mid-answer is resumed on another replica and the client
sees one whole stream; a drained replica gets nothing new while its requests in flight finish."""

from __future__ import annotations

import http.client
import json
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from sentinel.demo.engine import Engine, serve
from sentinel.serving.router import Router
from tests.live import wait_for


class Replicas:
    def __init__(self, tmp: Path) -> None:
        self.tmp = tmp
        self.servers: dict[str, Any] = {}
        self.faults: dict[str, Path] = {}

    def start(self, name: str, **options: Any) -> int:
        self.faults[name] = self.tmp / f"fault-{name}"
        httpd = serve(Engine(fault_file=str(self.faults[name]), **{"step_seconds": 0.005,
                                                                  "per_request_seconds": 0.0, **options}),
                      "127.0.0.1", 0)
        self.servers[name] = httpd
        return int(httpd.server_address[1])

    def stop(self, name: str) -> None:
        httpd = self.servers.pop(name)
        httpd.shutdown()
        httpd.server_close()


@pytest.fixture
def replicas(tmp_path: Path) -> Iterator[Replicas]:
    made = Replicas(tmp_path)
    yield made
    for name in list(made.servers):
        made.stop(name)


@pytest.fixture
def router() -> Iterator[Router]:
    r = Router(queue_seconds=5.0, read_seconds=2.0)
    yield r
    r.close()


def add(router: Router, name: str, port: int) -> None:
    assert router.wait_ready(router.add(name, port), timeout=5)


def complete(router: Router, *, stream: bool = False, max_tokens: int = 8, prompt: Any = "hello") -> tuple[int, Any]:
    conn = http.client.HTTPConnection("127.0.0.1", router.httpd.server_address[1], timeout=30)
    try:
        conn.request("POST", "/v1/completions", body=json.dumps({"prompt": prompt, "max_tokens": max_tokens,
                                                                 "stream": stream}))
        response = conn.getresponse()
        try:
            body = response.read()
        except http.client.IncompleteRead as cut:  # a chunked stream that ended before its last chunk
            body = cut.partial
        return response.status, body if stream else json.loads(body)
    finally:
        conn.close()


def settled(router: Router) -> dict[str, Any]:
    """The router's counts once every answer the clients got is released (the handler counts after writing)."""
    wait_for(lambda: all(r["in_flight"] == 0 for r in router.snapshot()["replicas"].values()), timeout=5,
             what="every request released")
    return router.snapshot()


def texts(sse: bytes) -> tuple[list[str], bool]:
    lines = [line[6:] for line in sse.decode().splitlines() if line.startswith("data: ")]
    done = bool(lines) and lines[-1] == "[DONE]"
    return [c["text"] for line in lines if line != "[DONE]" for c in json.loads(line)["choices"] if c["text"]], done


def test_requests_go_to_the_least_loaded_ready_replica(router: Router, replicas: Replicas) -> None:
    add(router, "r0", replicas.start("r0"))
    add(router, "r1", replicas.start("r1"))
    router.add("r2", replicas.start("r2", step_seconds=0.01))  # never announced ready: gets nothing
    results = []
    threads = [threading.Thread(target=lambda: results.append(complete(router, max_tokens=20))) for _ in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert all(status == 200 for status, _ in results)
    served = {name: r["served"] for name, r in settled(router)["replicas"].items()}
    assert served["r2"] == 0 and served["r0"] >= 2 and served["r1"] >= 2 and served["r0"] + served["r1"] == 8


def test_the_limit_caps_requests_in_flight_per_replica(router: Router, replicas: Replicas) -> None:
    add(router, "r0", replicas.start("r0", step_seconds=0.02))
    router.set_limit(2)
    peak = [0]
    stop = threading.Event()

    def watch() -> None:
        while not stop.is_set():
            peak[0] = max(peak[0], router.snapshot()["replicas"]["r0"]["in_flight"])
            time.sleep(0.002)

    watcher = threading.Thread(target=watch)
    watcher.start()
    threads = [threading.Thread(target=complete, args=(router,), kwargs={"max_tokens": 10}) for _ in range(6)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    stop.set()
    watcher.join()
    assert peak[0] == 2 and settled(router)["replicas"]["r0"]["served"] == 6


def test_a_replica_that_is_gone_or_answers_500_is_retried_elsewhere(router: Router, replicas: Replicas) -> None:
    add(router, "r0", replicas.start("r0"))
    add(router, "r1", replicas.start("r1"))
    replicas.stop("r0")  # gone, still routed to: refused
    statuses = [complete(router)[0] for _ in range(4)]
    assert statuses == [200] * 4
    wait_for(lambda: router.snapshot()["counts"]["ok"] == 4, timeout=5, what="the last answer counted")
    counts = router.snapshot()["counts"]
    assert counts["retried"] >= 1 and counts["failed"] == 0


def test_a_stream_cut_mid_answer_is_resumed_on_another_replica(router: Router, replicas: Replicas) -> None:
    add(router, "r0", replicas.start("r0", step_seconds=0.02))
    add(router, "r1", replicas.start("r1", step_seconds=0.02))
    router.drain("r1")  # the first request goes to r0
    threading.Timer(0.25, replicas.faults["r0"].write_text, args=("truncate",)).start()
    threading.Timer(0.2, lambda: setattr(router.backends["r1"], "draining", False)).start()
    status, body = complete(router, stream=True, max_tokens=40)
    words, done = texts(body)
    assert status == 200 and done, "the client sees one stream, to its [DONE]"
    wait_for(lambda: router.snapshot()["counts"]["ok"] == 1, timeout=5, what="the answer counted")
    counts = router.snapshot()["counts"]
    assert counts["resumed"] == 1 and counts["failed"] == 0
    assert len(words) == 40, "the tokens before the cut and the rest from the other replica: 40 in all"


def test_a_cut_stream_with_a_token_prompt_cannot_be_resumed_and_fails(router: Router, replicas: Replicas) -> None:
    add(router, "r0", replicas.start("r0", step_seconds=0.02))
    threading.Timer(0.25, replicas.faults["r0"].write_text, args=("truncate",)).start()
    status, body = complete(router, stream=True, max_tokens=40, prompt=[1, 2, 3])
    assert status == 200 and not texts(body)[1], "cut without [DONE]: the client can tell"
    wait_for(lambda: router.snapshot()["counts"]["failed"] == 1, timeout=5, what="the failure counted")


def test_a_drained_replica_gets_nothing_new_and_its_requests_finish(router: Router, replicas: Replicas) -> None:
    add(router, "r0", replicas.start("r0", step_seconds=0.02))
    add(router, "r1", replicas.start("r1"))
    router.drain("r1")
    long = threading.Thread(target=complete, args=(router,), kwargs={"max_tokens": 30})
    long.start()
    time.sleep(0.1)
    backend = router.drain("r0")
    assert backend is not None and backend.in_flight == 1
    router.backends["r1"].draining = False
    assert complete(router)[0] == 200
    assert router.wait_drained(backend, timeout=10), "its request in flight finished"
    long.join()
    snap = settled(router)["replicas"]
    assert snap["r0"]["served"] == 1 and snap["r1"]["served"] == 1


def test_an_empty_answer_is_tried_on_another_replica_and_comes_through_only_as_the_last(router: Router,
                                                                                        replicas: Replicas) -> None:
    add(router, "r0", replicas.start("r0"))
    replicas.faults["r0"].write_text("empty")
    status, body = complete(router, stream=True)
    assert status == 200 and texts(body) == ([], True), "one replica: its empty answer is all there is"
    add(router, "r1", replicas.start("r1"))  # r0 is still first: equally loaded, and added first
    results = [complete(router, stream=True) for _ in range(4)]
    assert all(s == 200 and len(texts(b)[0]) == 8 and texts(b)[1] for s, b in results), \
        "each empty answer of r0 was tried again on r1, before the client saw a byte"
    counts = settled(router)["counts"]
    assert counts["retried"] >= 4 and counts["failed"] == 0
