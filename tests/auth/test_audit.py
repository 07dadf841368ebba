"""Every state-changing call under /api/v1 leaves exactly one audit entry: the handler's own, or the audit
middleware's `http.<method>` (also for refused calls). Reports and shard registrations are not audited."""

from __future__ import annotations

import uuid
from typing import Any

import pytest

from sentinel.audit.service import list_entries
from tests.conftest import bearer
from tests.factories import registration, report


@pytest.fixture
def fleet(client, make_token) -> dict[str, Any]:  # type: ignore[no-untyped-def]
    agent = bearer(make_token("agent"))
    assert client.post("/api/v1/nodes/register", json=registration("node-a"), headers=agent).status_code == 200
    launcher = bearer(make_token("launcher"))
    job = client.post("/api/v1/jobs", json={"name": "train", "world_size": 1}, headers=launcher).json()
    return {"agent": agent, "job": job["id"]}


def entries_by(client, actor: str) -> list[tuple[str, str, Any]]:  # type: ignore[no-untyped-def]
    with client.app.state.runtime.factory() as session:
        return [(e.action, e.subject, e.detail.get("status")) for e in list_entries(session, actor=actor)]


def one_call(client, make_token, role: str, method: str, path: str, body: Any = None,  # type: ignore[no-untyped-def]
             **token_fields: Any) -> tuple[int, list[tuple[str, str, Any]]]:
    name = f"{role}-{uuid.uuid4().hex[:6]}"
    secret = make_token(role, name, **token_fields)
    response = client.request(method, f"/api/v1{path}", json=body, headers=bearer(secret))
    return response.status_code, entries_by(client, f"{role}:{name}")


CALLS = [  # role, method, path, body, expected status, expected action
    ("operator", "POST", "/nodes/node-a/cordon", {"reason": "r"}, 200, "node.cordon"),
    ("agent", "POST", "/nodes/register", registration("node-a"), 200, "http.post"),
    ("launcher", "POST", "/jobs", {"name": "other", "world_size": 1}, 201, "job.create"),
    ("launcher", "POST", "/jobs/{job}/tasks", {"rank": 0, "node": "node-a"}, 201, "task.register"),
    ("launcher", "POST", "/jobs/{job}/placement", {}, 200, "http.post"),
    ("launcher", "POST", "/jobs/{job}/checkpoints", {"step": 10}, 201, "http.post"),
    ("operator", "POST", "/silences", {"matchers": [{"name": "node", "value": "node-a"}], "duration_seconds": 60},
     201, "silence.create"),
    ("operator", "POST", "/breaker/reset", {"reason": "drill"}, 200, "breaker.reset"),
    ("admin", "POST", "/tokens", {"name": "new", "role": "viewer"}, 201, "token.create"),
    ("viewer", "POST", "/nodes/node-a/cordon", None, 403, "http.post"),
    ("operator", "POST", "/nodes/ghost/cordon", None, 404, "http.post"),
    ("operator", "POST", "/incidents/99999/ack", None, 404, "http.post"),
    ("agent", "POST", "/nodes/register", registration("node-b"), 403, "http.post"),
]


@pytest.mark.parametrize("role, method, path, body, status, action", CALLS)
def test_each_state_changing_call_leaves_exactly_one_entry(client, make_token, fleet, role, method, path, body,
                                                          status, action):
    fields = {"node": "node-a"} if role == "agent" else {}
    code, entries = one_call(client, make_token, role, method, path.format(job=fleet["job"]), body, **fields)
    assert code == status
    assert len(entries) == 1, entries
    assert entries[0][0] == action
    if action.startswith("http."):
        assert entries[0][1] == f"/api/v1{path.format(job=fleet['job'])}" and entries[0][2] == status


def test_first_registration_of_an_unbound_token_is_one_bind_entry(client, make_token):
    code, entries = one_call(client, make_token, "agent", "POST", "/nodes/register", registration("node-c"),
                             node=None)
    assert code == 200 and [e[0] for e in entries] == ["token.bind"]


def test_silence_expiry_and_token_revocation_are_audited_once(client, make_token, admin_token):
    operator = bearer(make_token("operator", "ops1"))
    silence = client.post("/api/v1/silences", json={"matchers": [{"name": "node", "value": "x"}],
                                                    "duration_seconds": 60}, headers=operator).json()
    assert client.delete(f"/api/v1/silences/{silence['id']}", headers=operator).status_code == 200
    assert [e[0] for e in entries_by(client, "operator:ops1")] == ["silence.expire", "silence.create"]
    admin = bearer(make_token("admin", "root2"))
    victim = client.post("/api/v1/tokens", json={"name": "victim", "role": "viewer"}, headers=admin).json()
    assert client.post(f"/api/v1/tokens/{victim['id']}/revoke", headers=admin).status_code == 200
    assert client.post(f"/api/v1/tokens/{victim['id']}/revoke", headers=admin).status_code == 200
    assert [e[0] for e in entries_by(client, "admin:root2")] == ["http.post", "token.revoke", "token.create"]


def test_reports_and_unauthenticated_calls_leave_no_entry(client, fleet, make_token):
    with client.app.state.runtime.factory() as session:
        before = len(list_entries(session, limit=10_000))
    assert client.post("/api/v1/nodes/node-a/reports", json=report("node-a", 1),
                       headers=fleet["agent"]).status_code == 200
    assert client.post("/api/v1/nodes/node-a/cordon").status_code == 401
    assert client.post("/api/v1/nodes/node-a/cordon", headers=bearer("snt_wrong")).status_code == 401
    with client.app.state.runtime.factory() as session:
        assert len(list_entries(session, limit=10_000)) == before


def test_the_audit_log_is_readable_by_operators_with_filters(client, make_token, fleet):
    operator = bearer(make_token("operator", "carol"))
    client.post("/api/v1/nodes/node-a/cordon", json={"reason": "bad cable"}, headers=operator)
    client.post("/api/v1/nodes/node-a/uncordon", headers=operator)
    mine = client.get("/api/v1/audit", params={"actor": "operator:carol"}, headers=operator).json()
    assert [(e["action"], e["subject"]) for e in mine] == [("node.uncordon", "node/node-a"),
                                                            ("node.cordon", "node/node-a")]
    assert mine[1]["reason"] == "bad cable" and mine[0]["at"] >= mine[1]["at"]
    one = client.get("/api/v1/audit", params={"subject": "node/node-a", "limit": 1}, headers=operator).json()
    assert len(one) == 1 and one[0]["action"] == "node.uncordon"
    assert client.get("/api/v1/audit", headers=bearer(make_token("viewer"))).status_code == 403
    assert client.get("/api/v1/audit", params={"limit": 0}, headers=operator).status_code == 422


def test_cli_audit_prints_the_log_as_a_table(tmp_path):
    import subprocess

    from tests.live import LiveServer, sentinel_cmd

    server = LiveServer(tmp_path / "server", f"sqlite:///{tmp_path / 'sentinel.db'}").start()
    try:
        with server.api() as api:
            assert api.post("/tokens", json={"name": "ops", "role": "operator"}).status_code == 201
        out = subprocess.run(sentinel_cmd("audit", "--server", server.url, "--token", server.admin_token,
                                          "--action", "token.create"), capture_output=True, text=True, timeout=60)
    finally:
        server.stop()
    assert out.returncode == 0, out.stderr
    header, _, row = out.stdout.splitlines()[:3]
    assert header.split()[:4] == ["AT", "ACTOR", "ACTION", "SUBJECT"]
    assert row.split()[1:4] == ["admin:bootstrap-admin", "token.create", "token/ops"]
