"""Reports wait on disk, oldest first, until the server acknowledges them.

Every report goes through the spool (not only when the server is away), so a report survives
the agent being killed too. Bounded: when full, the oldest report is dropped and counted.
"""

from __future__ import annotations

import contextlib
import logging
import os
import threading
from pathlib import Path

log = logging.getLogger("sentinel.agent.spool")
SUFFIX = ".json"
MEMORY_REPORTS = 64  # reports also kept in memory while fewer are waiting (the server away: read from disk)


class Spool:
    def __init__(self, directory: Path, *, max_reports: int = 10_000, fsync: bool = False):
        self.directory = directory
        self.max_reports = max_reports
        self._fsync = fsync
        self._lock = threading.Lock()
        directory.mkdir(parents=True, exist_ok=True)
        self._dir = str(directory)
        self._seqs = sorted(int(p.stem) for p in directory.glob(f"*{SUFFIX}") if p.stem.isdigit())
        self._bodies: dict[int, bytes] = {}  # the newest reports' bytes as written: the pusher needs no read back
        self.dropped_total = 0

    def _path(self, seq: int) -> str:
        return f"{self._dir}/{seq:020d}{SUFFIX}"

    def append(self, seq: int, body: bytes) -> None:
        """Write through os.open/os.write (a buffered open() cost several times the write), to a temporary name
        renamed into place: a report file is whole or absent."""
        tmp = f"{self._dir}/.{seq}.tmp"
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC, 0o644)
        try:
            view = memoryview(body)
            while view:
                view = view[os.write(fd, view):]
            if self._fsync:
                os.fsync(fd)
        finally:
            os.close(fd)
        os.replace(tmp, self._path(seq))
        with self._lock:
            self._seqs.append(seq)
            if len(self._bodies) < MEMORY_REPORTS:
                self._bodies[seq] = body
            while len(self._seqs) > self.max_reports:
                oldest = self._seqs.pop(0)
                self._bodies.pop(oldest, None)
                _unlink(self._path(oldest))
                self.dropped_total += 1
                log.warning("spool full (%d reports): dropped the oldest report seq=%d", self.max_reports, oldest)

    def oldest(self) -> tuple[int, bytes] | None:
        with self._lock:
            while self._seqs:
                seq = self._seqs[0]
                if seq in self._bodies:
                    return seq, self._bodies[seq]
                try:
                    return seq, Path(self._path(seq)).read_bytes()
                except FileNotFoundError:
                    self._seqs.pop(0)
            return None

    def remove(self, seq: int) -> None:
        with self._lock:
            if seq in self._seqs:
                self._seqs.remove(seq)
            self._bodies.pop(seq, None)
        _unlink(self._path(seq))

    def __len__(self) -> int:
        with self._lock:
            return len(self._seqs)

    def highest_seq(self) -> int:
        with self._lock:
            return self._seqs[-1] if self._seqs else 0


def _unlink(path: str) -> None:
    with contextlib.suppress(FileNotFoundError):
        os.unlink(path)


class SeqCounter:
    """Sequence numbers that only grow, also across agent restarts (kept in a small file).

    The file is rewritten in place (one pwrite of a fixed-width number on a descriptor kept open), not replaced
    by a rename each report: on ext4 a rename over an existing file forces the data out (auto_da_alloc), which
    cost more CPU than the rest of the report's writing. A 20-byte write inside one block is all or nothing."""

    WIDTH = 20

    def __init__(self, path: Path, floor: int = 0):
        self._path = path
        self._lock = threading.Lock()
        try:
            stored = int(path.read_text().strip() or 0)
        except (FileNotFoundError, ValueError):
            stored = 0
        self._value = max(stored, floor)
        self._fd: int | None = None

    def raise_to(self, value: int) -> None:
        with self._lock:
            self._value = max(self._value, value)

    def next(self) -> int:
        with self._lock:
            self._value += 1
            self._store()
            return self._value

    def _store(self) -> None:
        fresh = self._fd is None
        if self._fd is None:
            self._fd = os.open(self._path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
        os.pwrite(self._fd, str(self._value).zfill(self.WIDTH).encode(), 0)
        if fresh:  # every value is this wide from now on; nothing of a longer older file may follow it
            os.ftruncate(self._fd, self.WIDTH)

    def close(self) -> None:
        with self._lock:
            if self._fd is not None:
                os.close(self._fd)
                self._fd = None

    @property
    def value(self) -> int:
        with self._lock:
            return self._value
