"""Where checkpoint chunks and manifests live: one small interface, two directory tiers.

Layout of a store root:
  packs/<id>.pack   the chunks one save wrote, back to back
  packs/<id>.idx    what is in that pack (digest, offset, length); a pack without one is a torn write
  packs/<id>.spare  a retired pack kept for the next save to overwrite in place (no index: nothing in it is read)
  manifests/job-<job>/step-<step>/rank-<rank>.json
  manifests/job-<job>/step-<step>/rank-<rank>.layout  where that shard's bytes lie here (sentinel.sdk.layout)
  lock              saves hold it shared, garbage collection exclusive (flock, across processes)

A save checks which chunks exist and writes its manifest under the shared lock, so the collector,
which needs the lock exclusively, can never delete a chunk that a save is about to reference.

Packs are recycled, as PostgreSQL recycles WAL segments: collection renames a dead pack to a spare (while
spares stay within the live bytes) and the next pack is written over a spare in place. Overwriting pages
the page cache already holds costs a memory copy; a new file costs allocating every page and block again,
and freed memory comes back slowly (~4x the copy here; more on a VM that hands freed pages to its host).
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import itertools
import logging
import os
import time
import uuid
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path
from typing import Any

import numpy as np

from sentinel.sdk.chunkindex import ChunkIndex, ChunkRef
from sentinel.sdk.collection import GarbageReport, collect_garbage

log = logging.getLogger("sentinel.sdk.checkpoint")
IDX_MAGIC = b"SNTIDX1\n"
WRITEV_MAX = 1024  # IOV_MAX on Linux
WRITE_BATCH_BYTES = 64 << 20
STREAM_BATCH_BYTES = 4 << 20  # a streamed write's batch: hashed just before, still in the CPU's cache
IDX_RECORD = np.dtype([("digest", "S16"), ("offset", "<u8"), ("length", "<u4")])


class CheckpointStoreError(OSError):
    """A store could not be read or written; the message says which file and why."""


class CheckpointStore:
    """A directory of packs and manifests. Subclasses decide durability; `tier` and `node` say where it is."""

    tier = "local"
    durable = False

    def __init__(self, root: str | os.PathLike[str], *, node: str = ""):
        self.root = Path(root)
        self.node = node
        self.packs = self.root / "packs"
        self.manifests = self.root / "manifests"
        self._index = ChunkIndex()
        self._loaded: set[str] = set()
        self._untrusted: set[str] = set()  # see distrust()

    def __repr__(self) -> str:
        return f"{type(self).__name__}({str(self.root)!r}, node={self.node!r})"

    def location(self) -> dict[str, str]:
        return {"tier": self.tier, "node": self.node, "uri": str(self.root)}

    def _ensure(self) -> None:
        try:
            self.packs.mkdir(parents=True, exist_ok=True)
            self.manifests.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            raise CheckpointStoreError(exc.errno, f"cannot create checkpoint store at {self.root}: "
                                                  f"{exc.strerror}") from exc

    # -- locking ---------------------------------------------------------------------------------------
    @contextlib.contextmanager
    def _lock(self, mode: int, timeout_seconds: float | None) -> Iterator[None]:
        fd = self._acquire(mode, timeout_seconds)
        try:
            yield
        finally:
            os.close(fd)  # releases the lock

    def _acquire(self, mode: int, timeout_seconds: float | None) -> int:
        self._ensure()
        fd = os.open(self.root / "lock", os.O_RDWR | os.O_CREAT, 0o644)
        try:
            deadline = None if timeout_seconds is None else time.monotonic() + timeout_seconds
            while True:
                try:
                    fcntl.flock(fd, mode | (fcntl.LOCK_NB if deadline is not None else 0))
                    return fd
                except BlockingIOError:
                    if deadline is not None and time.monotonic() > deadline:
                        raise TimeoutError(f"checkpoint store {self.root} is busy") from None
                    time.sleep(0.01)
        except BaseException:
            os.close(fd)
            raise

    def shared(self) -> contextlib.AbstractContextManager[None]:
        """Held by a save from its first `has()` until its manifest is written, and by a restore."""
        return self._lock(fcntl.LOCK_SH, None)

    def hold_shared(self) -> int:
        """The shared lock, held until `os.close()` of the returned descriptor (by any thread): a save whose
        first pack is written on one thread and its manifest on another."""
        return self._acquire(fcntl.LOCK_SH, None)

    def exclusive(self, timeout_seconds: float = 60.0) -> contextlib.AbstractContextManager[None]:
        return self._lock(fcntl.LOCK_EX, timeout_seconds)

    # -- the chunk index -------------------------------------------------------------------------------
    def refresh(self) -> None:
        """Load indexes of packs written since the last look (by any process); forget deleted ones."""
        try:
            present = {p.name[:-4] for p in self.packs.iterdir() if p.name.endswith(".idx")}
        except FileNotFoundError:
            present = set()
        if self._loaded - present:  # start over: a digest of a deleted pack may also be in one still loaded
            self._index.clear()
            self._loaded = set()
        for pack in sorted(present - self._loaded):
            self._read_idx(pack)
            self._loaded.add(pack)

    def _read_idx(self, pack: str) -> None:
        """Index one pack's chunks (none if it was deleted meanwhile)."""
        path = self.packs / f"{pack}.idx"
        try:
            data = path.read_bytes()
        except FileNotFoundError:
            return
        if not data.startswith(IDX_MAGIC) or (len(data) - len(IDX_MAGIC)) % IDX_RECORD.itemsize:
            raise CheckpointStoreError(errno.EIO, f"pack index {path} is damaged")
        records = np.frombuffer(data, dtype=IDX_RECORD, offset=len(IDX_MAGIC))
        hexed = records["digest"].tobytes().hex()  # all digests at once, 32 hex digits each
        self._index.add(pack, [hexed[i:i + 32] for i in range(0, len(hexed), 32)], records["offset"],
                        records["length"])

    def has(self, digest_hex: str) -> bool:
        return digest_hex in self._index

    def chunk_refs(self) -> dict[str, ChunkRef]:
        return self._index.refs()

    def chunk_ref(self, digest_hex: str) -> ChunkRef | None:
        return self._index.get(digest_hex)

    # -- writing ---------------------------------------------------------------------------------------
    def write_pack(self, chunks: Iterable[tuple[str, memoryview]], *, pace: Callable[[int], None] | None = None,
                   wrote: list[tuple[str, list[str]]] | None = None, nbytes: int | None = None) -> tuple[int, int]:
        """Write the chunks this store lacks into one new pack (over a spare when there is one); returns
        (chunks, bytes) written, and appends (pack, digests) to `wrote`. A disk that fills up while spares hold
        space gets them back and is tried again.

        With `nbytes` (at least the chunks' bytes), `chunks` is streamed: each is written a few MiB after it was
        iterated (saving.cut_lazily hashes it then, so its bytes are still in the CPU's cache when written: read
        from memory once, not twice), and a full disk is not retried (the chunks are spent)."""
        if nbytes is not None:
            return self._write_pack(chunks, pace, wrote, nbytes)
        lacking = list(self._fresh(chunks)) if isinstance(chunks, list) else chunks  # (read in _write_pack's try)
        had_spares = isinstance(lacking, list) and self.packs.is_dir() and any(self.packs.glob("*.spare"))
        try:
            return self._write_pack(lacking, pace, wrote)
        except CheckpointStoreError as exc:
            if exc.errno not in (errno.ENOSPC, errno.EDQUOT) or not had_spares:
                raise
            self.drop_spares()
            log.warning("checkpoint store %s is full: its spare packs were deleted, writing again", self.root)
            return self._write_pack(lacking, pace, wrote)

    def distrust(self, digests: list[str]) -> None:
        """Chunks this process wrote for a save that then failed (their bytes may not match their digests): a
        later save writes its own copy of each rather than name these. They stay indexed, so collection still
        sees who names them (another process sharing the store may have) and deletes them once no one does."""
        self._untrusted.update(digests)

    def largest_spare(self) -> int:
        """The bytes of the largest spare pack (0 for none): a write that fits overwrites cached pages."""
        sizes = [0]
        for path in self.packs.glob("*.spare") if self.packs.is_dir() else ():
            with contextlib.suppress(FileNotFoundError):
                sizes.append(path.stat().st_size)
        return max(sizes)

    def _write_pack(self, chunks: Iterable[tuple[str, memoryview]], pace: Callable[[int], None] | None,
                    wrote: list[tuple[str, list[str]]] | None = None, nbytes: int | None = None) -> tuple[int, int]:
        self._ensure()
        pack = uuid.uuid4().hex
        pack_path, idx_path = self.packs / f"{pack}.pack", self.packs / f"{pack}.idx"
        try:
            fresh = self._fresh(chunks)
            first = next(fresh, None)
            if first is None:
                return 0, 0
            if nbytes is None:  # all hashed already: written in few large batches
                lacking = [first, *fresh]
                nbytes, batch_bytes, source = sum(len(d) for _, d in lacking), WRITE_BATCH_BYTES, iter(lacking)
            else:
                batch_bytes, source = STREAM_BATCH_BYTES, itertools.chain([first], fresh)
            digests: list[str] = []
            lengths: list[int] = []
            fd = self._open_pack(pack_path, nbytes)
            try:
                batch: list[memoryview] = []  # written with one writev: few syscalls, the GIL released once
                written = queued = 0
                for digest_hex, data in source:
                    digests.append(digest_hex)
                    lengths.append(len(data))
                    batch.append(data)
                    queued += len(data)
                    if pace is not None or len(batch) >= WRITEV_MAX or queued - written >= batch_bytes:
                        written = _writev(fd, batch, written, pace)
                written = _writev(fd, batch, written, pace)
                if os.fstat(fd).st_size > written:  # a spare longer than this pack
                    os.ftruncate(fd, written)
                if self.durable:
                    os.fsync(fd)
            finally:
                os.close(fd)
            table = np.empty(len(digests), dtype=IDX_RECORD)
            table["digest"] = np.frombuffer(bytes.fromhex("".join(digests)), dtype="S16")
            table["length"] = sizes = np.array(lengths, dtype=np.int64)
            table["offset"] = np.cumsum(sizes) - sizes
            self._write_atomic(idx_path, IDX_MAGIC + table.tobytes())
            self._index.add(pack, digests, table["offset"], table["length"])
            self._loaded.add(pack)
            self._untrusted.difference_update(digests)  # indexed now in this pack, written whole
            if wrote is not None:
                wrote.append((pack, digests))
        except BaseException as exc:  # (a streamed chunk's source may fail too)
            for path in (pack_path, idx_path):
                with contextlib.suppress(OSError):
                    path.unlink()
            if isinstance(exc, OSError):
                raise CheckpointStoreError(exc.errno or errno.EIO, f"writing {pack_path} failed: "
                                                                   f"{exc.strerror or exc}") from exc
            raise
        return len(digests), written

    def _fresh(self, chunks: Iterable[tuple[str, memoryview]]) -> Iterator[tuple[str, memoryview]]:
        """The chunks not in the store, each once, as they are iterated."""
        seen: set[str] = set()
        index, untrusted = self._index, self._untrusted
        for digest_hex, data in chunks:
            if (digest_hex not in index or (untrusted and digest_hex in untrusted)) and digest_hex not in seen:
                seen.add(digest_hex)
                yield digest_hex, data

    def _open_pack(self, path: Path, nbytes: int) -> int:
        """A spare renamed to `path` (the smallest that holds `nbytes`, else the largest), or a new file."""
        for spare in self._spares_by_fit(nbytes):
            try:
                os.rename(spare, path)  # claims it: another writer's rename of the same spare fails
            except FileNotFoundError:
                continue
            return os.open(path, os.O_WRONLY)
        return os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)

    def _spares_by_fit(self, nbytes: int) -> list[Path]:
        sized = []
        for path in self.packs.glob("*.spare"):
            with contextlib.suppress(FileNotFoundError):
                sized.append((path.stat().st_size, path))
        big = sorted((s, p) for s, p in sized if s >= nbytes)
        small = sorted(((s, p) for s, p in sized if s < nbytes), reverse=True)
        return [p for _, p in big + small]

    def drop_spares(self) -> int:
        """Delete every spare pack (the disk space they hold); returns the bytes given back."""
        freed = 0
        for path in self.packs.glob("*.spare"):
            with contextlib.suppress(FileNotFoundError):
                size = path.stat().st_size
                path.unlink()
                freed += size
        return freed

    def _sync(self, fh: Any) -> None:
        fh.flush()
        if self.durable:
            os.fsync(fh.fileno())

    def _write_atomic(self, path: Path, data: bytes) -> None:
        tmp = path.with_name(f".{path.name}.{uuid.uuid4().hex[:8]}.tmp")
        try:
            with open(tmp, "wb") as fh:
                fh.write(data)
                self._sync(fh)
            os.replace(tmp, path)
            if self.durable:
                fd = os.open(path.parent, os.O_RDONLY)
                try:
                    os.fsync(fd)
                finally:
                    os.close(fd)
        except OSError:
            with contextlib.suppress(OSError):
                tmp.unlink()
            raise

    def manifest_path(self, job: int, step: int, rank: int) -> Path:
        return self.manifests / f"job-{job}" / f"step-{step:012d}" / f"rank-{rank:05d}.json"

    def put_manifest(self, job: int, step: int, rank: int, data: bytes) -> None:
        path = self.manifest_path(job, step, rank)
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            self._write_atomic(path, data)
        except OSError as exc:
            raise CheckpointStoreError(exc.errno or errno.EIO, f"writing manifest {path} failed: "
                                                               f"{exc.strerror or exc}") from exc

    # -- reading ---------------------------------------------------------------------------------------
    def get_manifest(self, job: int, step: int, rank: int) -> bytes:
        path = self.manifest_path(job, step, rank)
        try:
            return path.read_bytes()
        except OSError as exc:
            raise CheckpointStoreError(exc.errno or errno.EIO, f"manifest {path}: {exc.strerror or exc}") from exc

    def read_chunk(self, digest_hex: str, into: memoryview | None = None) -> memoryview:
        """One chunk's bytes (into `into` when given: it must be the chunk's length); not verified."""
        from sentinel.sdk.packread import read_chunk

        return read_chunk(self, digest_hex, into)

    def read_chunks(self, digests: list[str], into: memoryview, touch: Callable[[], object] | None = None) -> None:
        """Read consecutive chunks into one buffer, with few reads and each pack opened once (see packread)."""
        from sentinel.sdk.packread import read_chunks

        read_chunks(self, digests, into, touch)

    def steps(self, job: int) -> dict[int, list[int]]:
        """{step: [ranks with a manifest here]}."""
        out: dict[int, list[int]] = {}
        base = self.manifests / f"job-{job}"
        if not base.is_dir():
            return out
        for step_dir in base.iterdir():
            if step_dir.name.startswith("step-"):
                try:
                    ranks = [int(p.name[5:10]) for p in step_dir.glob("rank-*.json")]
                except FileNotFoundError:  # a collector retired the step since iterdir() listed it
                    continue
                if ranks:
                    out[int(step_dir.name[5:])] = sorted(ranks)
        return out

    # -- garbage collection (sentinel.sdk.collection) ---------------------------------------------------
    def collect_garbage(self, *, retire: Iterable[tuple[int, int] | tuple[int, int, int | None]] = (),
                        timeout_seconds: float = 60.0, rewrite_below: float = 0.5) -> GarbageReport:
        """Delete the manifests of retired (job, step[, attempt])s, then every chunk no remaining manifest names
        (see sentinel.sdk.collection)."""
        return collect_garbage(self, retire=retire, timeout_seconds=timeout_seconds, rewrite_below=rewrite_below)


def _writev(fd: int, batch: list[memoryview], written: int, pace: Callable[[int], None] | None) -> int:
    """Write the batch (and empty it); returns the bytes written so far."""
    if batch:
        size = sum(len(b) for b in batch)
        views, done = list(batch), 0
        while done < size:
            got = os.writev(fd, views)
            done += got
            while views and got >= len(views[0]):
                got -= len(views[0])
                views.pop(0)
            if views and got:
                views[0] = views[0][got:]
        batch.clear()
        written += size
        if pace is not None:
            pace(size)
    return written


class LocalDirStore(CheckpointStore):
    """The node-local fast tier (NVMe or RAM disk): no fsync, lost with the node."""

    tier = "local"
    durable = False


class SharedDirStore(CheckpointStore):
    """The persistent tier on a shared filesystem: every pack, index and manifest is fsynced before use."""

    tier = "persistent"
    durable = True


STORES: dict[str, type[CheckpointStore]] = {"local": LocalDirStore, "persistent": SharedDirStore}
