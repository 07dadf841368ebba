from __future__ import annotations

from tests.conftest import bearer
from tests.factories import registration


def test_cordon_and_uncordon_are_audited_and_evented(client, make_token, admin_token):
    client.post("/api/v1/nodes/register", json=registration("node-a"), headers=bearer(make_token("agent")))
    operator = bearer(make_token("operator", "alice"))
    node = client.post("/api/v1/nodes/node-a/cordon", json={"reason": "flaky NVLink"}, headers=operator).json()
    assert node["state"] == "cordoned" and node["state_reason"] == "flaky NVLink"
    node = client.post("/api/v1/nodes/node-a/uncordon", headers=operator).json()
    assert node["state"] == "active"
    rt = client.app.state.runtime
    from sentinel.audit.service import list_entries

    with rt.factory() as session:
        entries = [(e.actor, e.action, e.reason) for e in list_entries(session, subject="node/node-a")]
    assert entries == [("operator:alice", "node.uncordon", ""), ("operator:alice", "node.cordon", "flaky NVLink")]
    kinds = [e["kind"] for e in client.get("/api/v1/events", params={"node": "node-a"},
                                           headers=bearer(admin_token)).json()]
    assert "node_cordoned" in kinds and "node_active" in kinds


def test_cordon_unknown_node_is_404(client, admin_token):
    response = client.post("/api/v1/nodes/nowhere/cordon", headers=bearer(admin_token))
    assert response.status_code == 404 and "nowhere" in response.json()["detail"]


def test_reregistration_marks_a_missing_accelerator_absent(client, make_token, admin_token):
    agent = bearer(make_token("agent"))
    client.post("/api/v1/nodes/register", json=registration("node-a", accelerators=3), headers=agent)
    response = client.post("/api/v1/nodes/register", json=registration("node-a", accelerators=2), headers=agent)
    assert response.status_code == 200
    accs = {a["uuid"]: a["present"] for a in response.json()["node"]["accelerators"]}
    assert accs == {"SIM-node-a-0": True, "SIM-node-a-1": True, "SIM-node-a-2": False}
    events = client.get("/api/v1/events", params={"kind": "accelerator_gone"}, headers=bearer(admin_token)).json()
    assert [e["accelerator_uuid"] for e in events] == ["SIM-node-a-2"]


def test_registration_with_duplicate_uuids_is_422(client, make_token):
    reg = registration("node-a")
    reg["accelerators"][1]["uuid"] = reg["accelerators"][0]["uuid"]
    response = client.post("/api/v1/nodes/register", json=reg, headers=bearer(make_token("agent")))
    assert response.status_code == 422


def test_listing_filters_by_state(client, make_token, admin_token):
    agent = bearer(make_token("agent"))
    for name in ("n1", "n2"):
        client.post("/api/v1/nodes/register", json=registration(name), headers=agent)
    client.post("/api/v1/nodes/n2/cordon", headers=bearer(admin_token))
    listed = client.get("/api/v1/nodes", params={"state": "cordoned"}, headers=bearer(admin_token)).json()
    assert [n["name"] for n in listed] == ["n2"]
    assert client.get("/api/v1/nodes", params={"state": "weird"}, headers=bearer(admin_token)).status_code == 422
