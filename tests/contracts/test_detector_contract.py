"""The Detector contract (sentinel/detection/base.py), run against every detector `load_detectors` registers.

What the engine, the incident lifecycle and remediation rely on from each: it is registered under its name
and documented; on an empty fleet it finds nothing, raises nothing and writes nothing; its true-positive
scenario (tests/detection/scenarios.py, on a real DetectionContext and live views) fires with dense feedback
(DESIGN §5) and a recommended action remediation can carry out; the same condition keeps its fingerprint and
two subjects get two; the same input gives the same findings; and once the condition clears its incident can
end (`holds` says False, or the finding is latched and waits for a person). Each detector's own behaviour is
tested in tests/detection/. A detector registered without scenarios fails here rather than being skipped.
"""

from __future__ import annotations

import dataclasses
import json
import math
from collections.abc import Callable
from typing import Any

import pytest
from sqlalchemy import String

from sentinel.config import Settings
from sentinel.detection.base import DETECTORS, DetectionContext, Detector
from sentinel.detection.catalog import FaultCatalog
from sentinel.detection.engine import load_detectors
from sentinel.incidents.findings import SEVERITY_ORDER, Finding, OpenIncident, Subject
from sentinel.incidents.models import LAYERS, Incident
from sentinel.live.fleet import NodeLive
from sentinel.remediation import policy
from sentinel.telemetry.schemas import NodeReport
from tests.contracts.conftest import implementations
from tests.detection import diagnosis_scenarios, engine_fault_scenarios, network_scenarios, scenarios
from tests.detection.scenarios import Outcome, Stream
from tests.detection.streams import START, GiB, World, assert_dense, fired


def column_chars(column: str) -> int:
    """How many characters the incident row keeps of a finding's field (a String column's length)."""
    kind = Incident.__table__.c[column].type
    assert isinstance(kind, String) and kind.length
    return kind.length


load_detectors(Settings())  # the built-ins and any `sentinel.detectors` plugin register themselves on import
NAMES = sorted(DETECTORS)
PERIODIC = sorted(name for name, cls in DETECTORS.items() if cls.periodic)
TITLE_CHARS, FINGERPRINT_CHARS = column_chars("title"), column_chars("fingerprint")  # 512, 255
DETECTOR_CHARS = column_chars("detector")
EVIDENCE_CHARS = 20_000  # as streams.assert_dense: serialisable and compact
UNRELATED = Subject(node="node-elsewhere", accelerator="GPU-elsewhere-0", job_id=424242, rank=0)

# One true positive per detector: the condition on one subject, seen more than once.
TRUE_POSITIVES: dict[str, Callable[[], Outcome]] = {
    "allreduce_spike": scenarios.allreduce_spike,
    "checkpoint_stale": scenarios.checkpoint_stale,
    "hang": scenarios.hang,
    "hardware": scenarios.hardware,
    "heartbeat": scenarios.heartbeat,
    "lemon": scenarios.lemon,
    "memory": scenarios.leak,
    "mfu_drop": scenarios.mfu_drop,
    "nic_counters": network_scenarios.symbol_errors,
    "probe_mesh": network_scenarios.slow_links,
    "serving_stall": scenarios.serving_stall,
    "bad_completion": scenarios.bad_completion,
    "engine_fault": engine_fault_scenarios.engine_fault,
    "kv_transfer": scenarios.kv_transfer,
    "queue_growth": scenarios.queue_growth,
    "slo_burn": scenarios.slo_burn,
    "slowdown": diagnosis_scenarios.slowdown,
    "straggler": scenarios.straggler,
    "task_exit": scenarios.task_exit,
    "throttle": scenarios.throttle,
}
# The same condition on two subjects at once.
TWO_SUBJECTS: dict[str, Callable[[], Outcome]] = {
    "allreduce_spike": lambda: scenarios.two_jobs(DETECTORS["allreduce_spike"], lambda t, rank: 1.0,
                                                  share=lambda t: 0.5 if t > 35 * 60 else 0.15, seconds=38 * 60),
    "checkpoint_stale": scenarios.checkpoint_stale_pair,
    "hang": lambda: scenarios.hang(jobs=(2, 3)),
    "hardware": lambda: scenarios.hardware(faults=(("node-x", 3, 79), ("node-y", 1, 48))),
    "heartbeat": lambda: scenarios.heartbeat(silent=("node-1", "node-2")),
    "lemon": scenarios.lemon_pair,
    "memory": scenarios.memory_pair,
    "mfu_drop": lambda: scenarios.two_jobs(DETECTORS["mfu_drop"], lambda t, rank: 1.5 if t > 35 * 60 else 1.0),
    "nic_counters": lambda: network_scenarios.symbol_errors(nodes=("node-x", "node-y")),
    "probe_mesh": lambda: network_scenarios.slow_links(links=((1, 2), (4, 5)), nodes=8),
    "serving_stall": lambda: scenarios.serving_stall(replicas=("d1", "d2")),
    "bad_completion": lambda: scenarios.bad_completion(replicas=("d1", "d2")),
    "engine_fault": lambda: engine_fault_scenarios.engine_fault(jobs=(9, 10)),
    "kv_transfer": lambda: scenarios.kv_transfer(replicas=("d1", "d2")),
    "queue_growth": lambda: scenarios.queue_growth(replicas=("d1", "d2")),
    "slo_burn": lambda: scenarios.slo_burn(failing=(9, 10)),
    "slowdown": diagnosis_scenarios.two_jobs,
    "straggler": lambda: scenarios.two_jobs(DETECTORS["straggler"], lambda t, rank: 1.5 if rank else 1.0, seconds=120),
    "task_exit": lambda: scenarios.task_exit(jobs=(6, 8)),
    "throttle": scenarios.throttle_pair,
}
# The condition fires, then clears before the stream ends (an event: nothing more is seen).
CLEARS: dict[str, Callable[[], Outcome]] = {
    "allreduce_spike": lambda: scenarios.allreduce_spike(spike_for=5 * 60, seconds=45 * 60),
    "checkpoint_stale": lambda: scenarios.checkpoint_stale(stop_at=300.0, resume_at=600.0),
    "hang": lambda: scenarios.hang(resume_at=170.0),
    "hardware": lambda: scenarios.hardware(repeats=1),
    "heartbeat": lambda: scenarios.heartbeat(back_at=130.0, seconds=150.0),
    "lemon": scenarios.lemon_ages_out,
    "memory": lambda: scenarios.memory(lambda i: 30 * GiB + i * 0.5 * GiB if i < 30 else 20 * GiB, samples=40),
    "mfu_drop": scenarios.mfu_drop_recovers,
    "nic_counters": lambda: network_scenarios.symbol_errors(growing=lambda t: t <= 100, seconds=600.0),
    "probe_mesh": lambda: network_scenarios.slow_links(until=lambda t: t <= 60, seconds=200.0),
    "serving_stall": lambda: scenarios.serving_stall(resume_at=100.0, seconds=150.0),
    "bad_completion": lambda: scenarios.bad_completion(fixed_at=100.0, seconds=150.0),
    "engine_fault": lambda: engine_fault_scenarios.engine_fault(fixed_at=90.0, seconds=130.0),
    "kv_transfer": lambda: scenarios.kv_transfer(fixed_at=1100.0, seconds=1300.0),
    "queue_growth": lambda: scenarios.queue_growth(fixed_at=160.0, seconds=300.0),
    "slo_burn": lambda: scenarios.slo_burn(recover_at=700.0, seconds=1500.0),
    "slowdown": diagnosis_scenarios.clears,
    "straggler": lambda: scenarios.straggler(slow=lambda t: 1.5 if t <= 120 else 1.0, seconds=480.0),
    "task_exit": lambda: scenarios.task_exit(restart_at=90.0, seconds=120.0),
    "throttle": lambda: scenarios.throttle(pattern=[False] * 4 + [True] * 8 + [False] * 4),
}
SCENARIOS = {"true-positive": TRUE_POSITIVES, "two-subject": TWO_SUBJECTS, "clearing": CLEARS}


def known_gap(reason: str, *names: str, raises: type[Exception] = AssertionError
              ) -> dict[str, list[pytest.MarkDecorator]]:
    """A contract point a detector does not meet yet (a bug to fix in sentinel/, not here): strict and bound to
    the failure it causes, so the test fails once the detector is fixed, or if it fails some other way."""
    return {name: [pytest.mark.xfail(strict=True, raises=raises, reason=f"{name}: {reason}")] for name in names}


NO_EVIDENCE_WINDOW = known_gap(
    "periodic (statistical), but its evidence has no metric window (evidence['window']) to show what was seen",
    "hang", "heartbeat", raises=KeyError)


def scenario(kind: str, name: str) -> Outcome:
    """A fresh run of the detector's scenario of this kind; a registered detector without one fails."""
    build = SCENARIOS[kind].get(name)
    if build is None:
        pytest.fail(f"detector {name!r} is registered but has no {kind} scenario: add one to "
                    "tests/detection/scenarios.py and to this suite's tables")
    return build()


def at(elapsed: float) -> float:
    """A stream's elapsed seconds as the fake clock's time (every scenario's world starts at START)."""
    return START + elapsed


def incident_of(finding: Finding, opened_at: float) -> OpenIncident:
    """The engine's view of the incident this finding opened."""
    return OpenIncident(id=1, fingerprint=finding.fingerprint, detector=finding.detector, latched=finding.latched,
                        subject=finding.subject, opened_at=opened_at)


def empty_world() -> World:
    world = World()
    world.ctx.catalog = FaultCatalog.load()
    return world


def node_live(name: str = "node-0", now: float = START) -> NodeLive:
    return NodeLive(id=1, name=name, state="active", admin_state="active", interval_seconds=10.0, last_seq=0,
                    last_seen=now)


def remediation_facts(finding: Finding) -> policy.Facts:
    """What remediation would decide on for the incident this finding opens (remediation/engine.py _facts)."""
    return policy.Facts(action=finding.action, detector=finding.detector, node=finding.subject.node,
                        accelerator=finding.subject.accelerator, job_id=finding.subject.job_id,
                        wide_nodes=tuple(finding.evidence.get("nodes", ())))


def check_dense(finding: Finding, name: str, now: float, *, fleet_wide: bool = False) -> None:
    """DESIGN §5 and what the incident row, the notifiers and remediation take from a finding."""
    assert finding.detector == name
    assert finding.severity in SEVERITY_ORDER, finding.severity
    assert finding.layer in LAYERS, finding.layer
    assert finding.key and len(f"{finding.detector}|{finding.key}") <= FINGERPRINT_CHARS, "the fingerprint is whole"
    assert finding.title and "\n" not in finding.title and len(finding.title) <= TITLE_CHARS, finding.title
    assert (finding.subject == Subject()) == fleet_wide, f"names what it is about: {finding.subject}"
    assert any(ch.isdigit() for ch in finding.seen), f"what was seen, with the numbers: {finding.seen!r}"
    assert finding.comparison, "compared with what"
    assert finding.next_steps and all(isinstance(s, str) and s.strip() for s in finding.next_steps)
    assert finding.action in policy.DECISIONS, finding.action
    assert isinstance(finding.latched, bool)
    assert finding.observed_at is not None and math.isfinite(finding.observed_at)
    assert finding.observed_at <= now, "observed in the future"
    assert isinstance(finding.evidence, dict)
    assert len(json.dumps(finding.evidence, allow_nan=False)) < EVIDENCE_CHARS, "strict JSON, compact"
    window: dict[str, Any] | None = finding.evidence.get("window")
    if window is not None:  # the metric window, where there is one: bounded, times relative to now
        assert window["metric"] and 0 < len(window["times"]) == len(window["values"]) <= 60
        assert all(t <= 0 for t in window["times"])


def check_actionable(finding: Finding) -> None:
    """Remediation can carry out the recommended action with what the finding names (remediation/policy.py)."""
    if finding.action != "record":
        assert policy.decide(remediation_facts(finding)) != policy.NOTHING, \
            f"{finding.action!r} cannot be carried out with what the finding names: {finding.subject}"


# -- 1. registered and documented ------------------------------------------------------------------------------------

@pytest.mark.parametrize("name", implementations(NAMES))
def test_registered_under_its_name_and_loaded_by_the_engine(name: str):
    cls = DETECTORS[name]
    assert issubclass(cls, Detector) and cls.name == name and len(name) <= DETECTOR_CHARS
    # the engine evaluates a detector only if it is periodic, and hands reports to all: each must do one
    evaluates, reads_reports = cls.evaluate is not Detector.evaluate, cls.on_report is not Detector.on_report
    assert cls.periodic == evaluates, "periodic exactly when it overrides evaluate()"
    assert evaluates or reads_reports
    detector = cls(Settings())
    assert detector.name == name and detector.cadence >= 0
    assert name in [d.name for d in load_detectors(Settings())]
    assert name not in [d.name for d in load_detectors(Settings(disabled_detectors=[name]))]


@pytest.mark.parametrize("name", implementations(NAMES))
def test_documented_with_its_options(name: str):
    """With test_registered_...: test_detector_feedback.py's test_registered_periodic_and_documented, over all."""
    cls = DETECTORS[name]
    doc = cls.__dict__.get("__doc__")  # its own: a class without one does not inherit Detector's
    assert doc and doc.strip(), "says what it watches and why"
    if cls.periodic:
        assert "Options (defaults)" in doc


@pytest.mark.parametrize("name", implementations(NAMES))
def test_has_a_scenario_of_each_kind(name: str):
    missing = [kind for kind, table in SCENARIOS.items() if name not in table]
    assert missing == [], f"{name}: no {', '.join(missing)} scenario"


# -- 2. nothing from nothing ----------------------------------------------------------------------------------------

@pytest.mark.parametrize("name", implementations(NAMES))
def test_an_empty_fleet_gives_no_findings(name: str):
    world = empty_world()
    detector = DETECTORS[name](world.settings)
    evaluation = detector.evaluate(world.ctx, world.now)
    assert evaluation.findings == [] and evaluation.subjects >= 0
    report = NodeReport(node="node-0", seq=1, sent_at=world.now)
    assert detector.on_report(world.ctx, node_live(now=world.now), report, []) == []
    answer = detector.holds(world.ctx, incident_of(_unrelated(name), world.now - 60), world.now)
    assert answer is None or isinstance(answer, bool)


@pytest.mark.parametrize("name", implementations(NAMES))
def test_holds_for_an_unrelated_incident_answers_without_raising(name: str):
    world, detector, _ = scenario("true-positive", name)
    answer = detector.holds(world.ctx, incident_of(_unrelated(name), world.now - 60), world.now)
    assert answer is None or isinstance(answer, bool)
    if detector.periodic:
        assert answer is False, "not among the conditions that held at the last evaluation"


@pytest.mark.parametrize("name", implementations(NAMES))
def test_reading_an_empty_context_writes_nothing(name: str):
    world = empty_world()
    detector = DETECTORS[name](world.settings)
    detector.evaluate(world.ctx, world.now)
    detector.on_report(world.ctx, node_live(now=world.now), NodeReport(node="node-0", seq=1, sent_at=world.now), [])
    detector.holds(world.ctx, incident_of(_unrelated(name), world.now - 60), world.now)
    assert _contents(world.ctx) == _contents(empty_world().ctx)


def _unrelated(name: str) -> Finding:
    return Finding(detector=name, key="contract=unrelated", severity="warning", title="unrelated", layer="unknown",
                   subject=UNRELATED, seen="seen 0 times")


def _contents(ctx: DetectionContext) -> dict[str, Any]:
    assert ctx.checkpoints is not None
    return {"nodes": ctx.fleet.all(), "jobs": ctx.jobs.job_ids(), "samples": ctx.samples.uuids(),
            "faults": ctx.history.recent(ctx.clock.time()), "placed": ctx.assignments(),
            "checkpoints": ctx.checkpoints.job_ids()}


# -- 3. a true positive, with dense feedback ------------------------------------------------------------------------

@pytest.mark.parametrize("name", implementations(NAMES))
def test_its_true_positive_fires_with_dense_feedback(name: str):
    _, _, stream = scenario("true-positive", name)
    found = fired(stream)
    assert found, f"{name}: its true-positive scenario fires"
    for elapsed, finding in found:
        check_dense(finding, name, at(elapsed))
        check_actionable(finding)


@pytest.mark.parametrize("name", implementations(NAMES))
def test_its_findings_on_two_subjects_are_dense_and_actionable(name: str):
    _, _, stream = scenario("two-subject", name)
    found = fired(stream)
    assert found
    for elapsed, finding in found:
        check_dense(finding, name, at(elapsed))
    for _, finding in found:
        check_actionable(finding)


def fleet_wide(name: str) -> tuple[Finding, list[Finding], float]:
    """The detector's one finding for its two-subject scenario's last round, as if they were many at once."""
    _, detector, stream = scenario("two-subject", name)
    elapsed, evaluation = max((entry for entry in stream if len(entry[1].findings) >= 2), key=lambda e: e[0])
    wide = detector.fleet_wide(evaluation.findings, max(evaluation.subjects, len(evaluation.findings)))
    return wide, evaluation.findings, at(elapsed)


# the engine collapses what evaluate() finds (DetectionEngine._collapse); findings from reports are never collapsed
@pytest.mark.parametrize("name", implementations(PERIODIC))
def test_many_subjects_at_once_make_one_dense_fleet_wide_finding(name: str):
    wide, findings, now = fleet_wide(name)
    assert wide.key == "fleet-wide" and wide.action == "page"
    assert wide.fingerprint not in {f.fingerprint for f in findings}
    assert SEVERITY_ORDER[wide.severity] >= max(SEVERITY_ORDER[f.severity] for f in findings)
    check_dense(wide, name, now, fleet_wide=True)


@pytest.mark.parametrize("name", implementations(PERIODIC))
def test_a_fleet_wide_finding_names_the_nodes_remediation_needs(name: str):
    wide, findings, _ = fleet_wide(name)
    check_actionable(wide)
    assert {f.subject.node for f in findings if f.subject.node} <= set(wide.evidence["nodes"])


@pytest.mark.parametrize("name", implementations(PERIODIC, marks=NO_EVIDENCE_WINDOW))
def test_findings_carry_comparison_evidence_and_next_steps(name: str):
    """Moved from tests/detection/test_detector_feedback.py, assertions unchanged; now over every periodic one."""
    _, detector, stream = scenario("true-positive", name)
    found = fired(stream)
    assert found, f"{name}: its true-positive stream fires"
    for _, finding in found:
        assert finding.detector == name
        assert_dense(finding)
    # what the engine keys incidents on: stable across evaluations of the same condition
    assert len({f.fingerprint for _, f in found}) == 1
    assert detector.active == {found[-1][1].fingerprint}
    assert stream[-1][1].subjects >= 1


# -- 4. fingerprints: one per condition ------------------------------------------------------------------------------

@pytest.mark.parametrize("name", implementations(NAMES))
def test_the_same_condition_seen_again_keeps_its_fingerprint(name: str):
    world, detector, stream = scenario("true-positive", name)
    found = [finding for _, finding in fired(stream)]
    if detector.periodic:  # and evaluated once more, a round later, with the condition still there
        world.advance(max(detector.cadence, 10.0))
        found += world.evaluate(detector).findings
    assert len(found) >= 2, "seen more than once"
    assert len({f.fingerprint for f in found}) == 1, sorted({f.fingerprint for f in found})


@pytest.mark.parametrize("name", implementations(NAMES))
def test_different_subjects_get_different_fingerprints(name: str):
    _, _, stream = scenario("two-subject", name)
    for _, evaluation in stream:
        fingerprints = [f.fingerprint for f in evaluation.findings]
        assert len(set(fingerprints)) == len(fingerprints), f"two findings would share one incident: {fingerprints}"
    # two conditions, one fingerprint each: none that ignores the subject, none that changes as it is seen again
    assert len({f.fingerprint for _, f in fired(stream)}) == 2, sorted({f.fingerprint for _, f in fired(stream)})


# -- 5. deterministic ------------------------------------------------------------------------------------------------

@pytest.mark.parametrize("name", implementations(NAMES))
def test_the_same_input_gives_the_same_findings(name: str):
    first: Stream = scenario("true-positive", name)[2]
    again: Stream = scenario("true-positive", name)[2]
    assert fired(first), "compares something"
    assert again == first


# -- 6. incidents can end --------------------------------------------------------------------------------------------

@pytest.mark.parametrize("name", implementations(NAMES))
def test_holds_while_the_condition_holds(name: str):
    world, detector, stream = scenario("true-positive", name)
    found = fired(stream)
    assert found
    last = found[-1][1]
    answer = detector.holds(world.ctx, incident_of(last, at(found[0][0])), world.now)
    assert answer is (None if last.latched else True), "a latched incident waits; an open condition still holds"


@pytest.mark.parametrize("name", implementations(NAMES))
def test_once_the_condition_clears_its_incident_can_end(name: str):
    """Auto-resolution needs holds() False; a finding that waits for a person or remediation says latched."""
    world, detector, stream = scenario("clearing", name)
    found = fired(stream)
    assert found, "the condition held first"
    assert stream[-1][1].findings == [], "and cleared before the scenario ended"
    for _, finding in found:
        answer = detector.holds(world.ctx, incident_of(finding, at(found[0][0])), world.now)
        assert answer is (None if finding.latched else False), \
            f"{finding.fingerprint}: latched={finding.latched}, holds() says {answer}"


# -- the checks above can fail -----------------------------------------------------------------------------------------

GOOD = Finding(detector="straggler", key="job=1|rank=2", severity="warning", title="job 1 rank 2 is slow",
               layer="compute", subject=Subject(node="node-a", accelerator="GPU-a-2", job_id=1, rank=2),
               seen="median 1.5 s vs 1.0 s", comparison="peer ranks", next_steps=["look"], action="probe",
               evidence={"window": {"metric": "step_seconds", "times": [-1.0], "values": [1.5]}},
               observed_at=START - 1)


THIN: dict[str, dict[str, Any]] = {
    "another-detector": {"detector": "other"}, "unknown-severity": {"severity": "fatal"},
    "unknown-layer": {"layer": "network"}, "no-title": {"title": ""}, "two-line-title": {"title": "two\nlines"},
    "long-title": {"title": "x" * (TITLE_CHARS + 1)}, "truncated-fingerprint": {"key": "k" * FINGERPRINT_CHARS},
    "no-subject": {"subject": Subject()},
    "seen-without-numbers": {"seen": "slow"}, "no-comparison": {"comparison": ""}, "no-next-steps": {"next_steps": []},
    "blank-next-step": {"next_steps": [" "]}, "unknown-action": {"action": "reboot_everything"},
    "probe-without-accelerator": {"subject": Subject(job_id=1)}, "never-observed": {"observed_at": None},
    "observed-in-the-future": {"observed_at": START + 1}, "nan-evidence": {"evidence": {"x": float("nan")}},
    "huge-evidence": {"evidence": {"x": "y" * EVIDENCE_CHARS}}, "opaque-evidence": {"evidence": {"x": object()}},
    "window-in-the-future": {"evidence": {"window": {"metric": "m", "times": [1.0], "values": [1.0]}}},
    "window-too-long": {"evidence": {"window": {"metric": "m", "times": [-1.0] * 61, "values": [1.0] * 61}}},
}


@pytest.mark.parametrize("broken", THIN.values(), ids=THIN.keys())
def test_the_checks_refuse_a_thin_or_unactionable_finding(broken: dict[str, Any]):
    check_dense(GOOD, "straggler", START)  # control
    check_actionable(GOOD)
    thin = dataclasses.replace(GOOD, **broken)
    with pytest.raises((AssertionError, TypeError, ValueError)):
        check_dense(thin, "straggler", START)
        check_actionable(thin)
