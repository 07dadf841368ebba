"""The engine_fault detector: a serving engine whose engine core failed and waits for an instruction gets one,
decided from Sentinel's evidence — scale_down on hardware evidence against the waiting rank's accelerators, a
dead core, or retries that did not hold; retry otherwise — and the incident says which and why."""

from __future__ import annotations

from sentinel.detection.detectors.engine_fault import EngineFault
from sentinel.incidents.findings import Finding, OpenIncident, Subject
from tests.detection.engine_fault_scenarios import NODE, ft_stats, serving_world
from tests.detection.streams import World

ACC_R1 = f"GPU-{NODE}-1"  # rank 1 of job 9 runs on it


def report(world: World, states: dict[int, str], error: str = "", job_id: int = 9) -> None:
    for rank, state in states.items():
        world.serving.add(NODE, job_id, rank, ft_stats(world, f"r{rank}", rank, state, error), world.now)


def step(world: World, detector: EngineFault, states: dict[int, str], error: str = "") -> list[Finding]:
    world.advance(10.0)
    report(world, states, error)
    return world.evaluate(detector).findings


def one_fault(world: World, state: str = "unhealthy") -> Finding:
    detector = EngineFault(world.settings)
    assert step(world, detector, {0: "healthy", 1: "healthy"}) == [], "healthy engines: nothing"
    [found] = step(world, detector, {0: "healthy", 1: state})
    return found


def test_a_failed_engine_core_without_hardware_evidence_is_told_to_retry_and_says_why() -> None:
    world = serving_world()
    world.fault("node-other", "GPU-node-other-1", xid=79)  # another node's
    world.fault(NODE, f"GPU-{NODE}-0", xid=79)  # rank 0's accelerator, not the failed rank's
    world.fault(NODE, ACC_R1, xid=13)  # an application XID: the program's, not the accelerator's
    found = one_fault(world)
    assert found.evidence["decision"] == "retry" and found.action == "instruct_engine"
    assert found.evidence["replicas"] == ["r1"] and found.layer == "software"
    assert "replica r1 (DP rank 1, unhealthy: RuntimeError); decided retry: no hardware evidence on node node-s's " \
           f"accelerators {ACC_R1}" in found.title
    assert found.evidence["reasons"][1] == "no retry in the last 10 min"
    assert found.subject == Subject(node=NODE, job_id=9, rank=1)


def test_a_recent_xid_on_the_failed_ranks_accelerator_decides_scale_down() -> None:
    world = serving_world()
    world.fault(NODE, ACC_R1, xid=79, days_ago=10 / 1440)  # 10 min ago
    found = one_fault(world)
    assert found.evidence["decision"] == "scale_down" and found.layer == "hardware"
    assert f"xid 79 on {ACC_R1} 10 min ago" in found.title
    assert found.evidence["ranks"][0]["hardware_faults"] == [f"xid 79 on {ACC_R1} 10 min ago"]


def test_an_old_xid_is_no_evidence() -> None:
    world = serving_world()
    world.fault(NODE, ACC_R1, xid=79, days_ago=2 / 24)  # 2 h ago, over hardware_seconds (1 h)
    assert one_fault(world).evidence["decision"] == "retry"


def test_an_open_hardware_incident_or_a_quarantined_accelerator_decides_scale_down() -> None:
    world = serving_world()
    world.ctx.open_incidents = lambda: [
        OpenIncident(7, f"throttle|node={NODE}|accelerator={ACC_R1}", "throttle", False,
                     Subject(node=NODE, accelerator=ACC_R1), world.now - 60),
        OpenIncident(8, "hardware|job=9|application", "hardware", False, Subject(node=NODE, job_id=9), world.now)]
    found = one_fault(world)
    assert found.evidence["decision"] == "scale_down"
    assert found.evidence["ranks"][0]["hardware_incidents"] == [f"incident #7 (throttle on {ACC_R1})"]

    world = serving_world()
    world.ctx.out_of_service = lambda uuids: {u: "quarantined" for u in uuids if u == ACC_R1}
    found = one_fault(world)
    assert found.evidence["decision"] == "scale_down" and f"{ACC_R1} quarantined" in found.title


def test_a_dead_engine_core_cannot_take_a_retry() -> None:
    found = one_fault(serving_world(), state="dead")
    assert found.evidence["decision"] == "scale_down"
    assert "the engine core of replica r1 (rank 1) is dead: it cannot take a retry" in found.title


def test_retries_that_do_not_hold_end_in_scale_down_each_episode_its_own_incident() -> None:
    world = serving_world()
    detector = EngineFault(world.settings)
    decided = []
    for _ in range(3):  # fail, be told, recover; three times within 10 minutes
        [found] = step(world, detector, {0: "healthy", 1: "unhealthy"})
        decided.append((found.key, found.evidence["decision"]))
        assert step(world, detector, {0: "healthy", 1: "healthy"}) == [], "healthy again: the incident clears"
    assert decided == [("job=9|fault=1", "retry"), ("job=9|fault=2", "retry"), ("job=9|fault=3", "scale_down")]
    assert "2 retries in the last 10 min did not hold (max_retries 2)" in found.title
    for _ in range(60):  # 10 min later the old retries no longer count
        step(world, detector, {0: "healthy", 1: "healthy"})
    [found] = step(world, detector, {0: "healthy", 1: "unhealthy"})
    assert found.evidence["decision"] == "retry"


def test_an_instruction_that_failed_or_did_not_hold_starts_a_new_decision() -> None:
    world = serving_world()
    detector = EngineFault(world.settings)
    [first] = step(world, detector, {1: "unhealthy"})
    [same] = step(world, detector, {1: "unhealthy"})
    assert same.fingerprint == first.fingerprint, "still waiting, within stuck_seconds: the same episode"
    [failed] = step(world, detector, {1: "unhealthy"}, error="[FT] Rejecting retry on engine 1: status is DEAD")
    assert failed.key == "job=9|fault=2" and "the last instruction failed: r1: [FT] Rejecting retry" in failed.seen
    for _ in range(4):
        [stuck] = step(world, detector, {1: "unhealthy"}, error="[FT] Rejecting retry on engine 1: status is DEAD")
    assert stuck.key == "job=9|fault=2", "the same error again is no new failure"
    [stuck] = step(world, detector, {1: "unhealthy"}, error="[FT] Rejecting retry on engine 1: status is DEAD")
    assert stuck.key == "job=9|fault=3", "still waiting 50 s after the decision (stuck_seconds 45): decided again"
    assert stuck.evidence["decision"] == "scale_down", "after two retries"


def test_the_waiting_ranks_of_a_job_are_one_incident_with_one_instruction() -> None:
    world = serving_world()
    detector = EngineFault(world.settings)
    [found] = step(world, detector, {0: "unhealthy", 1: "paused"})
    assert found.evidence["replicas"] == ["r0", "r1"] and found.subject.rank is None
    assert "2 engine core(s) of job 9 wait" in found.seen


def test_a_stale_status_is_not_judged() -> None:
    world = serving_world()
    detector = EngineFault(world.settings)
    step(world, detector, {1: "unhealthy"})
    world.advance(40.0)  # no report for 40 s: over fresh_seconds (30)
    assert world.evaluate(detector).findings == []
