"""Group commit: many concurrent reports share one transaction, and each is acknowledged only
after that transaction is durable. This is what lets "a report accepted is a report kept" and
~thousands of reports/s coexist on SQLite.
"""

from __future__ import annotations

import logging
import queue
import threading
from collections.abc import Callable
from concurrent.futures import Future
from dataclasses import dataclass, field

from sqlalchemy.orm import Session, sessionmaker

log = logging.getLogger("sentinel.ingest")

Write = Callable[[Session], None]
MAX_BATCH = 512


@dataclass
class Job:
    write: Write
    future: Future[None] = field(default_factory=Future)


class GroupCommitWriter:
    def __init__(self, factory: sessionmaker[Session], on_batch: Callable[[int], None] | None = None):
        self._factory = factory
        self._queue: queue.Queue[Job | None] = queue.Queue()
        self._thread = threading.Thread(target=self._run, name="sentinel-ingest-writer", daemon=True)
        self._on_batch = on_batch
        self._started = False

    def start(self) -> None:
        if not self._started:
            self._started = True
            self._thread.start()

    def stop(self, timeout: float = 10.0) -> None:
        if self._started:
            self._queue.put(None)
            self._thread.join(timeout)
            self._started = False

    def submit(self, write: Write) -> Future[None]:
        job = Job(write)
        self._queue.put(job)
        return job.future

    def _run(self) -> None:
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

    def _commit(self, batch: list[Job]) -> None:
        try:
            with self._factory() as session, session.begin():
                for job in batch:
                    job.write(session)
        except Exception as exc:
            if len(batch) == 1:
                log.exception("ingest write failed")
                self._settle(batch[0], error=exc)
                return
            # One bad write must not fail its neighbours: retry them one by one to isolate it.
            for job in batch:
                self._commit([job])
            return
        if self._on_batch is not None:
            self._on_batch(len(batch))
        for job in batch:
            self._settle(job)

    @staticmethod
    def _settle(job: Job, error: BaseException | None = None) -> None:
        if job.future.done():
            return
        if error is not None:
            job.future.set_exception(error)
        else:
            job.future.set_result(None)
