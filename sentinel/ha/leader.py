"""Who leads: one server runs detectors, notifiers and remediation; the others stand by and serve reads.

Two implementations of one small interface, registered in `LOCKS` by the database URL's scheme:
- `SoleLeader` — SQLite (one server per database file): always the leader.
- `PostgresLeader` — a session-level PostgreSQL advisory lock held on a connection of its own. The lock
  lives exactly as long as that connection: when the leader dies (kill -9, a crash, a lost host), its
  backend ends and the lock is free. A standby tries `pg_try_advisory_lock` every `check_seconds`, so it
  takes the lead within one check of the lock freeing (plus the time to load state).

The `Elector` thread drives either: it calls `on_lead` once the lock is held, and `on_lost` when a held
lock can no longer be confirmed (the connection broke). A leader that cannot confirm its lock must stop
acting at once: another server may hold it already. The server's answer is to exit (see `Runtime`).
"""

from __future__ import annotations

import hashlib
import logging
import threading
from abc import ABC, abstractmethod
from collections.abc import Callable
from typing import Any, ClassVar

from sqlalchemy import create_engine, text
from sqlalchemy.engine import Connection, Engine
from sqlalchemy.pool import NullPool

log = logging.getLogger("sentinel.leader")


def lock_key(name: str) -> int:
    """A stable signed 64-bit advisory-lock key from a name (one lock per Sentinel deployment and database)."""
    return int.from_bytes(hashlib.sha256(name.encode()).digest()[:8], "big", signed=True)


class LeaderLock(ABC):
    """`try_acquire()` → held now?; `confirm()` → still held?; `release()`; `holder()` for logs.

    `exclusive`: a second lock on the same database and key is refused while this one is held. Only an
    implementation for a database that one server uses alone (SQLite) declares False.
    tests/contracts/test_leader_lock_contract.py holds every registered implementation to this.
    """

    exclusive: ClassVar[bool] = True

    @classmethod
    @abstractmethod
    def for_database(cls, url: str, *, key: int, server_name: str) -> LeaderLock:
        """The lock on `key` in the database at `url`, for the server called `server_name` (`make_lock`)."""

    @abstractmethod
    def try_acquire(self) -> bool: ...

    @abstractmethod
    def confirm(self) -> bool: ...

    @abstractmethod
    def release(self) -> None: ...

    def holder(self) -> str | None:
        """Who holds the lock, as far as this server can tell (for logs and /readyz)."""
        return None


class SoleLeader(LeaderLock):
    exclusive = False  # one server per SQLite file: there is nobody to exclude

    def __init__(self) -> None:
        self._held = False

    @classmethod
    def for_database(cls, url: str, *, key: int, server_name: str) -> SoleLeader:
        return cls()

    def try_acquire(self) -> bool:
        self._held = True
        return True

    def confirm(self) -> bool:
        """Held from `try_acquire()` until `release()`: a released lock is not confirmed."""
        return self._held

    def release(self) -> None:
        self._held = False


# TCP keepalives: a leader whose host vanished (not just its process) is noticed by PostgreSQL within
# about idle + interval × count seconds, and its lock freed.
KEEPALIVE_ARGS: dict[str, Any] = {"keepalives": 1, "keepalives_idle": 5, "keepalives_interval": 2,
                                  "keepalives_count": 3, "connect_timeout": 5}


class PostgresLeader(LeaderLock):
    def __init__(self, url: str, *, key: int, server_name: str):
        self._engine: Engine = create_engine(url, poolclass=NullPool, connect_args=KEEPALIVE_ARGS)
        self._key = key
        self._name = server_name
        self._conn: Connection | None = None

    @classmethod
    def for_database(cls, url: str, *, key: int, server_name: str) -> PostgresLeader:
        return cls(url, key=key, server_name=server_name)

    def _parts(self) -> dict[str, int]:
        """pg_locks shows a bigint key as two unsigned 32-bit halves (classid, objid)."""
        unsigned = self._key & 0xFFFF_FFFF_FFFF_FFFF
        return {"hi": unsigned >> 32, "lo": unsigned & 0xFFFF_FFFF}

    def _connect(self) -> Connection:
        if self._conn is None:
            conn = self._engine.connect()
            # The application name shows in pg_stat_activity: `holder()` reads it, and so can an operator.
            conn.execute(text("SELECT set_config('application_name', :n, false)"), {"n": f"sentinel:{self._name}"})
            conn.commit()
            self._conn = conn
        return self._conn

    def _drop(self) -> None:
        conn, self._conn = self._conn, None
        if conn is not None:
            try:
                conn.invalidate()
                conn.close()
            except Exception:  # the connection is already broken; nothing to give back
                pass

    def try_acquire(self) -> bool:
        try:
            conn = self._connect()
            got = bool(conn.execute(text("SELECT pg_try_advisory_lock(:k)"), {"k": self._key}).scalar())
            conn.commit()
            return got
        except Exception as exc:
            log.warning("leader lock: could not ask PostgreSQL: server=%s error=%s", self._name,
                        str(exc).splitlines()[0][:200])
            self._drop()
            return False

    def confirm(self) -> bool:
        """True while this session still holds the lock (checked in pg_locks, on the lock's own connection)."""
        if self._conn is None:
            return False
        try:
            held = self._conn.execute(text(
                "SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' AND pid = pg_backend_pid() "
                "AND granted AND classid::text::bigint = :hi AND objid::text::bigint = :lo AND objsubid = 1"),
                self._parts()).scalar()
            self._conn.commit()
            return bool(held)
        except Exception as exc:
            log.error("leader lock: lost the connection that holds it: server=%s error=%s", self._name,
                      str(exc).splitlines()[0][:200])
            self._drop()
            return False

    def release(self) -> None:
        if self._conn is not None:
            try:
                self._conn.execute(text("SELECT pg_advisory_unlock(:k)"), {"k": self._key})
                self._conn.commit()
            except Exception:  # closing the connection below frees it anyway
                pass
        self._drop()
        self._engine.dispose()

    def holder(self) -> str | None:
        try:
            with self._engine.connect() as conn:
                name = conn.execute(text(
                    "SELECT a.application_name FROM pg_locks l JOIN pg_stat_activity a ON a.pid = l.pid "
                    "WHERE l.locktype = 'advisory' AND l.granted AND l.classid::text::bigint = :hi "
                    "AND l.objid::text::bigint = :lo AND l.objsubid = 1"), self._parts()).scalar()
        except Exception:
            return None
        return str(name).removeprefix("sentinel:") if name else None


# Lock implementations by database URL scheme (the part before `+driver`). A new one registers here and
# gets the contract suite (tests/contracts/test_leader_lock_contract.py).
LOCKS: dict[str, type[LeaderLock]] = {"sqlite": SoleLeader, "postgresql": PostgresLeader}


def url_scheme(url: str) -> str:
    """`postgresql+psycopg://…` → `postgresql`; `sqlite:///…` → `sqlite`."""
    return url.split(":", 1)[0].split("+", 1)[0]


def make_lock(url: str, *, key_name: str, server_name: str) -> LeaderLock:
    """The registered lock for the URL's scheme; any other scheme gets `SoleLeader`, as one server alone."""
    implementation = LOCKS.get(url_scheme(url), SoleLeader)
    return implementation.for_database(url, key=lock_key(key_name), server_name=server_name)


class Elector:
    """Runs the lock: try to take it while standing by, confirm it while leading, every `check_seconds`."""

    def __init__(self, lock: LeaderLock, *, check_seconds: float, on_lead: Callable[[], None],
                 on_lost: Callable[[], None], server_name: str):
        self.lock = lock
        self.check_seconds = check_seconds
        self.server_name = server_name
        self._on_lead = on_lead
        self._on_lost = on_lost
        self.leading = False
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def step(self) -> None:
        """One check. Public so a server can take the lead synchronously at start when it is free."""
        if not self.leading:
            if self.lock.try_acquire():
                self.leading = True
                log.warning("took the lead: server=%s (detectors, notifiers and remediation run here)",
                            self.server_name)
                self._on_lead()
        elif not self.lock.confirm():
            self.leading = False
            log.critical("lost the lead: server=%s; stopping leader work at once", self.server_name)
            self._on_lost()

    def start(self) -> None:
        if self._thread is not None:
            return
        self._thread = threading.Thread(target=self._loop, name="sentinel-elector", daemon=True)
        self._thread.start()

    def _loop(self) -> None:
        while not self._stop.wait(self.check_seconds):
            try:
                self.step()
            except Exception:
                log.exception("leader election step failed: server=%s", self.server_name)

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=self.check_seconds + 5)
            self._thread = None
        self.lock.release()
        self.leading = False
