"""Group commit: many concurrent reports share one transaction, and each is acknowledged only
after that transaction is durable. This is what lets "a report accepted is a report kept" and
~thousands of reports/s coexist on SQLite.

A job brings plain rows (inserted for the whole batch with one executemany per table) and/or a
callable for anything else. Waiters on an event loop are woken once per batch, not once per job.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import queue
import threading
from collections.abc import Callable, Sequence
from concurrent.futures import Future
from typing import Any

from sqlalchemy import Boolean, Connection, DateTime, Engine, Float, Integer, String, Table
from sqlalchemy.orm import Session, sessionmaker
from sqlalchemy.types import TypeDecorator

log = logging.getLogger("sentinel.ingest")

Write = Callable[[Session], None]
Rows = Sequence[tuple[Table, list[dict[str, Any]]]]
MAX_BATCH = 512


class Job:
    __slots__ = ("future", "loop", "rows", "waiter", "write")

    def __init__(self, write: Write | None, rows: Rows = (), *, future: Future[None] | None = None,
                 loop: asyncio.AbstractEventLoop | None = None, waiter: asyncio.Future[None] | None = None):
        self.write = write
        self.rows = rows
        self.future = future
        self.loop = loop
        self.waiter = waiter


class GroupCommitWriter:
    def __init__(self, factory: sessionmaker[Session], on_batch: Callable[[int], None] | None = None):
        self._factory = factory
        self._queue: queue.SimpleQueue[Job | None] = queue.SimpleQueue()
        self._thread = threading.Thread(target=self._run, name="sentinel-ingest-writer", daemon=True)
        self._on_batch = on_batch
        self._started = False
        # The writer thread's own connection, kept between batches: a checkout from the pool cost a round trip
        # per batch on PostgreSQL (the pool's pre-ping), a third of a batch's. Dropped after any failure.
        self._connection: Connection | None = None

    def start(self) -> None:
        if not self._started:
            self._started = True
            self._thread.start()

    def stop(self, timeout: float = 10.0) -> None:
        if self._started:
            self._queue.put(None)
            self._thread.join(timeout)
            self._started = False

    def submit(self, write: Write | None = None, rows: Rows = ()) -> Future[None]:
        """From any thread: a future that is done once the write is committed (or has failed)."""
        future: Future[None] = Future()
        self._queue.put(Job(write, rows, future=future))
        return future

    async def commit(self, write: Write | None = None, rows: Rows = ()) -> None:
        """From an event loop: return once the write is committed; raise what made it fail."""
        loop = asyncio.get_running_loop()
        waiter: asyncio.Future[None] = loop.create_future()
        self._queue.put(Job(write, rows, loop=loop, waiter=waiter))
        await waiter

    def _run(self) -> None:
        try:
            self._loop()
        finally:
            self._drop_connection()

    def _loop(self) -> None:
        while True:
            first = self._queue.get()
            if first is None:
                return
            batch = [first]
            stop = False
            while len(batch) < MAX_BATCH:
                try:
                    nxt = self._queue.get_nowait()
                except queue.Empty:
                    break
                if nxt is None:
                    stop = True
                    break
                batch.append(nxt)
            self._commit(batch)
            if stop:
                return

    def _connect(self) -> Connection | None:
        """The writer's kept connection (None when the factory is not bound to one engine)."""
        if self._connection is None or self._connection.closed or self._connection.invalidated:
            self._drop_connection()
            bind = self._factory.kw.get("bind")
            self._connection = bind.connect() if isinstance(bind, Engine) else None
        return self._connection

    def _drop_connection(self) -> None:
        connection, self._connection = self._connection, None
        if connection is not None:
            with contextlib.suppress(Exception):
                connection.close()

    def _commit(self, batch: list[Job]) -> None:
        merged: dict[Table, list[dict[str, Any]]] = {}
        for job in batch:
            for table, rows in job.rows:
                merged.setdefault(table, []).extend(rows)
        try:
            connection = self._connect()
            if connection is not None and all(job.write is None for job in batch):
                # Rows only (nearly every batch: receipts): the connection's own transaction, no ORM session
                # (its begin and commit cost ~50-100 us of CPU a batch on PostgreSQL, a third of the COPY's).
                with connection.begin():
                    _insert_merged(connection, merged)
            else:
                session = self._factory(bind=connection) if connection is not None else self._factory()
                with session, session.begin():
                    _insert_merged(session.connection(), merged)
                    for job in batch:
                        if job.write is not None:
                            job.write(session)
        except Exception as exc:
            self._drop_connection()  # it may be broken; the next batch takes a fresh one
            if len(batch) == 1:
                log.exception("ingest write failed")
                self._settle(batch, exc)
                return
            # One bad write must not fail its neighbours: retry them one by one to isolate it.
            for job in batch:
                self._commit([job])
            return
        if self._on_batch is not None:
            self._on_batch(len(batch))
        self._settle(batch)

    @staticmethod
    def _settle(batch: list[Job], error: BaseException | None = None) -> None:
        by_loop: dict[asyncio.AbstractEventLoop, list[asyncio.Future[None]]] = {}
        for job in batch:
            if job.future is not None and not job.future.done():
                if error is not None:
                    job.future.set_exception(error)
                else:
                    job.future.set_result(None)
            if job.loop is not None and job.waiter is not None:
                by_loop.setdefault(job.loop, []).append(job.waiter)
        for loop, waiters in by_loop.items():
            with contextlib.suppress(RuntimeError):  # the loop is closed: nobody is waiting any more
                loop.call_soon_threadsafe(_wake, waiters, error)


def _insert_merged(connection: Connection, merged: dict[Table, list[dict[str, Any]]]) -> None:
    for table, rows in merged.items():
        if rows:
            insert_rows(connection, table, rows)


COPYABLE = (Integer, Float, String, Boolean, DateTime)  # types psycopg's COPY writes as SQLAlchemy would bind them


def insert_rows(connection: Connection, table: Table, rows: list[dict[str, Any]]) -> None:
    """One batch's rows of one table. On PostgreSQL, a table of plain columns goes through COPY: psycopg's
    executemany sends an INSERT a row, and 32 receipts took 1.5 ms and 1 ms of CPU against COPY's 0.5 and
    0.2 (docs/scaling.md). Anything else (JSON columns, rows of differing keys) is an executemany."""
    names = list(rows[0])
    columns = [table.c[name] for name in names]
    if (connection.dialect.name != "postgresql" or any(r.keys() != rows[0].keys() for r in rows)
            or not all(isinstance(_impl(c.type), COPYABLE) for c in columns)):
        connection.execute(table.insert(), rows)
        return
    binds = [c.type.process_bind_param if isinstance(c.type, TypeDecorator) else None for c in columns]
    quote = connection.dialect.identifier_preparer
    statement = (f"COPY {quote.format_table(table)} ({', '.join(quote.quote(n) for n in names)}) FROM STDIN")
    raw = connection.connection.driver_connection
    assert raw is not None
    with raw.cursor().copy(statement) as copy:
        for row in rows:
            copy.write_row([row[n] if bind is None else bind(row[n], connection.dialect)
                            for n, bind in zip(names, binds, strict=True)])


def _impl(kind: Any) -> Any:
    return kind.impl if isinstance(kind, TypeDecorator) else kind


def _wake(waiters: list[asyncio.Future[None]], error: BaseException | None) -> None:
    for waiter in waiters:
        if waiter.done():  # cancelled while waiting
            continue
        if error is not None:
            waiter.set_exception(error)
        else:
            waiter.set_result(None)
