"""Tokens are listed without secrets, and a revoked one stops working: at once here, within the cache TTL
on another server sharing the database."""

from __future__ import annotations

import subprocess
import sys
import time

from fastapi.testclient import TestClient

from sentinel.app import create_app
from sentinel.audit.service import list_entries
from sentinel.auth.service import TokenCache
from tests.conftest import bearer


def test_list_shows_every_token_but_never_a_secret_or_hash(client, admin_token, make_token):
    secret = make_token("operator", "alice")
    listed = client.get("/api/v1/tokens", headers=bearer(admin_token))
    assert listed.status_code == 200
    assert secret not in listed.text and admin_token not in listed.text and "hash" not in listed.text
    alice = next(t for t in listed.json() if t["name"] == "alice")
    assert alice["role"] == "operator" and alice["prefix"] == secret[:12] and alice["revoked_at"] is None
    assert set(alice) == {"id", "name", "role", "node", "rate_limit_per_second", "prefix", "created_at",
                          "expires_at", "revoked_at"}
    assert client.get("/api/v1/tokens", headers=bearer(secret)).status_code == 403


def test_revoke_stops_the_token_at_once_is_idempotent_and_audited(client, admin_token, make_token):
    secret = make_token("viewer", "watcher")
    assert client.get("/api/v1/nodes", headers=bearer(secret)).status_code == 200  # now cached
    token_id = next(t["id"] for t in client.get("/api/v1/tokens", headers=bearer(admin_token)).json()
                    if t["name"] == "watcher")
    revoked = client.post(f"/api/v1/tokens/{token_id}/revoke", headers=bearer(admin_token))
    assert revoked.status_code == 200 and revoked.json()["revoked_at"] is not None
    assert client.get("/api/v1/nodes", headers=bearer(secret)).status_code == 401
    again = client.post(f"/api/v1/tokens/{token_id}/revoke", headers=bearer(admin_token))
    assert again.status_code == 200 and again.json()["revoked_at"] == revoked.json()["revoked_at"]
    assert client.post("/api/v1/tokens/99999/revoke", headers=bearer(admin_token)).status_code == 404
    assert client.post(f"/api/v1/tokens/{token_id}/revoke", headers=bearer(make_token("operator"))).status_code == 403
    live = [t["name"] for t in client.get("/api/v1/tokens", params={"revoked": "false"},
                                          headers=bearer(admin_token)).json()]
    assert "watcher" not in live
    with client.app.state.runtime.factory() as session:
        entries = [(e.actor, e.action) for e in list_entries(session, subject="token/watcher")]
    assert entries.count(("admin:bootstrap-admin", "token.revoke")) == 1


def test_another_server_stops_accepting_it_within_the_cache_ttl(client, settings, clock, admin_token, make_token):
    secret = make_token("viewer", "shared")
    other_app = create_app(settings, clock, run_scheduler=False)
    with TestClient(other_app) as other:
        other_app.state.runtime.tokens = TokenCache(other_app.state.runtime.factory, ttl_seconds=0.5)
        assert other.get("/api/v1/nodes", headers=bearer(secret)).status_code == 200
        token_id = next(t["id"] for t in client.get("/api/v1/tokens", headers=bearer(admin_token)).json()
                        if t["name"] == "shared")
        assert client.post(f"/api/v1/tokens/{token_id}/revoke", headers=bearer(admin_token)).status_code == 200
        assert client.get("/api/v1/nodes", headers=bearer(secret)).status_code == 401
        deadline = time.monotonic() + 0.5 + 2.0
        while other.get("/api/v1/nodes", headers=bearer(secret)).status_code == 200:
            assert time.monotonic() < deadline, "the other server kept accepting a revoked token past its TTL"
            time.sleep(0.1)


def test_cli_lists_and_revokes_by_name(tmp_path, database_url):
    env = {"SENTINEL_DATA_DIR": str(tmp_path), "SENTINEL_DATABASE_URL": database_url, "PATH": "/usr/bin:/bin"}

    def sentinel(*argv: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run([sys.executable, "-m", "sentinel.cli", *argv], env=env, capture_output=True,
                              text=True, timeout=60)

    made = sentinel("token", "create", "--role", "agent", "--name", "rack7", "--node", "rack7-*")
    assert made.returncode == 0, made.stderr
    secret = made.stdout.strip().splitlines()[-1]
    listed = sentinel("token", "list")
    assert listed.returncode == 0, listed.stderr
    header, _, row = listed.stdout.splitlines()[:3]
    assert header.split()[:4] == ["ID", "NAME", "ROLE", "NODE"]
    assert row.split()[1:4] == ["rack7", "agent", "rack7-*"] and secret not in listed.stdout
    revoked = sentinel("token", "revoke", "rack7")
    assert revoked.returncode == 0 and "revoked agent token 'rack7'" in revoked.stdout
    assert "already revoked" in sentinel("token", "revoke", "rack7").stdout
    assert "rack7" not in sentinel("token", "list").stdout
    assert "rack7" in sentinel("token", "list", "--all").stdout
    missing = sentinel("token", "revoke", "nobody")
    assert missing.returncode == 1 and "no token named 'nobody'" in missing.stderr
