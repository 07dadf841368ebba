"""The Executor contract (sentinel/remediation/executors/base.py), run against every executor in `EXECUTORS`.

What the remediation engine relies on, each checked in the executor's own world: it is registered by name and
handles some of ACTION_KINDS; a valid action of each kind it handles is ok, in one short line naming what it
acted on; the world then shows it done; the same action again is ok and changes nothing; an action naming what
its world does not know is refused (ok=False, a reason) and changes nothing; with its world away it does not
raise and says what went wrong. The worlds are real where they can run here (Slurm daemons, local processes,
a loopback webhook and long-pollers) and the in-tree Kubernetes API double elsewhere.

Each implementation has a harness (executor_worlds.py) that builds the executor in its world and answers
world questions; what a point cannot mean for it is declared there (`Unknown.refused`, `Away.still_ok`), and
a bug found and not yet fixed is a declared strict xfail (`known_bugs`): the test fails again once it is fixed.
Each implementation's own behaviour is tested in tests/remediation/ and tests/auth/test_webhook_signatures.py.
"""

from __future__ import annotations

import importlib.util
import logging
from collections.abc import Iterator
from pathlib import Path

import pytest

from sentinel.remediation.executors.base import ACTION_KINDS, EXECUTORS, Executor, Outcome
from sentinel.remediation.executors.launcher import OrderBoard
from tests.contracts.conftest import implementations
from tests.contracts.executor_worlds import DETAIL_MAX_CHARS, HARNESSES, Harness, LongPollers, wait_until
from tests.remediation.slurm_cluster import SlurmCluster, running_cluster

needs_client = pytest.mark.skipif(importlib.util.find_spec("kubernetes") is None,
                                  reason="the [kubernetes] extra is not installed")
CLIENT_MARKS: dict[str, list[pytest.MarkDecorator]] = {"kubernetes": [needs_client]}
WORLD_MARKS: dict[str, list[pytest.MarkDecorator]] = {**CLIENT_MARKS, "slurm": [pytest.mark.slow]}


def each_kind(point: str, marks: dict[str, list[pytest.MarkDecorator]] = WORLD_MARKS) -> pytest.MarkDecorator:
    """Parametrise over (executor, kind it handles), ids `slurm-4of4-drain_node`; a declared known bug of that
    point is a strict xfail."""
    params = []
    for impl in implementations(EXECUTORS, marks):
        name = str(impl.values[0])
        bugs = HARNESSES[name].known_bugs if name in HARNESSES else {}
        for kind in sorted(EXECUTORS[name].handles):
            extra = [pytest.mark.xfail(reason=f"known bug: {bugs[point, kind]}", strict=True, raises=AssertionError)
                     ] if (point, kind) in bugs else []
            params.append(pytest.param(name, kind, id=f"{impl.id}-{kind}", marks=[*impl.marks, *extra]))
    return pytest.mark.parametrize(("name", "kind"), params)


@pytest.fixture(scope="module")
def slurm_cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SlurmCluster]:
    """One Slurm for the whole module (~1 s to start); each test that uses it resets it first."""
    with running_cluster(tmp_path_factory.mktemp("slurm")) as cluster:
        yield cluster


@pytest.fixture
def harness(name: str, request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Harness]:
    if name not in HARNESSES:
        pytest.fail(f"executor {name!r} is registered but this suite has no harness for it")
    built = HARNESSES[name](request, tmp_path)
    try:
        yield built
    finally:
        built.close()


def assert_one_line(outcome: Outcome, harness: Harness) -> None:
    assert isinstance(outcome, Outcome) and isinstance(outcome.ok, bool), outcome
    detail = outcome.detail
    assert detail.strip(), "an empty detail says nothing on the incident timeline"
    assert "\n" not in detail and "\r" not in detail, f"not one line: {detail!r}"
    assert len(detail) <= DETAIL_MAX_CHARS, f"{len(detail)} characters: {detail!r}"
    for secret in harness.secrets:
        assert secret not in detail


def test_every_registered_executor_has_a_harness() -> None:
    assert {"launcher", "local", "slurm", "kubernetes"} <= set(EXECUTORS)
    assert set(EXECUTORS) <= set(HARNESSES), f"no harness for {sorted(set(EXECUTORS) - set(HARNESSES))}"


@pytest.mark.parametrize("name", implementations(EXECUTORS))
def test_registered_under_its_name_and_handles_known_kinds(name: str) -> None:
    executor = EXECUTORS[name]
    assert issubclass(executor, Executor) and executor.name == name
    assert executor.handles, f"{name} handles nothing"
    assert executor.handles <= ACTION_KINDS, f"{name} handles unknown kinds {sorted(executor.handles - ACTION_KINDS)}"


@each_kind("ok_in_one_line")
def test_a_valid_action_is_ok_in_one_line_that_names_its_subject(harness: Harness, kind: str) -> None:
    action = harness.prepare(kind)
    outcome = harness.executor.execute(action)
    harness.settle()
    assert outcome.ok, outcome.detail
    assert_one_line(outcome, harness)
    assert harness.subject(action) in outcome.detail, f"{outcome.detail!r} does not name {harness.subject(action)}"


@each_kind("done")
def test_the_world_shows_the_action_done(harness: Harness, kind: str) -> None:
    action = harness.prepare(kind)
    assert not harness.done(action), f"done before the action, so the check proves nothing: {harness.world()}"
    outcome = harness.executor.execute(action)
    assert outcome.ok, outcome.detail
    wait_until(lambda: harness.done(action), lambda: f"{kind} done; the world is {harness.world()}")


@each_kind("idempotent")
def test_the_same_action_again_is_ok_and_leaves_the_world_as_it_was(harness: Harness, kind: str) -> None:
    action = harness.prepare(kind)
    assert harness.executor.execute(action).ok
    wait_until(lambda: harness.done(action), lambda: f"{kind} done; the world is {harness.world()}")
    harness.settle()
    before = harness.world()
    again = harness.executor.execute(action)
    harness.settle()
    assert again.ok, again.detail
    assert harness.done(action)
    assert harness.world() == before


@each_kind("unknown")
def test_an_action_on_what_its_world_does_not_know_is_refused_and_changes_nothing(harness: Harness,
                                                                                 kind: str) -> None:
    unknown = harness.unknown(kind)
    harness.settle()
    before = harness.world()
    outcome = harness.executor.execute(unknown.action)  # never raises
    harness.settle()
    assert_one_line(outcome, harness)
    assert outcome.ok is not unknown.refused, outcome.detail
    assert harness.world() == before
    if unknown.refused:
        subject = harness.subject(unknown.action)
        assert subject in outcome.detail, f"the refusal does not name {subject}: {outcome.detail!r}"
    else:
        assert unknown.why and unknown.untouched is not None, "a world that cannot tell says why and what it checks"
        assert unknown.says in outcome.detail, outcome.detail
        assert unknown.untouched()


@each_kind("away", CLIENT_MARKS)
def test_with_its_world_away_it_does_not_raise_and_says_what_went_wrong(harness: Harness, kind: str,
                                                                        caplog: pytest.LogCaptureFixture) -> None:
    away = harness.away(kind)
    caplog.set_level(logging.WARNING)
    outcome = away.executor.execute(away.action)  # never raises
    assert_one_line(outcome, harness)
    if away.still_ok:
        assert away.still_done is not None
        assert outcome.ok, outcome.detail
        wait_until(away.still_done, "the part that needs nothing of what is away")
        harness.settle()
        logged = [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING]
        assert any(away.says in line for line in logged), logged
    else:
        assert not outcome.ok, outcome.detail
        assert away.says in outcome.detail, outcome.detail
    assert all(secret not in caplog.text for secret in harness.secrets)


def test_the_harnesses_long_pollers_wait_until_woken() -> None:
    """The launcher harness's `woken` is only worth something if a poll nobody announces stays unwoken."""
    board = OrderBoard()
    pollers = LongPollers(board)
    try:
        pollers.poll(1)
        assert not pollers.woken(1)
        assert board.announce(1) == 1
        wait_until(lambda: pollers.woken(1), "the announced poll to return")
    finally:
        pollers.close()
