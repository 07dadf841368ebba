"""The checkpoint catalog over REST, on SQLite and PostgreSQL: commit, plan, retention, policy."""

from __future__ import annotations

import json
import math
from typing import Any

import pytest

from tests.conftest import bearer
from tests.factories import registration, report


def shard(node: str, tier: str = "local", digest: str = "ab" * 16, attempt: int = 0, stall: float = 0.05,
          **extra: Any) -> dict[str, Any]:
    where = [{"tier": tier, "node": node if tier == "local" else "", "uri": f"/ckpt/{node or 'shared'}"}]
    return {"manifest_digest": digest, "bytes_total": 1000, "bytes_written": 100, "stall_seconds": stall,
            "write_seconds": 0.5, "attempt": attempt, "locations": where, **extra}


@pytest.fixture
def launcher(client, make_token):  # type: ignore[no-untyped-def]
    agent = bearer(make_token("agent"))
    for node in ("node-a", "node-b"):
        assert client.post("/api/v1/nodes/register", json=registration(node, accelerators=2),
                           headers=agent).status_code in (200, 201)
    return bearer(make_token("launcher", "trainer"))


def new_job(client, launcher, world_size: int = 2, **attributes: Any) -> int:  # type: ignore[no-untyped-def]
    body = {"name": "ckpt", "world_size": world_size, "attributes": attributes}
    return int(client.post("/api/v1/jobs", json=body, headers=launcher).json()["id"])


def put(client, launcher, job: int, step: int, rank: int, body: dict[str, Any]):  # type: ignore[no-untyped-def]
    return client.put(f"/api/v1/jobs/{job}/checkpoints/{step}/shards/{rank}", json=body, headers=launcher)


def test_a_step_commits_when_every_rank_is_in(client, launcher):
    job = new_job(client, launcher)
    created = client.post(f"/api/v1/jobs/{job}/checkpoints", json={"step": 10}, headers=launcher)
    assert created.status_code == 201 and created.json()["state"] == "pending"
    assert client.post(f"/api/v1/jobs/{job}/checkpoints", json={"step": 10}, headers=launcher).status_code == 200
    first = put(client, launcher, job, 10, 0, shard("node-a"))
    assert first.status_code == 200 and first.json()["committed"] is False
    second = put(client, launcher, job, 10, 1, shard("node-b"))
    assert second.json() == {"step": 10, "rank": 1, "state": "committed", "committed": True, "retired_steps": [],
                             "retired": []}
    detail = client.get(f"/api/v1/jobs/{job}/checkpoints/10", headers=launcher).json()
    assert detail["shards_in"] == 2 and detail["bytes_total"] == 2000 and detail["bytes_written"] == 200
    assert [s["locations"][0]["node"] for s in detail["shards"]] == ["node-a", "node-b"]
    plan = client.get(f"/api/v1/jobs/{job}/recovery-plan", headers=launcher).json()
    assert plan["step"] == 10 and [r["rank"] for r in plan["ranks"]] == [0, 1] and plan["skipped"] == []


@pytest.mark.parametrize("path, body, status, words", [
    ("/checkpoints/5/shards/7", shard("node-a"), 422, "outside job"),
    ("/checkpoints/5/shards/0", {**shard("node-a"), "stall_seconds": float("nan")}, 422, ""),
    ("/checkpoints/5/shards/0", {**shard("node-a"), "manifest_digest": "not-hex!"}, 422, ""),
    ("/checkpoints/5/shards/0", {**shard("node-a"), "locations": []}, 422, ""),
    ("/checkpoints/-1/shards/0", shard("node-a"), 422, ""),
])
def test_bad_shards_are_refused_precisely(client, launcher, path, body, status, words):
    job = new_job(client, launcher)
    response = client.put(f"/api/v1/jobs/{job}{path}", content=json.dumps(body), headers={
        **launcher, "content-type": "application/json"})
    assert response.status_code == status, response.text
    assert words in str(response.json()["detail"])


def test_unknown_job_is_404_and_viewers_cannot_write(client, launcher, make_token):
    assert put(client, launcher, 999, 1, 0, shard("node-a")).status_code == 404
    assert client.get("/api/v1/jobs/999/recovery-plan", headers=launcher).status_code == 404
    job = new_job(client, launcher)
    viewer = bearer(make_token("viewer"))
    assert put(client, viewer, job, 1, 0, shard("node-a")).status_code == 403
    assert client.get(f"/api/v1/jobs/{job}/recovery-plan", headers=viewer).status_code == 200
    assert client.get(f"/api/v1/jobs/{job}/recovery-plan").status_code == 401


def test_plan_passes_over_a_shard_only_on_a_failed_nodes_local_disk(client, launcher, make_token):
    job = new_job(client, launcher)
    for rank, node in ((0, "node-a"), (1, "node-b")):
        put(client, launcher, job, 10, rank, shard(node, tier="persistent"))
        put(client, launcher, job, 20, rank, shard(node))  # local tier only
    replicated = shard("node-b")
    replicated["locations"].append({"tier": "local", "node": "node-a", "uri": "/ckpt/node-a"})
    put(client, launcher, job, 30, 0, shard("node-a"))
    put(client, launcher, job, 30, 1, {**shard("node-b"), "locations": replicated["locations"]})
    operator = bearer(make_token("operator"))
    for index in range(2):  # node-b's accelerators quarantined: its local disk does not count
        assert client.post(f"/api/v1/accelerators/SIM-node-b-{index}/quarantine", json={"reason": "xid 79"},
                           headers=operator).status_code == 200
    plan = client.get(f"/api/v1/jobs/{job}/recovery-plan", headers=launcher).json()
    assert plan["step"] == 30  # rank 1's shard was replicated to node-a
    assert [loc["node"] for loc in plan["ranks"][1]["locations"]] == ["node-a"]
    body = {"reason": "tensor 'w' chunk 1 of 2 is corrupt"}
    fallback = client.post(f"/api/v1/jobs/{job}/checkpoints/30/shards/1/invalid", json=body, headers=launcher)
    assert fallback.status_code == 200
    assert fallback.json()["step"] == 10, fallback.json()  # 20 is only on node-b's local disk
    assert fallback.json()["skipped"] == [
        "step 30: rank 1's shard failed verification (tensor 'w' chunk 1 of 2 is corrupt)",
        "step 20: rank 1's shard is only on the local tier of node-b (quarantined) and not replicated"]
    events = client.get("/api/v1/events", params={"kind": "checkpoint_invalid"}, headers=launcher).json()
    assert any("step 30 rank 1" in e["message"] for e in events)


def test_no_checkpoint_means_start_from_scratch(client, launcher):
    job = new_job(client, launcher)
    put(client, launcher, job, 10, 0, shard("node-a"))  # rank 1 never came: not committed
    plan = client.get(f"/api/v1/jobs/{job}/recovery-plan", headers=launcher).json()
    assert plan["step"] is None and "starts from scratch" in plan["reason"]


def test_retention_keeps_the_last_n_and_every_mth_and_abandons_torn_steps(client, launcher):
    job = new_job(client, launcher, checkpoint_keep_last=2, checkpoint_keep_every=20)
    put(client, launcher, job, 5, 0, shard("node-a"))  # rank 1 died mid-save: never committed
    answer: dict[str, Any] = {}
    for step in (10, 20, 30, 40, 50):
        for rank in (0, 1):
            answer = put(client, launcher, job, step, rank, shard("node-a")).json()
    assert answer["retired_steps"] == [5, 10, 30]
    states = {c["step"]: c["state"] for c in client.get(f"/api/v1/jobs/{job}/checkpoints", headers=launcher).json()}
    assert states == {5: "abandoned", 10: "retired", 20: "committed", 30: "retired", 40: "committed",
                      50: "committed"}
    late = put(client, launcher, job, 10, 0, shard("node-a"))
    assert late.status_code == 409 and "retired" in late.json()["detail"]
    assert answer["retired"] == [{"step": 5, "attempt": 0}, {"step": 10, "attempt": 0}, {"step": 30, "attempt": 0}]


def test_a_restart_from_an_older_step_saves_retired_steps_again(client, launcher):
    """Resumed from step 20 (kept as every 20th), the next attempt's step 30 revives the retired one,
    and the GC hint then no longer names it: its new manifest must not be deleted."""
    job = new_job(client, launcher, checkpoint_keep_last=1, checkpoint_keep_every=20)
    for step in (20, 30, 40):
        for rank in (0, 1):
            answer = put(client, launcher, job, step, rank, shard("node-a")).json()
    assert answer["retired_steps"] == [30]
    revived = put(client, launcher, job, 30, 0, shard("node-b", attempt=1, digest="12" * 16)).json()
    assert revived["state"] == "pending" and 30 not in revived["retired_steps"]
    done = put(client, launcher, job, 30, 1, shard("node-b", attempt=1)).json()
    assert done["state"] == "retired"  # whole again, and retention (keep the last 1) drops it at once
    assert {"step": 30, "attempt": 1} in done["retired"]  # the ranks may now delete attempt 1's manifests too


def test_a_restarted_attempt_saving_the_same_step_starts_its_commit_over(client, launcher):
    job = new_job(client, launcher)
    put(client, launcher, job, 10, 0, shard("node-a"))
    put(client, launcher, job, 10, 1, shard("node-a"))
    again = put(client, launcher, job, 10, 0, shard("node-a", digest="cd" * 16, attempt=1)).json()
    assert again["state"] == "pending"  # rank 1's shard is from attempt 0 and no longer counts
    stale = put(client, launcher, job, 10, 1, shard("node-a", attempt=0))
    assert stale.status_code == 409 and "stale" in stale.json()["detail"]
    done = put(client, launcher, job, 10, 1, shard("node-a", digest="ef" * 16, attempt=1)).json()
    assert done["committed"] is True
    plan = client.get(f"/api/v1/jobs/{job}/recovery-plan", headers=launcher).json()
    assert [r["manifest_digest"] for r in plan["ranks"]] == ["cd" * 16, "ef" * 16]


def test_serving_replicas_commit_one_by_one(client, launcher):
    body = {"name": "llm", "kind": "serving", "world_size": 2}
    job = int(client.post("/api/v1/jobs", json=body, headers=launcher).json()["id"])
    assert put(client, launcher, job, 1, 1, shard("node-a")).json()["committed"] is True
    plan = client.get(f"/api/v1/jobs/{job}/recovery-plan", headers=launcher).json()
    assert plan["step"] == 1 and [r["rank"] for r in plan["ranks"]] == [1]


def test_job_api_recommends_a_young_daly_interval(client, launcher, make_token, clock):
    job = new_job(client, launcher)
    detail = client.get(f"/api/v1/jobs/{job}", headers=launcher).json()["checkpoints"]
    assert detail["last_committed_step"] is None and detail["interval_recommended_seconds"] is None
    for step, stall in ((10, 0.2), (20, 0.4), (30, 0.3)):
        put(client, launcher, job, step, 0, shard("node-a", stall=stall))
        put(client, launcher, job, step, 1, shard("node-a", stall=stall / 2))
    clock.advance(86400)  # the fleet has run a day: 4 accelerator-days, one fault
    fault = {"kind": "xid", "accelerator_uuid": "SIM-node-a-0", "xid": 79, "observed_at": clock.time()}
    client.post("/api/v1/nodes/node-a/reports", json=report("node-a", seq=1, events=[fault]),
                headers=bearer(make_token("agent")))
    policy = client.get(f"/api/v1/jobs/{job}", headers=launcher).json()["checkpoints"]
    assert policy["last_committed_step"] == 30 and policy["committed"] == 3
    assert policy["stall_seconds"] == pytest.approx(0.3)  # median of the slowest rank per step
    assert policy["bytes_written_total"] == 600 and "fleet's hardware fault rate" in policy["failure_basis"]
    assert policy["mtbf_hours"] == pytest.approx(4 * 24 / 2, rel=0.01)  # per accelerator 96 h; the job has two
    mtbf_seconds = policy["mtbf_hours"] * 3600
    assert policy["interval_recommended_seconds"] == pytest.approx(math.sqrt(2 * 0.3 * mtbf_seconds))


def test_ranks_registering_at_the_same_moment_commit_every_step(client, launcher):
    """Each shard's transaction must see the others' before counting them (a row lock on PostgreSQL)."""
    import threading

    job = new_job(client, launcher, world_size=4, checkpoint_keep_last=100)
    barrier = threading.Barrier(4)
    errors: list[str] = []

    def rank(r: int) -> None:
        for step in range(1, 9):
            barrier.wait()
            response = put(client, launcher, job, step, r, shard("node-a"))
            if response.status_code != 200:
                errors.append(response.text)

    threads = [threading.Thread(target=rank, args=(r,)) for r in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert errors == []
    states = [c["state"] for c in client.get(f"/api/v1/jobs/{job}/checkpoints", headers=launcher).json()]
    assert states == ["committed"] * 8


def test_retention_keeps_the_newest_persistent_steps_as_well(client, launcher):
    """Local saves every step would push the less frequent persistent ones out of 'the last N'."""
    job = new_job(client, launcher, checkpoint_keep_last=2)
    for step in range(1, 8):
        tier = "persistent" if step in (2, 4) else "local"
        for rank in (0, 1):
            answer = put(client, launcher, job, step, rank, shard("node-a", tier=tier)).json()
    assert answer["retired_steps"] == [1, 3, 5]  # 2 and 4 are the newest two with a persistent copy


def test_each_serving_replica_gets_its_own_newest_usable_shard(client, launcher, make_token):
    body = {"name": "llm", "kind": "serving", "world_size": 3}
    job = int(client.post("/api/v1/jobs", json=body, headers=launcher).json()["id"])
    put(client, launcher, job, 1, 0, shard("node-a", tier="persistent"))
    put(client, launcher, job, 1, 1, shard("node-a", tier="persistent"))
    put(client, launcher, job, 2, 1, shard("node-b"))  # replica 1 saved newer weights, on node-b's disk only
    plan = client.get(f"/api/v1/jobs/{job}/recovery-plan", headers=launcher).json()
    assert [(r["rank"], r["step"]) for r in plan["ranks"]] == [(0, 1), (1, 2)] and plan["step"] == 2
    operator = bearer(make_token("operator"))
    for index in range(2):
        client.post(f"/api/v1/accelerators/SIM-node-b-{index}/quarantine", json={"reason": "x"}, headers=operator)
    plan = client.get(f"/api/v1/jobs/{job}/recovery-plan", headers=launcher).json()
    assert [(r["rank"], r["step"]) for r in plan["ranks"]] == [(0, 1), (1, 1)]  # replica 2 never saved
    assert plan["skipped"] == ["step 2: rank 1's shard is only on the local tier of node-b (quarantined) and "
                               "not replicated"]


def test_the_detectors_ledger_follows_commits_and_is_rebuilt_from_sql(client, launcher, clock):
    """checkpoint_stale reads commits from memory; the catalog keeps that current, and a restart reloads it."""
    from sentinel.live.checkpoints import CheckpointLedger

    rt = client.app.state.runtime
    job = new_job(client, launcher)
    for step in (10, 20):
        clock.advance(60)
        put(client, launcher, job, step, 0, shard("node-a"))
        put(client, launcher, job, step, 1, shard("node-a"))
    put(client, launcher, job, 30, 0, shard("node-a"))  # rank 1's shard of step 30 never comes
    view = rt.checkpoints.view(job)
    assert [s for _, s in view.commits] == [10, 20] and view.pending_step == 30 and view.pending_ranks == {0}
    assert view.commits[1][0] - view.commits[0][0] == pytest.approx(60)
    reloaded = CheckpointLedger()
    with rt.factory() as session:
        reloaded.load(session)
    assert [s for _, s in reloaded.view(job).commits] == [10, 20]
