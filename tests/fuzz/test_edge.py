"""The edge refuses what the database cannot store: NUL characters and ids past the columns' range are a 422,
on SQLite and on PostgreSQL, and the OpenAPI schema documents the statuses the edge answers."""

from __future__ import annotations

import pytest
from fastapi.testclient import TestClient

from sentinel.errors import NUL_MESSAGE
from tests.conftest import bearer
from tests.factories import registration, report


@pytest.mark.parametrize(("method", "path", "body"), [
    ("post", "/api/v1/silences", {"matchers": [{"name": "node", "value": "a\u0000b"}], "duration_seconds": 60}),
    ("post", "/api/v1/jobs", {"name": "job", "world_size": 1, "attributes": {"note": "\u0000"}}),
    ("get", "/api/v1/jobs?state=%00", None),
    ("get", "/api/v1/nodes/a%00b", None),
    ("post", "/api/v1/nodes/register", {**registration("node-a"), "hostname": "h\u0000"}),
])
def test_nul_characters_are_refused_with_422(client: TestClient, admin_token: str, method: str, path: str,
                                             body: object) -> None:
    response = client.request(method, path, json=body, headers=bearer(admin_token))
    assert response.status_code == 422, response.text
    assert NUL_MESSAGE in response.json()["detail"]


def test_an_escaped_backslash_before_u0000_is_text_not_nul(client: TestClient, admin_token: str) -> None:
    body = b'{"name": "job", "world_size": 1, "attributes": {"n": "\\\\u0000"}}'
    response = client.post("/api/v1/jobs", content=body,
                           headers={**bearer(admin_token), "content-type": "application/json"})
    assert response.status_code == 201, response.text
    assert response.json()["attributes"] == {"n": "\\u0000"}


@pytest.mark.parametrize("path", [
    "/api/v1/jobs/36124106050795343872", "/api/v1/incidents/99999999999999999999999", "/api/v1/silences/2147483648",
    "/api/v1/jobs?offset=74049610271853707264", "/api/v1/remediations?incident=8096126873",
    "/api/v1/notifications?incident=-2563335930150886888798011091058688", "/api/v1/jobs/0",
])
def test_ids_past_the_columns_range_are_422_not_500(client: TestClient, admin_token: str, path: str) -> None:
    response = client.get(path, headers=bearer(admin_token))
    assert response.status_code == 422, response.text


@pytest.mark.parametrize("where", ["task_exits.job_id", "task_exits.pid", "tasks.job_id", "registration.pid"])
def test_a_report_or_task_naming_an_id_past_the_columns_range_is_422(client: TestClient, admin_token: str,
                                                                    where: str) -> None:
    big = 2**31  # one past a 32-bit INTEGER column (jobs.id, tasks.pid) on PostgreSQL
    client.post("/api/v1/nodes/register", json=registration("node-a"), headers=bearer(admin_token))
    if where == "registration.pid":
        job = client.post("/api/v1/jobs", json={"name": "j", "world_size": 1}, headers=bearer(admin_token)).json()
        response = client.post(f"/api/v1/jobs/{job['id']}/tasks", headers=bearer(admin_token),
                               json={"rank": 0, "node": "node-a", "pid": big})
    else:
        body = report(seq=1, accelerators=0)
        if where.startswith("task_exits"):
            body["task_exits"] = [{"job_id": 1, "pid": 10, "exit_code": 1, "observed_at": 1.8e9,
                                   where.split(".")[1]: big}]
        else:
            body["tasks"] = [{"job_id": big, "rank": 0, "pid": 10}]
        response = client.post("/api/v1/nodes/node-a/reports", json=body, headers=bearer(admin_token))
    assert response.status_code == 422, response.text


def test_a_number_is_not_a_date_time(client: TestClient, admin_token: str) -> None:
    response = client.post("/api/v1/silences", json={"matchers": [{"name": "node", "value": "a"}], "ends_at": 65746},
                           headers=bearer(admin_token))
    assert response.status_code == 422
    assert response.json()["detail"]["problems"][0]["field"] == "ends_at"


def test_the_schema_documents_what_the_edge_answers(client: TestClient) -> None:
    schema = client.get("/openapi.json").json()
    assert "HTTPValidationError" not in schema["components"]["schemas"]
    job = schema["paths"]["/api/v1/jobs/{job_id}"]["get"]["responses"]
    assert {"200", "401", "403", "404", "422", "429"} <= job.keys()
    post = schema["paths"]["/api/v1/jobs"]["post"]["responses"]
    assert {"201", "400", "401", "403", "413", "422"} <= post.keys()
    assert post["422"]["content"]["application/json"]["schema"] == {"$ref": "#/components/schemas/ErrorOut"}
    assert "401" not in schema["paths"]["/healthz"]["get"]["responses"]
    checkpoint = schema["paths"]["/api/v1/jobs/{job_id}/checkpoints"]["post"]["responses"]
    assert {"200", "201"} <= checkpoint.keys()
