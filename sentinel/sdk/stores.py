"""Where checkpoint chunks and manifests live: one small interface, two directory tiers.

Layout of a store root:
  packs/<id>.pack   the chunks one save wrote, back to back
  packs/<id>.idx    what is in that pack (digest, offset, length); a pack without one is a torn write
  manifests/job-<job>/step-<step>/rank-<rank>.json
  lock              saves hold it shared, garbage collection exclusive (flock, across processes)

A save checks which chunks exist and writes its manifest under the shared lock, so the collector,
which needs the lock exclusively, can never delete a chunk that a save is about to reference.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import json
import os
import time
import uuid
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

IDX_MAGIC = b"SNTIDX1\n"
WRITEV_MAX = 1024  # IOV_MAX on Linux
WRITE_BATCH_BYTES = 64 << 20
IDX_RECORD = np.dtype([("digest", "S16"), ("offset", "<u8"), ("length", "<u4")])


class CheckpointStoreError(OSError):
    """A store could not be read or written; the message says which file and why."""


@dataclass(frozen=True)
class ChunkRef:
    pack: str
    offset: int
    length: int


@dataclass
class GarbageReport:
    manifests_deleted: int = 0
    packs_deleted: int = 0
    packs_rewritten: int = 0
    bytes_freed: int = 0
    live_chunks: int = 0


class CheckpointStore:
    """A directory of packs and manifests. Subclasses decide durability; `tier` and `node` say where it is."""

    tier = "local"
    durable = False

    def __init__(self, root: str | os.PathLike[str], *, node: str = ""):
        self.root = Path(root)
        self.node = node
        self.packs = self.root / "packs"
        self.manifests = self.root / "manifests"
        self._index: dict[str, ChunkRef] = {}
        self._loaded: set[str] = set()

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
        self._ensure()
        fd = os.open(self.root / "lock", os.O_RDWR | os.O_CREAT, 0o644)
        try:
            deadline = None if timeout_seconds is None else time.monotonic() + timeout_seconds
            while True:
                try:
                    fcntl.flock(fd, mode | (fcntl.LOCK_NB if deadline is not None else 0))
                    break
                except BlockingIOError:
                    if deadline is not None and time.monotonic() > deadline:
                        raise TimeoutError(f"checkpoint store {self.root} is busy") from None
                    time.sleep(0.01)
            yield
        finally:
            os.close(fd)  # releases the lock

    def shared(self) -> contextlib.AbstractContextManager[None]:
        """Held by a save from its first `has()` until its manifest is written, and by a restore."""
        return self._lock(fcntl.LOCK_SH, None)

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
            self._index, self._loaded = {}, set()
        for pack in sorted(present - self._loaded):
            for digest_hex, ref in self._read_idx(pack):
                self._index.setdefault(digest_hex, ref)
            self._loaded.add(pack)

    def _read_idx(self, pack: str) -> Iterator[tuple[str, ChunkRef]]:
        path = self.packs / f"{pack}.idx"
        try:
            data = path.read_bytes()
        except FileNotFoundError:
            return
        if not data.startswith(IDX_MAGIC) or (len(data) - len(IDX_MAGIC)) % IDX_RECORD.itemsize:
            raise CheckpointStoreError(errno.EIO, f"pack index {path} is damaged")
        records = np.frombuffer(data, dtype=IDX_RECORD, offset=len(IDX_MAGIC))
        for d, offset, length in records.tolist():  # numpy drops an "S16" digest's trailing zero bytes
            yield d.ljust(16, b"\0").hex(), ChunkRef(pack, int(offset), int(length))

    def has(self, digest_hex: str) -> bool:
        return digest_hex in self._index

    def chunk_refs(self) -> dict[str, ChunkRef]:
        return dict(self._index)

    # -- writing ---------------------------------------------------------------------------------------
    def write_pack(self, chunks: Iterable[tuple[str, memoryview]], *,
                   pace: Callable[[int], None] | None = None) -> tuple[int, int]:
        """Write the chunks this store lacks into one new pack; returns (chunks, bytes) written."""
        self._ensure()
        pack = uuid.uuid4().hex
        pack_path, idx_path = self.packs / f"{pack}.pack", self.packs / f"{pack}.idx"
        records: list[tuple[bytes, int, int]] = []
        offset = written = 0
        try:
            with open(pack_path, "wb", buffering=0) as fh:
                batch: list[memoryview] = []  # written with one writev: few syscalls, the GIL released once
                for digest_hex, data in chunks:
                    if digest_hex in self._index:
                        continue
                    batch.append(data)
                    records.append((bytes.fromhex(digest_hex), offset, len(data)))
                    self._index[digest_hex] = ChunkRef(pack, offset, len(data))
                    offset += len(data)
                    if pace is not None or len(batch) >= WRITEV_MAX or offset - written >= WRITE_BATCH_BYTES:
                        written = _writev(fh.fileno(), batch, written, pace)
                _writev(fh.fileno(), batch, written, pace)
                self._sync(fh)
            if not records:
                pack_path.unlink()
                return 0, 0
            table = np.array(records, dtype=IDX_RECORD)
            self._write_atomic(idx_path, IDX_MAGIC + table.tobytes())
            self._loaded.add(pack)
        except OSError as exc:
            self._index = {d: ref for d, ref in self._index.items() if ref.pack != pack}
            for path in (pack_path, idx_path):
                with contextlib.suppress(OSError):
                    path.unlink()
            raise CheckpointStoreError(exc.errno or errno.EIO, f"writing {pack_path} failed: "
                                                               f"{exc.strerror or exc}") from exc
        return len(records), offset

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
        ref = self._index.get(digest_hex)
        if ref is None:
            raise CheckpointStoreError(errno.ENOENT, f"chunk {digest_hex} is in no pack under {self.packs}")
        path = self.packs / f"{ref.pack}.pack"
        if into is not None and len(into) != ref.length:
            raise CheckpointStoreError(errno.EIO, f"chunk {digest_hex} is {ref.length} bytes in {self.packs}, "
                                                  f"the manifest expects {len(into)}")
        buffer = into if into is not None else memoryview(bytearray(ref.length))
        try:
            with open(path, "rb", buffering=0) as fh:
                fh.seek(ref.offset)
                got = fh.readinto(buffer)
        except OSError as exc:
            raise CheckpointStoreError(exc.errno or errno.EIO, f"reading chunk {digest_hex} from {path}: "
                                                               f"{exc.strerror or exc}") from exc
        if got != ref.length:
            raise CheckpointStoreError(errno.EIO, f"chunk {digest_hex} in {path} is truncated "
                                                  f"({got} of {ref.length} bytes)")
        return buffer

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

    # -- garbage collection ----------------------------------------------------------------------------
    def collect_garbage(self, *, retire: Iterable[tuple[int, int] | tuple[int, int, int | None]] = (),
                        timeout_seconds: float = 60.0,
                        rewrite_below: float = 0.5) -> GarbageReport:
        """Delete the manifests of retired (job, step[, attempt])s, then every chunk no remaining manifest names.

        With an attempt, only manifests written by that attempt or an older one go: a restarted job that
        saved the step again keeps its own.

        Runs under the exclusive lock, so no save is between checking a chunk and naming it. A pack
        whose live share fell under `rewrite_below` is rewritten with its live chunks only.
        """
        report = GarbageReport()
        with self.exclusive(timeout_seconds):
            for job, step, *rest in retire:
                attempt = rest[0] if rest else None
                step_dir = self.manifest_path(job, step, 0).parent
                for path in step_dir.glob("*.json"):
                    if attempt is not None and _attempt_of(path) > attempt:
                        continue
                    path.unlink()
                    report.manifests_deleted += 1
                with contextlib.suppress(OSError):
                    step_dir.rmdir()
            live = self._live_digests()
            report.live_chunks = len(live)
            self.refresh()
            # a pack whose chunks are all indexed in other packs too (two saves wrote them) has no refs: all dead
            by_pack: dict[str, list[tuple[str, ChunkRef]]] = {pack: [] for pack in self._loaded}
            for digest_hex, ref in self._index.items():
                by_pack.setdefault(ref.pack, []).append((digest_hex, ref))
            for leftover in [*self.packs.glob(".*.tmp"), *self.manifests.glob("job-*/step-*/.*.tmp")]:
                leftover.unlink(missing_ok=True)  # a writer killed between writing and renaming
            for path in self.packs.glob("*.pack"):
                if path.name[:-5] not in self._loaded:  # torn: its writer died before the index
                    report.bytes_freed += path.stat().st_size
                    path.unlink()
                    report.packs_deleted += 1
            for pack, refs in by_pack.items():
                self._sweep_pack(pack, refs, live, rewrite_below, report)
        return report

    def _live_digests(self) -> set[str]:
        live: set[str] = set()
        for path in self.manifests.glob("job-*/step-*/rank-*.json"):
            try:
                manifest = json.loads(path.read_bytes())
                for tensor in manifest["tensors"]:
                    live.update(tensor["chunks"])
            except (ValueError, KeyError, TypeError) as exc:  # what it references is unknown: delete nothing
                raise CheckpointStoreError(errno.EIO, f"manifest {path} is damaged ({exc}); garbage "
                                                      "collection stopped") from exc
        return live

    def _sweep_pack(self, pack: str, refs: list[tuple[str, ChunkRef]], live: set[str], rewrite_below: float,
                    report: GarbageReport) -> None:
        total = sum(ref.length for _, ref in refs)
        kept = [(d, ref) for d, ref in refs if d in live]
        kept_bytes = sum(ref.length for _, ref in kept)
        if kept and kept_bytes >= rewrite_below * total:
            return
        for d, _ in refs:  # dead chunks too: a later save must write them again, not name a deleted pack
            del self._index[d]
        if kept:  # copy the live chunks into a new pack before the old one goes
            self.write_pack((d, self._read_ref(ref)) for d, ref in kept)
            report.packs_rewritten += 1
        for suffix in (".idx", ".pack"):
            with contextlib.suppress(FileNotFoundError):
                (self.packs / f"{pack}{suffix}").unlink()
        self._loaded.discard(pack)
        report.packs_deleted += 1
        report.bytes_freed += total - kept_bytes

    def _read_ref(self, ref: ChunkRef) -> memoryview:
        with open(self.packs / f"{ref.pack}.pack", "rb") as fh:
            fh.seek(ref.offset)
            return memoryview(fh.read(ref.length))


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


def _attempt_of(manifest: Path) -> int:
    try:
        return int(json.loads(manifest.read_bytes()).get("attempt", 0))
    except (OSError, ValueError, AttributeError):
        return 0  # unreadable: as old as can be, so it may go


class LocalDirStore(CheckpointStore):
    """The node-local fast tier (NVMe or RAM disk): no fsync, lost with the node."""

    tier = "local"
    durable = False


class SharedDirStore(CheckpointStore):
    """The persistent tier on a shared filesystem: every pack, index and manifest is fsynced before use."""

    tier = "persistent"
    durable = True


STORES: dict[str, type[CheckpointStore]] = {"local": LocalDirStore, "persistent": SharedDirStore}
