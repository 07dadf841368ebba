"""The LeaderLock contract (sentinel/ha/leader.py), run against every lock in `LOCKS` on its real database.

What the Elector relies on: a free lock is taken, a held one is confirmed until it is released or its
connection dies, and then another server can take it; no call raises, not even with the database gone.
An implementation that declares `exclusive = False` (SoleLeader: one server per SQLite file) says that a
second lock leads too; the suite checks that declaration instead of the exclusion it waives.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from sqlalchemy import create_engine, text
from sqlalchemy.engine import make_url
from sqlalchemy.pool import NullPool

from sentinel.ha.leader import LOCKS, Elector, LeaderLock, make_lock, url_scheme
from tests.contracts.conftest import implementations
from tests.live import free_port

KEY_NAME = "contract"

# Each name is also a `database_url` param (tests/conftest.py): the lock is tested on that real database.
each_lock = pytest.mark.parametrize(
    "database_url", implementations(LOCKS, marks={"postgresql": [pytest.mark.postgres]}), indirect=True)

MakeLock = Callable[..., LeaderLock]


def terminate_postgres_backend(url: str, server_name: str) -> None:
    """What a network partition or an operator's kill does: end the lock's session from a superuser
    connection, and wait (pg_terminate_backend's timeout) until that backend has exited and freed its locks."""
    engine = create_engine(url, poolclass=NullPool)
    try:
        with engine.connect() as conn:
            ended = conn.execute(text(
                "SELECT pg_terminate_backend(pid, 10000) FROM pg_stat_activity WHERE datname = current_database() "
                "AND application_name = :name AND pid <> pg_backend_pid()"), {"name": f"sentinel:{server_name}"}
            ).scalars().all()
            conn.commit()
    finally:
        engine.dispose()
    assert ended == [True], f"expected to end exactly one backend of {server_name}, got {ended}"


# How to kill a lock's connection for real, by implementation name: every exclusive lock needs one.
CONNECTION_FAULTS: dict[str, Callable[[str, str], None]] = {"postgresql": terminate_postgres_backend}


@pytest.fixture
def kind(request: pytest.FixtureRequest, database_url: str) -> str:
    """The registered name under test; the database fixture must have given a URL of that scheme."""
    name = str(request.node.callspec.params["database_url"])
    assert url_scheme(database_url) == name, f"tests/conftest.py database_url has no {name!r} database: add one"
    return name


@pytest.fixture
def locks(database_url: str) -> Iterator[MakeLock]:
    """Makes locks as the server does (`make_lock`), on the test's database unless told another URL;
    releases them all at the end (release is safe twice, so a test may release its own)."""
    made: list[LeaderLock] = []

    def make(server_name: str, url: str | None = None) -> LeaderLock:
        lock = make_lock(url or database_url, key_name=KEY_NAME, server_name=server_name)
        made.append(lock)
        return lock

    yield make
    for lock in made:
        lock.release()


def exclusive_only(kind: str) -> None:
    if not LOCKS[kind].exclusive:
        pytest.skip(f"{LOCKS[kind].__name__} declares exclusive = False (one server per database); "
                    "test_a_second_lock_is_refused_exactly_when_the_implementation_is_exclusive checks that")


def unreachable(url: str, tmp_path: Path) -> str:
    """The same kind of URL, pointing where no database is: a closed port, or a file in a missing folder."""
    parsed = make_url(url)
    if parsed.host:
        return parsed.set(port=free_port()).render_as_string(hide_password=False)
    return parsed.set(database=str(tmp_path / "missing" / "sentinel.db")).render_as_string(hide_password=False)


@each_lock
def test_make_lock_builds_the_implementation_registered_for_the_url_scheme(kind, locks):
    assert type(locks("a")) is LOCKS[kind]


@each_lock
def test_a_fresh_lock_is_not_confirmed_until_it_is_acquired(kind, locks):
    lead = locks("a")
    assert not lead.confirm()
    assert lead.try_acquire() and lead.confirm()


@each_lock
def test_while_held_it_stays_confirmed_and_acquiring_again_changes_nothing(kind, locks):
    a = locks("a")
    assert a.try_acquire()
    assert a.confirm() and a.confirm()
    assert a.try_acquire() and a.confirm()
    a.release()
    assert not a.confirm(), "one release frees a lock acquired twice"
    assert locks("b").try_acquire()


@each_lock
def test_released_it_is_not_confirmed_and_can_be_taken_again(kind, locks):
    a = locks("a")
    assert a.try_acquire()
    a.release()
    assert not a.confirm()
    assert a.try_acquire() and a.confirm()


@each_lock
def test_release_is_safe_before_acquiring_and_twice(kind, locks):
    a = locks("a")
    a.release()
    a.release()
    assert not a.confirm()
    assert a.try_acquire() and a.confirm()
    a.release()
    a.release()
    assert not a.confirm()


@each_lock
def test_holder_is_a_name_or_none_in_every_state_and_never_this_server_once_released(kind, locks):
    a = locks("a")
    fresh = a.holder()
    assert a.try_acquire()
    held = a.holder()
    a.release()
    released = a.holder()
    assert all(h is None or isinstance(h, str) for h in (fresh, held, released))
    assert fresh is None and released is None
    assert held in (None, "a"), "while this server holds it, a named holder is this server"


@each_lock
def test_a_lock_whose_database_is_unreachable_raises_nothing_and_an_exclusive_one_is_not_held(
        kind, database_url, locks, tmp_path):
    lost = locks("a", unreachable(database_url, tmp_path))
    acquired = lost.try_acquire()
    confirmed = lost.confirm()
    holder = lost.holder()
    lost.release()
    assert holder is None
    if LOCKS[kind].exclusive:
        assert not acquired and not confirmed, "a lock that cannot ask its database must not claim the lead"


@each_lock
def test_a_second_lock_is_refused_exactly_when_the_implementation_is_exclusive(kind, locks):
    a, b = locks("a"), locks("b")
    assert a.try_acquire()
    assert b.try_acquire() is not LOCKS[kind].exclusive
    assert a.confirm(), "the first lock stays held whatever the second tried"


@each_lock
def test_one_holder_at_a_time_and_the_lock_frees_with_its_connection(kind, locks):
    exclusive_only(kind)
    a, b = locks("a"), locks("b")
    assert a.try_acquire() and a.confirm()
    assert not b.try_acquire() and not b.confirm()
    assert b.holder() == "a"
    a.release()
    assert b.try_acquire() and b.confirm() and a.holder() == "b"


@each_lock
def test_when_the_holders_connection_dies_it_stops_confirming_and_a_second_lock_takes_over(
        kind, database_url, locks):
    exclusive_only(kind)
    fault = CONNECTION_FAULTS.get(kind)
    if fault is None:
        pytest.fail(f"{kind} is exclusive: add how to kill its connection to CONNECTION_FAULTS")
    a, b = locks("a"), locks("b")
    assert a.try_acquire() and not b.try_acquire()
    fault(database_url, "a")
    assert not a.confirm(), "a holder whose connection died must notice at its next confirm"
    assert b.try_acquire() and b.confirm()
    assert not a.try_acquire(), "the old holder, reconnected, cannot take it back while the new one holds it"


@each_lock
def test_an_elector_leads_with_the_lock_and_stop_releases_it(kind, locks):
    events: list[str] = []
    lock = locks("a")
    elector = Elector(lock, check_seconds=60, on_lead=lambda: events.append("lead"),
                      on_lost=lambda: events.append("lost"), server_name="a")
    elector.step()
    elector.step()  # confirms; nothing changes
    assert events == ["lead"] and elector.leading
    elector.stop()
    assert not elector.leading and not lock.confirm()
    assert locks("b").try_acquire()
