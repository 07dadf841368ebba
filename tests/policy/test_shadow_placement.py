"""Shadow mode for placement, on SQLite and PostgreSQL: each decision is recorded with what the shadow would
have done and whether they agree; the shadow never changes the outcome, and a broken one is logged, counted
and recorded instead of raised (even a failed SQL statement: the active's transaction goes on)."""

from __future__ import annotations

import logging
from datetime import datetime

import pytest
from sqlalchemy import select, text
from sqlalchemy.orm import Session, sessionmaker

from sentinel.clock import to_datetime
from sentinel.db import transaction
from sentinel.policy.models import PolicyDecision
from sentinel.policy.placement import LearnedPlacement
from sentinel.policy.shadow import RecordingPlacement
from sentinel.remediation.placement import (
    BestFitSameModel,
    Inventory,
    NoCapacity,
    Placement,
    PlacementPolicy,
    PlacementRequest,
    Slot,
)
from tests.policy.conftest import NOW, add_incidents, incident
from tests.policy.hazard_models import hazard_model

MOVE_BOTH = PlacementRequest(5, {0: ["a-0"], 1: ["a-1"]}, frozenset({0, 1}))


class BrokenPlacement(PlacementPolicy):
    """Test double: a shadow with a bug."""

    name = "broken"

    def place(self, request: PlacementRequest, inventory: Inventory) -> Placement:
        raise RuntimeError("a bug in the shadow")


class BrokenQueryPlacement(BestFitSameModel):
    """Test double: a shadow whose read fails in the database (on PostgreSQL that would end the transaction)."""

    name = "broken-query"

    def prepare(self, session: Session, now: datetime, *, incident_id: int | None = None) -> PlacementPolicy:
        session.execute(text("SELECT * FROM no_such_table"))
        return self


def inventory(free: dict[str, int]) -> Inventory:
    slots = {f"a-{i}": Slot(f"a-{i}", "a", i, "h100", 80 * 2**30) for i in range(2)}
    slots |= {f"{n}-{i}": Slot(f"{n}-{i}", n, i, "h100", 80 * 2**30) for n, k in free.items() for i in range(k)}
    return Inventory(slots=slots, free={u for u in slots if not u.startswith("a-")})


def decide(sessions: sessionmaker[Session], policy: RecordingPlacement, request: PlacementRequest = MOVE_BOTH,
           free: dict[str, int] | None = None) -> tuple[Placement, list[str]]:
    with transaction(sessions) as session:
        placer = policy.prepare(session, to_datetime(NOW), incident_id=42)
        out = placer.place(request, inventory(free or {"b": 2, "c": 2}))
        return out, placer.explanation()


def decisions(sessions: sessionmaker[Session]) -> list[PolicyDecision]:
    with sessions() as session:
        return list(session.scalars(select(PolicyDecision).order_by(PolicyDecision.id)))


def test_a_learned_shadow_that_disagrees_is_recorded_and_explained(sessions: sessionmaker[Session]) -> None:
    add_incidents(sessions, incident("b", days_ago=3, out_days=1), incident("b", days_ago=2, out_days=1.5))
    errors: dict[str, int] = {}
    out, lines = decide(sessions, RecordingPlacement(BestFitSameModel(), LearnedPlacement(hazard_model()), errors))
    assert out == BestFitSameModel().place(MOVE_BOTH, inventory({"b": 2, "c": 2})), "the active decides, alone"
    assert {n for n, _ in out.values()} == {"b"}
    [row] = decisions(sessions)
    assert (row.kind, row.job_id, row.incident_id, row.active_policy, row.shadow_policy, row.agree) == \
        ("placement", 5, 42, "best-fit", "learned", False)
    assert row.active_choice == {"ranks": {"0": {"node": "b", "accelerators": ["b-0"]},
                                           "1": {"node": "b", "accelerators": ["b-1"]}}}
    assert {r["node"] for r in (row.shadow_choice or {})["ranks"].values()} == {"c"}
    assert row.explanation["shadow"]["avoided"]["node"] == "b" and "active" not in row.explanation
    assert row.at == to_datetime(NOW) and errors == {}
    [line] = lines
    assert line.startswith("shadow learned would have placed ranks 0, 1 → c (risk 0.02: ")
    assert "; avoided b (risk 0.98: faults_7d=2, faults_30d=2); best-fit placed ranks 0, 1 → b (risk 0.98)" in line


def test_a_shadow_that_agrees_is_recorded_as_agreeing(sessions: sessionmaker[Session]) -> None:
    out, lines = decide(sessions, RecordingPlacement(BestFitSameModel(), LearnedPlacement(hazard_model()), {}))
    [row] = decisions(sessions)
    assert row.agree is True and {n for n, _ in out.values()} == {"b"}
    assert lines[0].endswith("best-fit placed ranks 0, 1 → b (risk 0.02) (they agree)")


def test_the_active_learned_policy_is_recorded_and_explained_without_a_shadow(sessions: sessionmaker[Session]) -> None:
    add_incidents(sessions, incident("b", days_ago=3, out_days=1), incident("b", days_ago=2, out_days=1.5))
    out, lines = decide(sessions, RecordingPlacement(LearnedPlacement(hazard_model()), None, {}))
    assert {n for n, _ in out.values()} == {"c"}
    [row] = decisions(sessions)
    assert (row.active_policy, row.shadow_policy, row.shadow_choice, row.agree) == ("learned", "", None, None)
    assert row.explanation["active"]["chosen"][0]["node"] == "c"
    assert lines == [lines[0]] and lines[0].startswith("placement (learned): ranks 0, 1 → c (risk 0.02")


def test_best_fit_beside_an_active_learned_policy_says_what_it_would_have_done(sessions: sessionmaker[Session]) -> None:
    add_incidents(sessions, incident("b", days_ago=3, out_days=1), incident("b", days_ago=2, out_days=1.5))
    _, lines = decide(sessions, RecordingPlacement(LearnedPlacement(hazard_model()), BestFitSameModel(), {}))
    assert lines[0].startswith("placement (learned): ranks 0, 1 → c")
    assert lines[1].startswith("shadow best-fit would have placed ranks 0, 1 → b (risk 0.98); learned placed "
                               "ranks 0, 1 → c (risk 0.02")
    assert decisions(sessions)[0].agree is False


@pytest.mark.parametrize("shadow", [BrokenPlacement(), BrokenQueryPlacement()], ids=["raises", "sql-fails"])
def test_a_broken_shadow_is_counted_and_never_raised(sessions: sessionmaker[Session], shadow: PlacementPolicy,
                                                     caplog: pytest.LogCaptureFixture) -> None:
    errors: dict[str, int] = {}
    with caplog.at_level(logging.WARNING, logger="sentinel.policy"):
        out, lines = decide(sessions, RecordingPlacement(BestFitSameModel(), shadow, errors))
    assert out == BestFitSameModel().place(MOVE_BOTH, inventory({"b": 2, "c": 2})) and lines == []
    assert errors == {f"placement:{shadow.name}": 1}
    [warning] = [r for r in caplog.records if r.levelno >= logging.WARNING]
    assert warning.getMessage().startswith(f"shadow policy failed: kind=placement policy={shadow.name} job=5 "
                                           "incident=42 ") and "\n" not in warning.getMessage()
    [row] = decisions(sessions)  # committed with the active's transaction
    assert row.agree is False and "error" in (row.shadow_choice or {})


def test_no_capacity_is_recorded_and_still_raised(sessions: sessionmaker[Session]) -> None:
    policy = RecordingPlacement(BestFitSameModel(), LearnedPlacement(hazard_model()), {})
    with pytest.raises(NoCapacity), transaction(sessions) as session:
        policy.prepare(session, to_datetime(NOW)).place(MOVE_BOTH, inventory({"b": 1}))
    assert decisions(sessions) == [], "the caller's transaction rolled back, its record with it"
    with sessions() as session, session.begin():
        placer = policy.prepare(session, to_datetime(NOW))
        with pytest.raises(NoCapacity):
            placer.place(MOVE_BOTH, inventory({"b": 1}))
    [row] = decisions(sessions)
    assert "no_capacity" in row.active_choice and "no_capacity" in (row.shadow_choice or {}) and row.agree is True


def test_a_restart_in_place_records_nothing(sessions: sessionmaker[Session]) -> None:
    request = PlacementRequest(5, {0: ["a-0"], 1: ["a-1"]}, frozenset())
    out, lines = decide(sessions, RecordingPlacement(LearnedPlacement(hazard_model()), BestFitSameModel(), {}),
                        request)
    assert out == {0: ("a", ["a-0"]), 1: ("a", ["a-1"])} and lines == [] and decisions(sessions) == []
