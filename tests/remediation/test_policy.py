"""The remediation policy as data: every recommended action's flow, what each flow needs, and the rules the
flows apply (remediation/policy.py). Pure functions; no database, no clock."""

from __future__ import annotations

import pytest

from sentinel.detection import catalog
from sentinel.detection.catalog import FaultCatalog
from sentinel.remediation import policy
from sentinel.remediation.policy import Decision, Facts, decide

GPU, NODE, JOB = "GPU-aaaa", "gpu-07", 42

# (recommended action, what the incident names) → the decision
TABLE: list[tuple[Facts, Decision]] = [
    (Facts("reset_accelerator", "hardware", node=NODE, accelerator=GPU),
     Decision("take_out_accelerator", accelerators=(GPU,))),
    (Facts("quarantine", "lemon", node=NODE, accelerator=GPU), Decision("take_out_accelerator", accelerators=(GPU,))),
    (Facts("restart_node", "hardware", node=NODE, accelerator=GPU, node_accelerators=(GPU, "GPU-bbbb")),
     Decision("take_out_node", accelerators=(GPU, "GPU-bbbb"), drain=NODE)),
    (Facts("drain_node", "hardware", node=NODE, node_accelerators=()), Decision("take_out_node", drain=NODE)),
    (Facts("page", "heartbeat", wide_nodes=("a", "b"), wide_accelerators=("GPU-1", "GPU-2")),
     Decision("fleet_wide", accelerators=("GPU-1", "GPU-2"), nodes=("a", "b"))),
    (Facts("probe", "straggler", node=NODE, accelerator=GPU, job_id=JOB), Decision("probe", accelerators=(GPU,))),
    (Facts("restart_task", "task_exit", node=NODE, job_id=JOB), Decision("restart_job", job_id=JOB,
                                                                         after_failure=True)),
    (Facts("restart_task", "hang", node=NODE, job_id=JOB), Decision("restart_job", job_id=JOB)),
    (Facts("record", "throttle", node=NODE, accelerator=GPU), policy.NOTHING),
    # a flow whose subject is unknown does nothing
    (Facts("reset_accelerator", "hardware", node=NODE), policy.NOTHING),
    (Facts("restart_node", "hardware", accelerator=GPU), policy.NOTHING),
    (Facts("page", "allreduce_spike"), Decision("fleet_wide")),  # jobs, no nodes: still pages a person
    (Facts("probe", "straggler", job_id=JOB), policy.NOTHING),
    (Facts("restart_task", "task_exit", node=NODE), policy.NOTHING),
    (Facts("no_such_action", "hardware", node=NODE, accelerator=GPU, job_id=JOB), policy.NOTHING),
]


@pytest.mark.parametrize(("facts", "expected"), TABLE, ids=[f"{f.action}-{f.detector}-{i}" for i, (f, _) in
                                                            enumerate(TABLE)])
def test_the_decision_table(facts: Facts, expected: Decision) -> None:
    assert decide(facts) == expected


def test_every_action_a_finding_can_recommend_has_a_flow() -> None:
    """An action the fault catalog allows (or its built-in table uses) but remediation does not know would be
    silently ignored."""
    built_in = FaultCatalog.load(None)
    used = {e.action for e in [*built_in.xids.values(), built_in.default_xid, *built_in.events.values()]}
    assert set(catalog.ACTIONS) | used <= set(policy.DECISIONS), (set(catalog.ACTIONS) | used) - set(policy.DECISIONS)


def test_ranks_on_a_bad_or_unusable_accelerator_move_and_the_others_stay() -> None:
    current = {0: ["g0"], 1: ["g1"], 2: ["g2", "g3"], 3: []}
    assert policy.ranks_to_replace(current, bad={"g1"}, usable={"g0", "g1", "g2", "g3"}) == {1}
    assert policy.ranks_to_replace(current, bad=set(), usable={"g0", "g1", "g2"}) == {2}  # g3 taken elsewhere
    assert policy.ranks_to_replace(current, bad=set(), usable={"g0", "g1", "g2", "g3"}) == frozenset()


@pytest.mark.parametrize(("after_failure", "failed", "newer", "wanted"), [
    (True, 1, 0, True),  # a task of the latest attempt failed, nothing ordered yet
    (True, 0, 0, False),  # exits of an attempt being replaced
    (True, 1, 1, False),  # a newer attempt is already ordered
    (False, 0, 0, True),  # a hang: restart without a failed task
    (False, 0, 1, False),
])
def test_restart_in_place_unless_already_ordered_or_expected(after_failure: bool, failed: int, newer: int,
                                                           wanted: bool) -> None:
    assert policy.restart_wanted(after_failure=after_failure, failed_in_latest=failed, newer_orders=newer) is wanted


def test_serving_replicas_are_replaced_and_everything_else_restarts() -> None:
    assert policy.order_kind("serving") == "replace_replica"
    assert policy.order_kind("training") == "restart"
    assert policy.order_kind("batch") == "restart"


STORM = {"limit": 5, "window_seconds": 1800.0, "hourly_limit": 12, "without_progress": 3}


@pytest.mark.parametrize(("recent", "hourly", "steps", "next_step", "why"), [
    (4, 4, [], None, ""),  # 4 restarts in 30 min: another may happen
    (5, 5, [], None, "restarted 5 times in the last 30 min"),
    (2, 12, [], None, "restarted 12 times in the last hour"),
    (3, 3, [100, 100, 100], 100, "restarted 3 times without checkpoint progress"),
    (3, 3, [100, 100, 90], 100, ""),  # it progressed between the last restarts
    (3, 3, [100, 100, 100], 200, ""),  # a newer checkpoint since: the next resumes further on
    (2, 2, [100, 100], 100, ""),  # only two so far
    (3, 3, [None, None, None], None, ""),  # never checkpointed: judged by the counts alone
])
def test_a_restart_storm_is_judged_by_counts_and_checkpoint_progress(recent: int, hourly: int, steps: list[int | None],
                                                                     next_step: int | None, why: str) -> None:
    reason = policy.restart_storm(recent=recent, hourly=hourly, steps=steps, next_step=next_step, **STORM)
    assert reason.startswith(why) if why else reason == ""


def test_the_probe_verdict() -> None:
    assert policy.probe_verdict(0.5, 0.8) == "quarantine"
    assert policy.probe_verdict(0.8, 0.8) == "healthy"
    assert policy.probe_verdict(None, 0.8) == "unavailable"
