"""Tokens are stored hashed, roles are enforced on every endpoint, the first admin token appears once."""

from __future__ import annotations

import stat
import subprocess
import sys

import pytest
from fastapi.testclient import TestClient
from sqlalchemy import create_engine, select

from sentinel.app import create_app
from sentinel.auth.models import ApiToken
from tests.conftest import bearer
from tests.factories import registration


def test_bootstrap_admin_token_is_created_once_and_private(client, settings, clock, admin_token):
    path = settings.admin_token_file
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    assert client.get("/api/v1/nodes", headers=bearer(admin_token)).status_code == 200
    path.unlink()
    with TestClient(create_app(settings, clock, run_scheduler=False)):
        pass
    assert not path.exists(), "a second start must not mint another admin token"


def test_tokens_are_stored_only_as_hashes(client, make_token, database_url):
    secret = make_token("viewer", "watcher")
    engine = create_engine(database_url)
    with engine.connect() as conn:
        rows = conn.execute(select(ApiToken.name, ApiToken.token_hash, ApiToken.prefix)).all()
    engine.dispose()
    assert all(secret not in (row.token_hash, row.name) for row in rows)
    assert any(row.prefix == secret[:12] for row in rows)
    assert len({row.token_hash for row in rows}) == len(rows)


@pytest.mark.parametrize("headers", [{}, {"Authorization": "Bearer snt_nope"}, {"Authorization": "Basic abc"}])
def test_missing_or_unknown_token_is_401(client, headers):
    response = client.get("/api/v1/nodes", headers=headers)
    assert response.status_code == 401
    assert response.headers["www-authenticate"].startswith("Bearer")


def test_health_checks_need_no_token(client):
    assert client.get("/healthz").status_code == 200
    assert client.get("/readyz").json()["status"] == "ready"


def test_metrics_need_a_token_by_default(client, make_token):
    assert client.get("/metrics").status_code == 401
    assert client.get("/metrics", headers=bearer(make_token("viewer"))).status_code == 200


# (role, method, path, body, allowed)
MATRIX = [
    ("agent", "post", "/api/v1/nodes/node-a/cordon", None, False),
    ("viewer", "post", "/api/v1/nodes/node-a/cordon", None, False),
    ("launcher", "post", "/api/v1/nodes/node-a/cordon", None, False),
    ("operator", "post", "/api/v1/nodes/node-a/cordon", None, True),
    ("viewer", "post", "/api/v1/jobs", {"name": "j", "world_size": 1}, False),
    ("agent", "post", "/api/v1/jobs", {"name": "j", "world_size": 1}, False),
    ("launcher", "post", "/api/v1/jobs", {"name": "j", "world_size": 1}, True),
    ("viewer", "post", "/api/v1/nodes/register", registration("node-b"), False),
    ("operator", "post", "/api/v1/nodes/register", registration("node-b"), False),
    ("agent", "post", "/api/v1/nodes/register", registration("node-b"), True),
    ("agent", "get", "/api/v1/nodes", None, False),
    ("viewer", "get", "/api/v1/nodes", None, True),
    ("operator", "post", "/api/v1/tokens", {"name": "x", "role": "admin"}, False),
    ("viewer", "get", "/api/v1/accelerators", None, True),
    ("agent", "get", "/api/v1/events", None, False),
]


@pytest.mark.parametrize("role, method, path, body, allowed", MATRIX)
def test_each_role_reaches_only_its_endpoints(client, make_token, admin_token, role, method, path, body, allowed):
    client.post("/api/v1/nodes/register", json=registration("node-a"), headers=bearer(make_token("agent")))
    response = client.request(method.upper(), path, json=body, headers=bearer(make_token(role)))
    if allowed:
        assert response.status_code < 400, response.text
    else:
        assert response.status_code == 403
        assert f"role {role!r} may not" in response.json()["detail"]


def test_cli_token_create_prints_the_token_alone_on_the_last_line(tmp_path, database_url):
    env = {"SENTINEL_DATA_DIR": str(tmp_path), "SENTINEL_DATABASE_URL": database_url, "PATH": "/usr/bin:/bin"}
    result = subprocess.run([sys.executable, "-m", "sentinel.cli", "token", "create", "--role", "operator",
                             "--name", "oncall"], env=env, capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stderr
    token = result.stdout.strip().splitlines()[-1]
    assert token.startswith("snt_") and " " not in token
    engine = create_engine(database_url)
    with engine.connect() as conn:
        row = conn.execute(select(ApiToken.role, ApiToken.name).where(ApiToken.prefix == token[:12])).one()
    engine.dispose()
    assert (row.role, row.name) == ("operator", "oncall")
