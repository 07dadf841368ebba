"""The report path served ahead of the middleware stack (nodes/api.py: serve_report) answers exactly as the
stack does. Each request is sent twice: with a Content-Length (the fast path takes it) and chunked (no
length: the fast path leaves it to the stack, whose middlewares and route answer it)."""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import pytest
from fastapi.testclient import TestClient

import sentinel.app
from sentinel.nodes.api import report_route_node
from tests.conftest import bearer
from tests.factories import registration, report

# SQLite only: the path under test is the edge, above the database (tests/nodes/test_reports.py covers both).
pytestmark = pytest.mark.parametrize("database_url", ["sqlite"], indirect=True)


@pytest.fixture
def served(monkeypatch: pytest.MonkeyPatch) -> list[bool]:
    """What serve_report answered for each POST: True when it served the request itself."""
    answers: list[bool] = []
    real = sentinel.app.serve_report

    async def spy(*args: Any) -> bool:
        answers.append(await real(*args))
        return answers[-1]

    monkeypatch.setattr(sentinel.app, "serve_report", spy)
    return answers


def send(client: TestClient, body: bytes, headers: dict[str, str], *, chunked: bool,
         node: str = "node-a") -> tuple[int, Any, dict[str, str]]:
    def chunks() -> Iterator[bytes]:
        yield body[: len(body) // 2]
        yield body[len(body) // 2:]

    response = client.post(f"/api/v1/nodes/{node}/reports", content=chunks() if chunked else body,
                           headers={**headers, "content-type": "application/json"})
    wanted = {k: v for k, v in response.headers.items() if k in ("www-authenticate", "retry-after", "content-type")}
    return response.status_code, response.json(), wanted


def both(client: TestClient, served: list[bool], body: bytes, headers: dict[str, str],
         node: str = "node-a") -> tuple[int, Any, dict[str, str]]:
    fast = send(client, body, headers, chunked=False, node=node)
    assert served[-1] is True, "the fast path did not take a plain report"
    stack = send(client, body, headers, chunked=True, node=node)
    assert served[-1] is False, "the fast path took a chunked report"
    assert fast == stack
    return fast


def test_refusals_are_the_stack_s(client: TestClient, make_token: Any, served: list[bool]) -> None:
    agent = bearer(make_token("agent"))
    assert client.post("/api/v1/nodes/register", json=registration("node-a"), headers=agent).status_code == 200
    good = json.dumps(report(seq=1)).encode()

    status, _, headers = both(client, served, good, {})
    assert status == 401 and headers["www-authenticate"] == "Bearer"
    assert both(client, served, good, bearer("not-a-token"))[0] == 401
    status, body, _ = both(client, served, good, bearer(make_token("viewer")))
    assert status == 403 and "may not POST /api/v1/nodes/node-a/reports" in body["detail"]
    assert both(client, served, good, bearer(make_token("agent", node="node-b")))[0] == 403

    status, body, _ = both(client, served, b'{"node": "node-a", "seq": ', agent)
    assert status == 400 and body["detail"]["message"] == "body is not valid JSON"
    nan = good.replace(b'"cpu_ratio": 0.25', b'"cpu_ratio": NaN')
    assert nan != good and both(client, served, nan, agent)[0] in (400, 422)
    status, body, _ = both(client, served, json.dumps(report(seq=1) | {"node": "x\u0000"}).encode(), agent)
    assert status == 422 and "NUL" in body["detail"]
    status, body, _ = both(client, served, json.dumps(report(node="node-b", seq=1)).encode(), agent)
    assert status == 422 and "posted to node 'node-a'" in body["detail"]
    assert both(client, served, json.dumps(report(node="ghost", seq=1)).encode(), agent, node="ghost")[0] == 404


def test_a_report_is_acknowledged_alike(client: TestClient, make_token: Any, served: list[bool]) -> None:
    agent = bearer(make_token("agent"))
    assert client.post("/api/v1/nodes/register", json=registration("node-a"), headers=agent).status_code == 200
    fast = send(client, json.dumps(report(seq=1)).encode(), agent, chunked=False)
    assert served[-1] is True
    stack = send(client, json.dumps(report(seq=2)).encode(), agent, chunked=True)
    assert served[-1] is False
    assert fast[0] == stack[0] == 200 and fast[2] == stack[2] == {"content-type": "application/json"}
    assert fast[1] == stack[1] | {"seq": 1} and fast[1]["status"] == "accepted"
    replay = send(client, json.dumps(report(seq=1)).encode(), agent, chunked=False)
    assert replay[1]["status"] == "duplicate"


def test_over_the_limit_and_odd_paths_go_through_the_stack(client: TestClient, make_token: Any,
                                                           served: list[bool]) -> None:
    agent = bearer(make_token("agent"))
    huge = b'{"node": "node-a", "pad": "' + b"x" * (65 * 1024) + b'"}'
    status, _, _ = send(client, huge, agent, chunked=False)
    assert served[-1] is False and status == 413
    status, _, _ = send(client, huge, agent, chunked=True)
    assert status == 413
    assert report_route_node({"type": "http", "method": "POST", "path": "/api/v1/nodes/a/reports/"}) is None
    assert report_route_node({"type": "http", "method": "POST", "path": "/api/v1/nodes/a/b/reports"}) is None
    assert report_route_node({"type": "http", "method": "GET", "path": "/api/v1/nodes/a/reports"}) is None
    assert report_route_node({"type": "http", "method": "POST", "path": "/api/v1/nodes/a/reports",
                              "query_string": b"x=%00"}) is None
    assert report_route_node({"type": "http", "method": "POST", "path": "/api/v1/nodes/a/reports",
                              "query_string": b""}) == "a"
