"""An agent token reports only for its own node: bound at creation (name or glob) or by its first registration."""

from __future__ import annotations

import subprocess
import sys

from sqlalchemy import create_engine, select

from sentinel.audit.service import list_entries
from sentinel.auth.models import ApiToken
from tests.conftest import bearer
from tests.factories import registration, report


def token(client, admin_token, name, role="agent", **fields):  # type: ignore[no-untyped-def]
    response = client.post("/api/v1/tokens", json={"name": name, "role": role, **fields}, headers=bearer(admin_token))
    assert response.status_code == 201, response.text
    return bearer(response.json()["token"])


def register(client, headers, node):  # type: ignore[no-untyped-def]
    return client.post("/api/v1/nodes/register", json=registration(node), headers=headers)


def test_a_token_bound_to_a_node_acts_only_for_it(client, admin_token):
    agent = token(client, admin_token, "agent-a", node="node-a")
    assert register(client, agent, "node-a").status_code == 200
    assert register(client, token(client, admin_token, "agent-b", node="node-b"), "node-b").status_code == 200
    refused = register(client, agent, "node-b")
    assert refused.status_code == 403
    assert refused.json()["detail"] == ("token 'agent-a' (id 2) is bound to node 'node-a' and may not act for "
                                        "node 'node-b'")
    assert client.post("/api/v1/nodes/node-a/reports", json=report("node-a", 1), headers=agent).status_code == 200
    wrong = client.post("/api/v1/nodes/node-b/reports", json=report("node-b", 1), headers=agent)
    assert wrong.status_code == 403 and "'node-b'" in wrong.json()["detail"]
    assert client.get("/api/v1/nodes/node-b/commands", headers=agent).status_code == 403
    assert client.get("/api/v1/nodes/node-a/commands", headers=agent).json() == []


def test_a_glob_binding_covers_matching_nodes_only(client, admin_token):
    sims = token(client, admin_token, "sims", node="sim-*")
    assert register(client, sims, "sim-1").status_code == 200
    assert register(client, sims, "sim-2").status_code == 200
    refused = register(client, sims, "gpu-1")
    assert refused.status_code == 403 and "'sim-*'" in refused.json()["detail"]


def test_an_unbound_agent_token_binds_to_its_first_node_for_good(client, admin_token, database_url):
    agent = token(client, admin_token, "tofu")
    early = client.post("/api/v1/nodes/node-a/reports", json=report("node-a", 1), headers=agent)
    assert early.status_code == 403 and "not bound to a node yet" in early.json()["detail"]
    assert register(client, agent, "node-a").status_code == 200
    # bound at once on this server (the cached principal is dropped), and persisted
    assert client.post("/api/v1/nodes/node-a/reports", json=report("node-a", 1), headers=agent).status_code == 200
    refused = register(client, agent, "node-b")
    assert refused.status_code == 403 and "bound to node 'node-a'" in refused.json()["detail"]
    assert register(client, agent, "node-a").status_code == 200, "re-registering its own node is fine"
    engine = create_engine(database_url)
    with engine.connect() as conn:
        assert conn.execute(select(ApiToken.node).where(ApiToken.name == "tofu")).scalar_one() == "node-a"
    engine.dispose()
    with client.app.state.runtime.factory() as session:
        binds = [(e.actor, e.detail["node"]) for e in list_entries(session, action="token.bind")]
    assert binds == [("agent:tofu", "node-a")]


def test_admin_tokens_act_for_any_node(client, admin_token):
    admin = bearer(admin_token)
    assert register(client, admin, "node-x").status_code == 200
    assert register(client, admin, "node-y").status_code == 200
    assert client.post("/api/v1/nodes/node-y/reports", json=report("node-y", 1), headers=admin).status_code == 200


def test_only_agent_and_admin_tokens_take_a_node(client, admin_token):
    response = client.post("/api/v1/tokens", json={"name": "v", "role": "viewer", "node": "node-a"},
                           headers=bearer(admin_token))
    assert response.status_code == 422 and "agent tokens" in response.json()["detail"]
    bad = client.post("/api/v1/tokens", json={"name": "a", "role": "agent", "node": "no spaces"},
                      headers=bearer(admin_token))
    assert bad.status_code == 422


def test_cli_token_create_takes_a_node_and_a_rate(tmp_path, database_url):
    env = {"SENTINEL_DATA_DIR": str(tmp_path), "SENTINEL_DATABASE_URL": database_url, "PATH": "/usr/bin:/bin"}
    result = subprocess.run([sys.executable, "-m", "sentinel.cli", "token", "create", "--role", "agent",
                             "--name", "gpu-7-agent", "--node", "gpu-7", "--rate-limit", "50"],
                            env=env, capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stderr
    engine = create_engine(database_url)
    with engine.connect() as conn:
        row = conn.execute(select(ApiToken.node, ApiToken.rate_limit_per_second)
                           .where(ApiToken.name == "gpu-7-agent")).one()
    engine.dispose()
    assert (row.node, row.rate_limit_per_second) == ("gpu-7", 50.0)
