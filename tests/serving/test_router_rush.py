"""With the job's SLO the router admits a request past the limit once it has waited half its TTFT target, to a
replica whose tokens come fast enough that one more keeps them within the TPOT target, at most `burst` × the
limit; where one more would put the gap over the target, the request waits. Real replicas of the project's own
engine (continuous batching: a step takes `step_seconds` + `per_request_seconds` × the batch) on loopback."""

from __future__ import annotations

import http.client
import json
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from sentinel.launcher.replicas import tell
from sentinel.serving.router import Router
from tests.serving.test_router import Replicas, add, complete, settled


@pytest.fixture
def replicas(tmp_path: Path) -> Iterator[Replicas]:
    made = Replicas(tmp_path)
    yield made
    for name in list(made.servers):
        made.stop(name)


@pytest.fixture
def make_router() -> Iterator[Any]:
    made: list[Router] = []

    def make(**options: Any) -> Router:
        made.append(Router(queue_seconds=10.0, read_seconds=5.0, **options))
        return made[-1]

    yield make
    for r in made:
        r.close()


def burst(router: Router, n: int, max_tokens: int) -> tuple[list[int], int]:
    """`n` streamed requests at once; their statuses, and the most the replica r0 had in flight."""
    peak, statuses = [0], []
    stop = threading.Event()

    def watch() -> None:
        while not stop.is_set():
            peak[0] = max(peak[0], router.snapshot()["replicas"]["r0"]["in_flight"])
            time.sleep(0.002)

    watcher = threading.Thread(target=watch)
    watcher.start()
    threads = [threading.Thread(target=lambda: statuses.append(complete(router, stream=True,
                                                                         max_tokens=max_tokens)[0]))
               for _ in range(n)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    stop.set()
    watcher.join()
    return statuses, peak[0]


def test_a_request_near_its_ttft_target_goes_past_the_limit_up_to_the_burst_bound(make_router: Any,
                                                                                    replicas: Replicas) -> None:
    router = make_router(slo=(0.2, 0.5))  # waits 0.1 s at most; TPOT 500 ms: the gap is far from it
    add(router, "r0", replicas.start("r0", step_seconds=0.02))
    router.set_limit(2)
    statuses, peak = burst(router, 6, max_tokens=40)
    counts = settled(router)["counts"]
    assert statuses == [200] * 6
    assert peak == 4, "burst 2 x the limit of 2"
    assert counts["rushed"] >= 2, counts
    assert settled(router)["replicas"]["r0"]["gap"] is not None


def test_one_more_that_would_put_the_tokens_gap_over_the_tpot_target_waits(make_router: Any,
                                                                           replicas: Replicas) -> None:
    # a step: 20 ms + 10 ms a request; 2 in flight: a 40 ms gap, 3 would make it ~60 ms (target 50)
    router = make_router(slo=(0.2, 0.05))
    add(router, "r0", replicas.start("r0", step_seconds=0.02, per_request_seconds=0.01))
    router.set_limit(2)
    statuses, peak = burst(router, 6, max_tokens=30)
    assert statuses == [200] * 6
    assert peak == 2 and settled(router)["counts"]["rushed"] == 0


def test_without_an_slo_the_limit_is_the_limit(make_router: Any, replicas: Replicas) -> None:
    router = make_router()
    add(router, "r0", replicas.start("r0", step_seconds=0.02))
    router.set_limit(2)
    statuses, peak = burst(router, 6, max_tokens=40)
    assert statuses == [200] * 6 and peak == 2 and settled(router)["counts"]["rushed"] == 0


def test_an_engine_without_the_limit_api_is_held_by_the_router(make_router: Any, replicas: Replicas) -> None:
    """The benchmark's stand-in for vLLM: `--no-batch-limit-api` takes no limit from outside and reports none."""
    port = replicas.start("r0", takes_limit=False)
    assert not tell(port, 4), "no POST /sentinel/batch_limit: the launcher's router holds it instead"
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=5)
    conn.request("POST", "/sentinel/batch_limit", body=json.dumps({"limit": 4}))
    assert conn.getresponse().status == 404
    conn.close()
    router = make_router()
    add(router, "r0", port)
    router.set_limit(2)
    statuses, peak = burst(router, 4, max_tokens=20)
    assert statuses == [200] * 4 and peak == 2


def test_a_replica_silent_with_requests_in_flight_takes_none_past_its_limit(make_router: Any) -> None:
    """Its gap is old news: frozen mid-stream (the stall detector's case) or in a long prefill."""
    router = make_router(slo=(0.2, 0.05))
    backend = router.add("r0", 1)
    backend.limit, backend.in_flight, backend.gap = 2, 2, 0.01
    backend.last_byte_at = time.monotonic()
    assert router._rush_room(backend), "tokens every 10 ms, 3 in flight: 15 ms, within 50"
    backend.last_byte_at = time.monotonic() - 5.0
    assert not router._rush_room(backend), "no byte for 5 s"
    backend.last_byte_at, backend.in_flight = time.monotonic(), 4
    assert not router._rush_room(backend), "at 2 x its limit"
