"""The router's own queue reaches the batching controller: requests the router holds because a replica that does
not take `POST /sentinel/batch_limit` (vLLM; here the project's engine, never told a limit) is at the router's
limit are counted as the router's `waiting`, while the engine says it has none; the launcher's reporter says that
queue to the server, and the ServingView adds it to the engines' own (`queued`), forgetting a queue not said again
within ROUTER_STALE_SECONDS."""

from __future__ import annotations

import http.client
import json
import threading
from collections.abc import Iterator
from typing import Any

import pytest

from sentinel.demo.engine import Engine, serve
from sentinel.launcher.router_queue import RouterQueueReporter
from sentinel.serving.router import Router
from sentinel.serving.signals import ROUTER_STALE_SECONDS
from tests.live import wait_for
from tests.serving.driver import ServingDriver
from tests.serving.test_router import complete, settled


@pytest.fixture
def replica() -> Iterator[int]:
    """A real engine that admits 32 at once and is never told the router's limit: it queues nothing itself."""
    httpd = serve(Engine(step_seconds=0.05, per_request_seconds=0.0), "127.0.0.1", 0)
    yield int(httpd.server_address[1])
    httpd.shutdown()
    httpd.server_close()


@pytest.fixture
def router() -> Iterator[Router]:
    r = Router(queue_seconds=10.0, read_seconds=5.0)
    yield r
    r.close()


def engine_waiting(port: int) -> int:
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=5)
    try:
        conn.request("GET", "/health")
        return int(json.loads(conn.getresponse().read())["waiting"])
    finally:
        conn.close()


def flood(router: Router, n: int, max_tokens: int = 10) -> list[threading.Thread]:
    threads = [threading.Thread(target=complete, args=(router,), kwargs={"max_tokens": max_tokens})
               for _ in range(n)]
    for t in threads:
        t.start()
    return threads


def test_requests_held_at_the_limit_are_the_routers_queue(router: Router, replica: int) -> None:
    assert router.wait_ready(router.add("r0", replica), timeout=5)
    router.set_limit(2)  # as ServingProcesses.adjust does for a replica that did not take the limit
    threads = flood(router, 6)
    wait_for(lambda: router.snapshot()["waiting"] == 4, timeout=5, what="4 requests held by the router")
    assert engine_waiting(replica) == 0, "the engine admits all it is sent: its own queue says nothing"
    assert router.snapshot()["replicas"]["r0"]["in_flight"] == 2
    for t in threads:
        t.join()
    counts = settled(router)  # the handler counts after writing: a client may hold its answer before it is counted
    assert counts["waiting"] == 0 and counts["counts"]["ok"] == 6


def test_requests_with_no_replica_ready_are_not_the_limits_queue(router: Router, replica: int) -> None:
    backend = router.add("r0", replica)  # not announced ready yet: raising a limit would not help them
    threads = flood(router, 2, max_tokens=2)
    wait_for(lambda: router.snapshot()["counts"]["requests"] == 2, timeout=5, what="both requests in")
    assert router.snapshot()["waiting"] == 0
    assert router.wait_ready(backend, timeout=5)
    for t in threads:
        t.join()
    counts = settled(router)
    assert counts["counts"]["ok"] == 2 and counts["waiting"] == 0


class RecordingClient:
    """Test double for the launcher's client: records the calls, or fails them while `down`."""

    def __init__(self) -> None:
        self.calls: list[tuple[str, str, Any]] = []
        self.down = False

    def request(self, method: str, path: str, **kwargs: Any) -> Any:
        if self.down:
            raise OSError("connection refused")
        self.calls.append((method, path, kwargs.get("json")))
        return kwargs.get("json")


def test_the_reporter_says_each_change_and_a_heartbeat_while_there_is_a_queue(router: Router) -> None:
    now = [0.0]
    client = RecordingClient()
    job = [0]
    reporter = RouterQueueReporter(router, client, lambda: job[0], heartbeat_seconds=10.0, clock=lambda: now[0])
    router.waiting = 3
    assert not reporter.report_once(), "no job registered yet: nothing to say it of"
    job[0] = 7
    router.waiting = 0
    assert not reporter.report_once() and client.calls == [], "no queue ever: nothing said"
    router.waiting = 3
    assert reporter.report_once() and client.calls == [("PUT", "/jobs/7/serving/router", {"waiting": 3})]
    now[0] = 5.0
    assert not reporter.report_once(), "unchanged, heartbeat not due"
    now[0] = 10.0
    assert reporter.report_once(), "unchanged, but a queue is said again every 10 s"
    client.down, router.waiting = True, 0
    assert not reporter.report_once() and reporter.failures == 1
    client.down = False
    assert reporter.report_once() and client.calls[-1][2] == {"waiting": 0}, "said once the server is back"
    now[0] = 60.0
    assert not reporter.report_once(), "no queue: no heartbeat (the server forgets a stale one anyway)"
    router.limit = 8  # a batch limit the router holds its replicas to: said, and kept fresh like a queue
    assert reporter.report_once() and client.calls[-1][2] == {"waiting": 0, "limit": 8}
    now[0] = 65.0
    assert not reporter.report_once()
    now[0] = 70.0
    assert reporter.report_once() and client.calls[-1][2] == {"waiting": 0, "limit": 8}, "a limit's heartbeat"


def test_the_view_adds_the_routers_queue_to_the_engines(client, make_token, clock) -> None:  # type: ignore[no-untyped-def]
    job = ServingDriver(client, make_token, clock)
    job.requests(1, 5, ttft=0.2, tpot=0.02)
    job.clock.advance(2.0)
    job.report(0, {"waiting": 1})
    job.report(1, {"waiting": 2})
    view = client.app.state.runtime.live.serving
    now = job.clock.time()
    assert view.queued(job.job, now) == 3 and view.router_waiting(job.job, now) == 0
    view.set_router_waiting(job.job, 4, now)
    assert view.queued(job.job, now) == 7
    assert view.queued(job.job, now + 20.0, seconds=10.0) == 4, "engines not heard within 10 s: not counted"
    assert view.queued(job.job, now + ROUTER_STALE_SECONDS + 1) == 3, "a router queue not said again: gone"
    assert view.queued(999, now) == 0
    assert view.router_limit(job.job, now) is None, "said without a limit"
    view.set_router_waiting(job.job, 0, now, limit=8)
    assert view.router_limit(job.job, now) == 8 and view.router_limit(job.job, now + ROUTER_STALE_SECONDS + 1) is None


ROUTE = "/api/v1/jobs/{job_id}/serving/router"


class AppClient:
    """The launcher's client over the test app: SentinelClient.request's contract (path under /api/v1, an error
    status raised)."""

    def __init__(self, client: Any, headers: dict[str, str]) -> None:
        self.client, self.headers = client, headers

    def request(self, method: str, path: str, **kwargs: Any) -> Any:
        answer = self.client.request(method, f"/api/v1{path}", headers=self.headers, **kwargs)
        if answer.status_code >= 400:
            raise OSError(f"{answer.status_code}: {answer.text}")
        return answer.json()


def test_the_routers_queue_reaches_the_servers_view(client, make_token, clock, router: Router,  # type: ignore[no-untyped-def]
                                                    replica: int) -> None:
    if ROUTE not in client.app.openapi()["paths"]:
        pytest.skip(f"PUT {ROUTE} is not mounted yet (sentinel/serving/api.py: proposed, not in this checkout)")
    job = ServingDriver(client, make_token, clock)
    reporter = RouterQueueReporter(router, AppClient(client, job.launcher), lambda: job.job)
    assert router.wait_ready(router.add("r0", replica), timeout=5)
    router.set_limit(1)
    threads = flood(router, 4)
    wait_for(lambda: router.snapshot()["waiting"] == 3, timeout=5, what="3 requests held by the router")
    assert reporter.report_once()
    view = client.app.state.runtime.live.serving
    assert view.router_waiting(job.job, job.clock.time()) == 3 and view.queued(job.job, job.clock.time()) == 3
    for t in threads:
        t.join()
    assert reporter.report_once() and view.router_waiting(job.job, job.clock.time()) == 0
    viewer = AppClient(client, job.viewer)
    with pytest.raises(OSError, match="403"):
        viewer.request("PUT", f"/jobs/{job.job}/serving/router", json={"waiting": 1})
    with pytest.raises(OSError, match="404"):
        AppClient(client, job.launcher).request("PUT", "/jobs/999999/serving/router", json={"waiting": 1})
    with pytest.raises(OSError, match="422"):
        AppClient(client, job.launcher).request("PUT", f"/jobs/{job.job}/serving/router", json={"waiting": -1})
