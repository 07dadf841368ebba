"""Checkpoint interval policies: Young/Daly as before, the learned one from the job's own nodes' risks, and the
recorder that keeps their recommendations (and a shadow's) without a row per scrape. On SQLite and PostgreSQL."""

from __future__ import annotations

import logging
import math

import pytest
from sqlalchemy import select
from sqlalchemy.orm import Session, sessionmaker

from sentinel.checkpoints.interval import CheckpointIntervalPolicy, IntervalAsk, YoungDaly, young_daly_seconds
from sentinel.clock import to_datetime
from sentinel.policy import decide
from sentinel.policy.interval import LearnedInterval
from sentinel.policy.models import PolicyDecision
from sentinel.policy.risk import NodeRisks
from sentinel.policy.scheduled import PendingDecisions, flush_decisions
from sentinel.policy.shadow import RecordingInterval
from tests.policy.conftest import NOW, add_incidents, add_nodes, incident
from tests.policy.hazard_models import hazard_model


def ask(stall: float | None = 30.0, mtbf: float | None = 86400.0, uuids: tuple[str, ...] = ("a-0", "a-1", "b-0"),
        at: float = NOW, job_id: int = 3) -> IntervalAsk:
    return IntervalAsk(job_id=job_id, stall_seconds=stall, mtbf_seconds=mtbf, accelerators=uuids, now=to_datetime(at))


class BrokenInterval(CheckpointIntervalPolicy):
    """Test double: a shadow with a bug."""

    name = "broken"

    def interval_seconds(self, session: Session, ask: IntervalAsk) -> float | None:
        raise ZeroDivisionError("a bug in the shadow")


@pytest.fixture
def fleet(sessions: sessionmaker[Session]) -> sessionmaker[Session]:
    """Nodes a and b (2 accelerators each) and c; b faulted twice this week."""
    add_nodes(sessions, {"a": 2, "b": 2, "c": 2})
    add_incidents(sessions, incident("b", days_ago=3, out_days=1), incident("b", days_ago=2, out_days=1.5))
    return sessions


def test_young_daly_is_the_formula_and_needs_a_save_and_a_failure(fleet: sessionmaker[Session]) -> None:
    with fleet() as session:
        assert YoungDaly().interval_seconds(session, ask()) == math.sqrt(2 * 30.0 * 86400.0)
        assert YoungDaly().interval_seconds(session, ask()) == young_daly_seconds(30.0, 86400.0)
        assert YoungDaly().interval_seconds(session, ask(stall=None)) is None
        assert YoungDaly().interval_seconds(session, ask(mtbf=None)) is None


def test_the_learned_interval_reads_the_risks_of_the_jobs_own_nodes(fleet: sessionmaker[Session]) -> None:
    model = hazard_model(interval_factor=0.8)
    with fleet() as session:
        risks = NodeRisks.load(session, model, to_datetime(NOW))
        choice = LearnedInterval(model).choose(session, ask())
        safe = LearnedInterval(model).choose(session, ask(uuids=("a-0", "c-1")))
        assert LearnedInterval(model).interval_seconds(session, ask(stall=None)) is None
        assert LearnedInterval(model).interval_seconds(session, ask(uuids=())) is None
    assert choice.seconds == decide.learned_interval_seconds(30.0, [risks.risk("a"), risks.risk("b")], 7.0,
                                                             model.params)
    assert safe.seconds is not None and choice.seconds is not None and choice.seconds < safe.seconds, \
        "a job on a risky node checkpoints more often"
    assert [n["node"] for n in choice.explanation["nodes"]] == ["a", "b"]
    assert choice.explanation["interval_factor"] == 0.8


def test_the_learned_interval_reads_the_fleet_once_per_ten_seconds(fleet: sessionmaker[Session]) -> None:
    """A scrape asks for every job: the history is read once and reused for 10 s, then read again (node c
    faulting in between moves the interval only after that)."""
    policy = LearnedInterval(hazard_model())
    on_c = ask(uuids=("c-0",))
    with fleet() as session:
        before = policy.interval_seconds(session, on_c)
    add_incidents(fleet, incident("c", days_ago=0.5, out_days=0.1))
    with fleet() as session:
        cached = policy.interval_seconds(session, ask(uuids=("c-0",), at=NOW + 9))
        fresh = policy.interval_seconds(session, ask(uuids=("c-0",), at=NOW + 11))
        back = LearnedInterval(hazard_model()).interval_seconds(session, ask(uuids=("c-0",), at=NOW + 9))
    assert before is not None and cached == before, "within 10 s: the same risks"
    assert fresh is not None and fresh < before, "after 10 s: c's new fault is read, it checkpoints more often"
    assert back is not None and back < before, "a policy that never read the fleet reads the fault at once"


def test_the_recorder_keeps_one_row_per_job_per_ten_minutes_unless_the_choice_changed(
        fleet: sessionmaker[Session]) -> None:
    pending = PendingDecisions()
    recorder = RecordingInterval(YoungDaly(), LearnedInterval(hazard_model()), {}, pending)
    assert recorder.name == "young-daly"
    with fleet() as session:
        first = recorder.interval_seconds(session, ask())
        assert first == YoungDaly().interval_seconds(session, ask()), "the active policy's answer, unchanged"
        for seconds in (10, 60, 590):  # scrapes: the same recommendation
            recorder.interval_seconds(session, ask(at=NOW + seconds))
        assert len(pending) == 1
        recorder.interval_seconds(session, ask(at=NOW + 600, job_id=4))  # another job
        recorder.interval_seconds(session, ask(stall=60.0, at=NOW + 620))  # a costlier save: a change
        recorder.interval_seconds(session, ask(stall=60.0, at=NOW + 630))
        recorder.interval_seconds(session, ask(stall=60.0, at=NOW + 1300))  # ten minutes on
    assert len(pending) == 4
    assert flush_decisions(fleet, pending) == 4 and len(pending) == 0 and flush_decisions(fleet, pending) == 0
    with fleet() as session:
        rows = list(session.scalars(select(PolicyDecision).order_by(PolicyDecision.id)))
    assert [(r.job_id, r.kind, r.active_policy, r.shadow_policy) for r in rows] == \
        [(3, "checkpoint_interval", "young-daly", "learned"), (4, "checkpoint_interval", "young-daly", "learned"),
         (3, "checkpoint_interval", "young-daly", "learned"), (3, "checkpoint_interval", "young-daly", "learned")]
    assert rows[0].active_choice == {"interval_seconds": first}
    assert rows[0].explanation["inputs"] == {"stall_seconds": 30.0, "mtbf_seconds": 86400.0, "accelerators": 3}
    assert {n["node"] for n in rows[0].explanation["shadow"]["nodes"]} == {"a", "b"}
    assert rows[0].agree is False, "a day's MTBF vs a week's risk: far apart"


def test_a_shadow_within_ten_percent_agrees(fleet: sessionmaker[Session]) -> None:
    pending = PendingDecisions()
    with fleet() as session:
        learned = LearnedInterval(hazard_model()).interval_seconds(session, ask())
        assert learned is not None
        mtbf = learned ** 2 / (2 * 30.0) * 1.1  # Young/Daly ≈ 5% longer than the learned interval
        RecordingInterval(YoungDaly(), LearnedInterval(hazard_model()), {}, pending).interval_seconds(
            session, ask(mtbf=mtbf))
    [row] = pending.take()
    assert row.agree is True


def test_a_broken_interval_shadow_is_counted_not_raised(fleet: sessionmaker[Session],
                                                        caplog: pytest.LogCaptureFixture) -> None:
    pending, errors = PendingDecisions(), {"detect": 2}
    with caplog.at_level(logging.WARNING, logger="sentinel.policy"), fleet() as session:
        got = RecordingInterval(YoungDaly(), BrokenInterval(), errors, pending).interval_seconds(session, ask())
        assert got == YoungDaly().interval_seconds(session, ask())
    assert errors == {"detect": 2, "checkpoint_interval:broken": 1}
    [row] = pending.take()
    assert row.shadow_choice == {"error": "ZeroDivisionError: a bug in the shadow"} and row.agree is False
    assert "shadow policy failed: kind=checkpoint_interval policy=broken job=3" in caplog.text


def test_an_active_learned_interval_is_recorded_without_a_shadow(fleet: sessionmaker[Session]) -> None:
    pending = PendingDecisions()
    with fleet() as session:
        RecordingInterval(LearnedInterval(hazard_model()), None, {}, pending).interval_seconds(session, ask())
    [row] = pending.take()
    assert (row.active_policy, row.shadow_policy, row.shadow_choice, row.agree) == ("learned", "", None, None)
    assert "active" in (row.explanation or {})
