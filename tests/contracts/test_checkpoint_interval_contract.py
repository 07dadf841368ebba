"""The checkpoint interval contract, run against every registered interval policy (young-daly, learned), on
SQLite and PostgreSQL: nothing to recommend before a save was measured, a positive number of seconds once the
save cost and the failures are known, and a costlier save never asks for checkpoints more often."""

from __future__ import annotations

from collections.abc import Callable, Iterator

import pytest
from sqlalchemy.orm import Session, sessionmaker

import sentinel.policy.interval  # noqa: F401  (registers "learned")
from sentinel.checkpoints.interval import INTERVAL_POLICIES, CheckpointIntervalPolicy, IntervalAsk, YoungDaly
from sentinel.clock import to_datetime
from sentinel.db import make_engine, make_sessionmaker, upgrade
from sentinel.policy.interval import LearnedInterval
from tests.contracts.conftest import implementations
from tests.policy.conftest import NOW, add_incidents, add_nodes, incident
from tests.policy.hazard_models import hazard_model

FACTORIES: dict[str, Callable[[], CheckpointIntervalPolicy]] = {
    "young-daly": YoungDaly,
    "learned": lambda: LearnedInterval(hazard_model()),
}


@pytest.fixture(params=implementations(INTERVAL_POLICIES))
def policy(request: pytest.FixtureRequest) -> CheckpointIntervalPolicy:
    return FACTORIES[request.param]()


@pytest.fixture
def sessions(database_url: str) -> Iterator[sessionmaker[Session]]:
    upgrade(database_url)
    engine = make_engine(database_url)
    factory = make_sessionmaker(engine)
    add_nodes(factory, {"a": 2, "b": 2})
    add_incidents(factory, incident("b", days_ago=3, out_days=1))
    yield factory
    engine.dispose()


def ask(stall: float | None) -> IntervalAsk:
    return IntervalAsk(job_id=1, stall_seconds=stall, mtbf_seconds=3 * 86400.0, accelerators=("a-0", "b-0"),
                       now=to_datetime(NOW))


def test_nothing_to_recommend_before_a_save_was_measured(policy: CheckpointIntervalPolicy,
                                                         sessions: sessionmaker[Session]) -> None:
    with sessions() as session:
        assert policy.interval_seconds(session, ask(None)) is None


def test_a_recommendation_is_seconds_and_grows_with_the_save_cost(policy: CheckpointIntervalPolicy,
                                                                  sessions: sessionmaker[Session]) -> None:
    with sessions() as session:
        cheap, costly = policy.interval_seconds(session, ask(5.0)), policy.interval_seconds(session, ask(50.0))
    assert cheap is not None and costly is not None and 0 < cheap < costly
    assert policy.name in INTERVAL_POLICIES
