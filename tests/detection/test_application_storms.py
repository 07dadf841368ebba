"""The hardware detector on application-class XIDs (catalog origin "application"): one finding per job for a
storm, counted; a finding per accelerator only for hardware-class faults; a probe when the fault follows the
accelerator from one job to another."""

from __future__ import annotations

from sentinel.detection.base import DETECTORS
from sentinel.detection.detectors import hardware  # noqa: F401 - registers the detector
from sentinel.live.faults import Fault
from sentinel.remediation import policy
from sentinel.telemetry.schemas import HardwareEvent, NodeReport
from tests.detection.streams import World


def report(world: World, node: str, events: list[HardwareEvent], seq: int = 1) -> NodeReport:
    return NodeReport(node=node, seq=seq, sent_at=world.now, interval_seconds=10.0, events=events)


def deliver(world: World, node: str, events: list[HardwareEvent]):  # type: ignore[no-untyped-def]
    """As the engine does: remember the faults (with the job on the accelerator), then ask the detector."""
    live = world.fleet.get(node)
    assert live is not None
    placed = world.assignments.get(live.id, [])
    for e in events:
        entry = world.ctx.catalog.lookup(e)
        if entry.severity != "info":
            job = next((t.job_id for t in placed if e.accelerator_uuid in t.accelerators), None)
            world.history.add(Fault(e.observed_at, node, e.accelerator_uuid, e.kind, e.xid, entry.severity, job))
    return DETECTORS["hardware"](world.settings).on_report(world.ctx, live, report(world, node, events), [])


def xid(world: World, uuid: str, code: int, count: int = 1) -> HardwareEvent:
    return HardwareEvent(kind="xid", accelerator_uuid=uuid, xid=code, observed_at=world.now, count=count)


def two_node_job(world: World) -> tuple[list[str], list[str]]:
    a, b = world.add_node("a", 2), world.add_node("b", 2)
    for rank, (node, uuid) in enumerate([("a", a[0]), ("a", a[1]), ("b", b[0]), ("b", b[1])]):
        world.place(7, rank, node, [uuid])
    return a, b


def test_an_application_storm_on_every_accelerator_of_a_job_is_one_counted_job_finding() -> None:
    world = World()
    a, b = two_node_job(world)
    first = deliver(world, "a", [xid(world, u, code, count=50) for u in a for code in (13, 43)])
    assert [f.key for f in first] == ["job=7|application"]
    assert first[0].occurrences == 200 and first[0].action == "restart_task" and first[0].layer == "software"
    world.advance(1)
    [second] = deliver(world, "b", [xid(world, u, 13) for u in b])
    assert second.fingerprint == first[0].fingerprint, "the other node's half is the same incident"
    assert second.evidence["accelerators"] == sorted(a + b) and second.evidence["nodes"] == ["a", "b"]
    assert "4 accelerator(s) of 2 node(s)" in second.title
    facts = policy.Facts(action=second.action, detector="hardware", job_id=second.subject.job_id)
    assert policy.decide(facts).flow == "restart_job", "it restarts the task, never takes anything out"


def test_a_hardware_class_xid_stays_the_accelerators_and_takes_it_out() -> None:
    world = World()
    a, _ = two_node_job(world)
    [finding] = deliver(world, "a", [xid(world, a[0], 48), xid(world, a[0], 48, count=9)])
    assert finding.key == f"node=a|accelerator={a[0]}|xid=48" and finding.occurrences == 10
    assert finding.action == "reset_accelerator" and finding.latched


def test_an_application_xid_without_a_task_opens_nothing_that_takes_it_out() -> None:
    world = World()
    a = world.add_node("a", 2)
    [finding] = deliver(world, "a", [xid(world, a[0], 13)])
    assert finding.action == "restart_task" and finding.subject.job_id is None
    assert policy.decide(policy.Facts(action=finding.action, detector="hardware", accelerator=a[0])).flow == "nothing"


def test_the_same_accelerator_under_another_job_corroborates_and_is_probed() -> None:
    world = World()
    a = world.add_node("a", 2)
    world.place(7, 0, "a", [a[0]])
    assert [f.key for f in deliver(world, "a", [xid(world, a[0], 31)])] == ["job=7|application"]
    world.assignments.clear()  # job 7 moved away; job 8 lands on the same accelerator
    world.advance(3600)
    world.place(8, 0, "a", [a[0]])
    found = {f.key: f for f in deliver(world, "a", [xid(world, a[0], 31)])}
    assert set(found) == {"job=8|application", f"node=a|accelerator={a[0]}|application"}
    suspect = found[f"node=a|accelerator={a[0]}|application"]
    assert suspect.action == "probe" and "job 7" in suspect.seen
    assert policy.decide(policy.Facts(action="probe", detector="hardware", accelerator=a[0])).flow == "probe"


def test_the_same_job_again_on_the_same_accelerator_is_not_corroboration() -> None:
    world = World()
    a = world.add_node("a", 2)
    world.place(7, 0, "a", [a[0]])
    deliver(world, "a", [xid(world, a[0], 13)])
    world.advance(60)
    assert [f.key for f in deliver(world, "a", [xid(world, a[0], 13)])] == ["job=7|application"]


def test_a_rank_that_dies_after_an_application_xid_is_the_jobs_fault_not_the_hardwares() -> None:
    from sentinel.detection.detectors import task_exit  # noqa: F401 - registers the detector
    from sentinel.jobs.service import ClosedTask
    from sentinel.telemetry.schemas import TaskExit

    world = World()
    a = world.add_node("a", 2)
    world.place(7, 0, "a", [a[0]])
    world.steps("a", 7, 0, [0.1] * 5)
    deliver(world, "a", [xid(world, a[0], 13)])
    world.advance(0.5)
    live = world.fleet.get("a")
    assert live is not None
    ended = NodeReport(node="a", seq=2, sent_at=world.now, interval_seconds=10.0,
                       task_exits=[TaskExit(job_id=7, rank=0, pid=1000, exit_code=1, observed_at=world.now)])
    [finding] = DETECTORS["task_exit"](world.settings).on_report(world.ctx, live, ended,
                                                                 [ClosedTask(7, 0, 1000, "exit:1")])
    assert finding.layer == "software" and "application XID 13" in finding.seen
    assert "the hardware is the likely cause" not in finding.seen
    world.advance(1)
    deliver(world, "a", [xid(world, a[0], 48)])  # a hardware-class fault, by contrast, is named as the cause
    [finding] = DETECTORS["task_exit"](world.settings).on_report(world.ctx, live, ended,
                                                                 [ClosedTask(7, 0, 1000, "exit:1")])
    assert finding.layer == "hardware"
