"""The batching controller: AIMD on a serving job's batch limit against its SLO, on the job's real request
signals through the app (SQLite and PostgreSQL). TPOT over its target cuts the limit by 0.7; requests waiting
with TPOT headroom raise it by 2, or by the queue per replica (at most doubling); a change waits out the
cooldown; bounds hold; a dry run issues nothing; a change goes out as an `adjust` order the launcher reads,
which a restart order does not supersede."""

from __future__ import annotations

from typing import Any

import pytest

from sentinel.db import transaction
from sentinel.jobs.models import Job
from sentinel.remediation.orders import create_order
from sentinel.runtime import Runtime
from sentinel.serving.batching import BatchingController, Limits
from sentinel.serving.signals import Slo
from tests.serving.driver import ServingDriver


@pytest.fixture
def job(client, make_token, clock) -> ServingDriver:  # type: ignore[no-untyped-def]
    return ServingDriver(client, make_token, clock)


def runtime(job: ServingDriver) -> Runtime:
    return job.client.app.state.runtime  # type: ignore[attr-defined, no-any-return]


def load(job: ServingDriver, *, tpot: float, waiting: int, limit: int = 32, running: int | None = None) -> None:
    """One 2 s round: 20 requests on the decode replica d1, which reports its batch limit and queue (and how
    many it runs at once, where given)."""
    job.requests(1, 20, ttft=0.2, tpot=tpot)
    job.clock.advance(2.0)
    job.report(0)
    job.report(1, {"waiting": waiting, "batch_limit": limit, **({} if running is None else {"running": running})})


def controller(job: ServingDriver, issued: list[Any], **options: Any) -> BatchingController:
    def apply(job_id: int, params: dict[str, int], reason: str) -> str | None:
        issued.append((job_id, params, reason))
        return "o1"
    return BatchingController(runtime(job).live.serving, apply, limits=Limits(**options))


def test_tpot_over_its_target_cuts_the_limit_and_the_cooldown_holds_the_next(job: ServingDriver) -> None:
    issued: list[Any] = []
    ctl = controller(job, issued)
    load(job, tpot=0.08, waiting=0)  # SLO: TPOT 50 ms
    [d] = ctl.tick(job.clock.time())
    assert (d.before, d.after, d.applied) == (32, 22, True), "the replica's reported limit × 0.7"
    assert "TPOT p99 " in d.why and "(target 50 ms)" in d.why and d.why.endswith("TPOT over its target")
    assert issued == [(job.job, {"batch_limit": 22}, f"batch limit 32 → 22: {d.why}")]
    load(job, tpot=0.08, waiting=0)
    assert ctl.tick(job.clock.time()) == [], "2 s later: within the 5 s cooldown"
    for _ in range(2):
        load(job, tpot=0.08, waiting=0, limit=22)
    [d] = ctl.tick(job.clock.time())
    assert (d.before, d.after) == (22, 15)


def test_requests_waiting_with_tpot_headroom_raise_it_up_to_the_bound(job: ServingDriver) -> None:
    issued: list[Any] = []
    ctl = controller(job, issued, max_limit=33, cooldown_seconds=0.0)
    load(job, tpot=0.02, waiting=12)
    assert [(d.before, d.after) for d in ctl.tick(job.clock.time())] == [(32, 33)], "+6 (12 waiting, 2 replicas),\
 capped at 33"
    load(job, tpot=0.02, waiting=12)
    assert ctl.tick(job.clock.time()) == [], "at the bound: nothing to change"
    load(job, tpot=0.045, waiting=12)  # under the target, over 0.8 × it: no headroom
    assert ctl.tick(job.clock.time()) == []
    assert len(issued) == 1


def test_the_step_grows_with_the_queue_up_to_doubling(job: ServingDriver) -> None:
    issued: list[Any] = []
    ctl = controller(job, issued, cooldown_seconds=0.0)
    load(job, tpot=0.02, waiting=2, limit=4)
    assert [(d.before, d.after) for d in ctl.tick(job.clock.time())] == [(4, 6)], "1 per replica waiting: +2"
    load(job, tpot=0.02, waiting=100, limit=6)
    assert [(d.before, d.after) for d in ctl.tick(job.clock.time())] == [(6, 12)], "a long queue: at most doubled"


def test_nothing_waiting_and_within_the_slo_leaves_it(job: ServingDriver) -> None:
    issued: list[Any] = []
    ctl = controller(job, issued)
    load(job, tpot=0.02, waiting=0)
    assert ctl.tick(job.clock.time()) == [] and issued == []


def test_a_dry_run_says_what_it_would_do_and_issues_nothing(job: ServingDriver) -> None:
    issued: list[Any] = []
    ctl = controller(job, issued)
    ctl.dry_run = True
    load(job, tpot=0.08, waiting=0)
    [d] = ctl.tick(job.clock.time())
    assert (d.after, d.applied) == (22, False) and issued == []


def test_a_job_without_an_slo_or_with_few_requests_is_left_alone(client, make_token, clock) -> None:
    bare = ServingDriver(client, make_token, clock, attributes={})
    issued: list[Any] = []
    ctl = controller(bare, issued)
    load(bare, tpot=0.5, waiting=50)
    assert ctl.tick(clock.time()) == [], "no SLO: no target to steer by"
    runtime(bare).live.serving.set_slo(bare.job, Slo(0.5, 0.05))
    assert controller(bare, issued).tick(clock.time()), "with one, the same load is acted on"
    assert controller(bare, issued, min_requests=1000).tick(clock.time()) == [], "too few requests to judge"


def test_a_change_goes_out_as_an_adjust_order_that_a_restart_does_not_supersede(job: ServingDriver) -> None:
    rt = runtime(job)
    order_id = rt.remediation.adjust(job.job, {"batch_limit": 22}, "batch limit 32 → 22: test")
    assert order_id is not None
    [order] = job.client.get(f"/api/v1/jobs/{job.job}/orders", headers=job.launcher).json()
    assert (order["id"], order["kind"], order["params"], order["state"]) == (order_id, "adjust",
                                                                            {"batch_limit": 22}, "pending")
    assert order["attempt"] == 0, "an adjustment is no new attempt"
    with transaction(rt.factory) as session:  # a replica replacement for the same job, meanwhile
        create_order(session, job=session.get(Job, job.job), kind="replace_replica", placement=[], reason="test",
                     incident_id=None, now=rt.clock_now(), ack_seconds=60)
    second = rt.remediation.adjust(job.job, {"batch_limit": 15}, "batch limit 22 → 15: test")
    orders = {o["id"]: o for o in job.client.get(f"/api/v1/jobs/{job.job}/orders", params={"state": "all"},
                                                  headers=job.launcher).json()}
    assert orders[order_id]["state"] == "superseded", "the newer adjustment replaced it"
    assert {o["kind"]: o["state"] for o in orders.values() if o["id"] != order_id} == {
        "replace_replica": "pending", "adjust": "pending"}, "neither kind supersedes the other"
    ack = job.client.post(f"/api/v1/orders/{second}/ack", json={"status": "done", "detail": "limit 15"},
                          headers=job.launcher)
    assert ack.status_code == 200, ack.text
    [done] = [o for o in job.client.get(f"/api/v1/jobs/{job.job}/orders", params={"state": "all"},
                                         headers=job.launcher).json() if o["id"] == second]
    assert done["state"] == "done" and done["completed_at"] is not None
    assert rt.remediation.adjust(999, {"batch_limit": 4}, "x") is None, "an unknown job gets no order"


def test_a_load_past_half_the_limit_with_tpot_far_from_its_target_gets_room_before_it_queues(
        job: ServingDriver) -> None:
    issued: list[Any] = []
    ctl = controller(job, issued, cooldown_seconds=0.0)
    load(job, tpot=0.02, waiting=0, limit=8, running=3)
    assert ctl.tick(job.clock.time()) == [], "3 running of 8: room enough"
    load(job, tpot=0.02, waiting=0, limit=8, running=6)
    [d] = ctl.tick(job.clock.time())
    assert (d.before, d.after) == (8, 12), "6 running at once, TPOT 20 ms of 50: the limit to 2 × 6"
    assert "at most 6 running on a replica" in d.why and d.why.endswith("room for the next burst")
    load(job, tpot=0.02, waiting=0, limit=12, running=12)
    [d] = ctl.tick(job.clock.time())
    assert (d.before, d.after) == (12, 24), "at most doubling per tick"
    other: list[Any] = []
    near = controller(job, other, cooldown_seconds=0.0)
    load(job, tpot=0.03, waiting=0, limit=8, running=8)
    assert near.tick(job.clock.time()) == [], "TPOT 30 ms is over half its target: no room taken ahead of a queue"


def test_replicas_the_router_holds_start_from_the_routers_limit(job: ServingDriver) -> None:
    """vLLM takes no limit itself and reports none: the launcher says the router's with its queue."""
    issued: list[Any] = []
    ctl = controller(job, issued, cooldown_seconds=0.0)
    job.requests(1, 20, ttft=0.2, tpot=0.02)
    job.clock.advance(2.0)
    job.report(0)
    job.report(1, {"waiting": 0})
    assert ctl.tick(job.clock.time()) == [], "no limit known: nothing to start from"
    runtime(job).live.serving.set_router_waiting(job.job, 8, job.clock.time(), limit=6)
    assert [(d.before, d.after) for d in ctl.tick(job.clock.time())] == [(6, 10)], "+4 (8 waiting, 2 replicas)"
