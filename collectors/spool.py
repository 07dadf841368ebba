"""Reports wait on disk, oldest first, until the server acknowledges them.

Every report goes through the spool (not only when the server is away), so a report survives
the agent being killed too. Bounded: when full, the oldest report is dropped and counted.
"""

from __future__ import annotations

import logging
import os
import threading
from pathlib import Path

log = logging.getLogger("sentinel.agent.spool")
SUFFIX = ".json"


class Spool:
    def __init__(self, directory: Path, *, max_reports: int = 10_000, fsync: bool = False):
        self.directory = directory
        self.max_reports = max_reports
        self._fsync = fsync
        self._lock = threading.Lock()
        directory.mkdir(parents=True, exist_ok=True)
        self._seqs = sorted(int(p.stem) for p in directory.glob(f"*{SUFFIX}") if p.stem.isdigit())
        self.dropped_total = 0

    def _path(self, seq: int) -> Path:
        return self.directory / f"{seq:020d}{SUFFIX}"

    def append(self, seq: int, body: bytes) -> None:
        tmp = self.directory / f".{seq}.tmp"
        with open(tmp, "wb") as fh:
            fh.write(body)
            if self._fsync:
                fh.flush()
                os.fsync(fh.fileno())
        os.replace(tmp, self._path(seq))
        with self._lock:
            self._seqs.append(seq)
            while len(self._seqs) > self.max_reports:
                oldest = self._seqs.pop(0)
                self._path(oldest).unlink(missing_ok=True)
                self.dropped_total += 1
                log.warning("spool full (%d reports): dropped the oldest report seq=%d", self.max_reports, oldest)

    def oldest(self) -> tuple[int, bytes] | None:
        with self._lock:
            while self._seqs:
                seq = self._seqs[0]
                try:
                    return seq, self._path(seq).read_bytes()
                except FileNotFoundError:
                    self._seqs.pop(0)
            return None

    def remove(self, seq: int) -> None:
        with self._lock:
            if seq in self._seqs:
                self._seqs.remove(seq)
        self._path(seq).unlink(missing_ok=True)

    def __len__(self) -> int:
        with self._lock:
            return len(self._seqs)

    def highest_seq(self) -> int:
        with self._lock:
            return self._seqs[-1] if self._seqs else 0


class SeqCounter:
    """Sequence numbers that only grow, also across agent restarts (kept in a small file)."""

    def __init__(self, path: Path, floor: int = 0):
        self._path = path
        self._lock = threading.Lock()
        try:
            stored = int(path.read_text().strip() or 0)
        except (FileNotFoundError, ValueError):
            stored = 0
        self._value = max(stored, floor)

    def raise_to(self, value: int) -> None:
        with self._lock:
            self._value = max(self._value, value)

    def next(self) -> int:
        with self._lock:
            self._value += 1
            tmp = self._path.with_suffix(".tmp")
            tmp.write_text(str(self._value))
            os.replace(tmp, self._path)
            return self._value

    @property
    def value(self) -> int:
        with self._lock:
            return self._value
