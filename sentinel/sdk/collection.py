"""Garbage collection of a checkpoint store: retired manifests, then the packs no manifest names.

It runs under the store's exclusive lock, so no save is between checking a chunk and naming it. A pack that is
all dead is kept as a spare for the next save to overwrite (while spares stay within the live bytes: see
sentinel.sdk.stores), or deleted; one mostly dead is rewritten with its live chunks only.
"""

from __future__ import annotations

import contextlib
import errno
import json
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from sentinel.sdk import chunks, layout
from sentinel.sdk.chunkindex import ChunkRef

if TYPE_CHECKING:
    from sentinel.sdk.stores import CheckpointStore


@dataclass
class GarbageReport:
    manifests_deleted: int = 0
    packs_deleted: int = 0
    packs_rewritten: int = 0
    bytes_freed: int = 0  # of checkpoint data: retired or torn packs, whether deleted or kept as spares
    live_chunks: int = 0
    packs_spared: int = 0  # of the packs deleted, kept as spares (their bytes stay on disk until reused)
    bytes_spared: int = 0
    layouts_rewritten: int = 0  # naming a pack this collection rewrote (sentinel.sdk.layout)


def collect_garbage(store: CheckpointStore, *,
                    retire: Iterable[tuple[int, int] | tuple[int, int, int | None]] = (),
                    timeout_seconds: float = 60.0, rewrite_below: float = 0.5) -> GarbageReport:
    """Delete the manifests of retired (job, step[, attempt])s, then every chunk no remaining manifest names.

    With an attempt, only manifests written by that attempt or an older one go: a restarted job that
    saved the step again keeps its own.

    Runs under the exclusive lock, so no save is between checking a chunk and naming it. A pack
    whose live share fell under `rewrite_below` is rewritten with its live chunks only.
    """
    report = GarbageReport()
    with store.exclusive(timeout_seconds):
        for job, step, *rest in retire:
            attempt = rest[0] if rest else None
            step_dir = store.manifest_path(job, step, 0).parent
            for path in step_dir.glob("*.json"):
                if attempt is not None and _attempt_of(path) > attempt:
                    continue
                path.unlink()
                layout.path(path).unlink(missing_ok=True)
                report.manifests_deleted += 1
            with contextlib.suppress(OSError):
                step_dir.rmdir()
        live = _live_digests(store)
        report.live_chunks = len(live)
        store.refresh()
        # a pack whose chunks are all indexed in other packs too (two saves wrote them) has no refs: all dead
        by_pack = store._index.by_pack(store._loaded)
        for leftover in [*store.packs.glob(".*.tmp"), *store.manifests.glob("job-*/step-*/.*.tmp")]:
            leftover.unlink(missing_ok=True)  # a writer killed between writing and renaming
        for path in store.packs.glob("*.pack"):
            if path.name[:-5] not in store._loaded:  # torn: its writer died before the index
                report.bytes_freed += path.stat().st_size
                path.unlink()
                report.packs_deleted += 1
        spare_room = _spare_room(store, by_pack, live)
        for pack, refs in by_pack.items():
            spare_room -= _sweep_pack(store, pack, refs, live, rewrite_below, spare_room, report)
        report.layouts_rewritten = layout.repair(store)  # live chunks moved, or a writer left one behind
    return report


def _spare_room(store: CheckpointStore, by_pack: dict[str, list[tuple[str, ChunkRef]]], live: set[str]) -> int:
    """Bytes of dead packs that may be kept as spares: up to the live bytes, less the spares already kept."""
    live_bytes = sum(ref.length for refs in by_pack.values() for d, ref in refs if d in live)
    spares = 0
    for path in store.packs.glob("*.spare"):
        with contextlib.suppress(FileNotFoundError):
            spares += path.stat().st_size
    return live_bytes - spares


def _live_digests(store: CheckpointStore) -> set[str]:
    from sentinel.sdk import stores

    live: set[str] = set()
    for path in store.manifests.glob("job-*/step-*/rank-*.json"):
        try:
            manifest = json.loads(path.read_bytes())
            for tensor in manifest["tensors"]:
                live.update(chunks.manifest_digests(tensor))
        except (ValueError, KeyError, TypeError) as exc:  # what it references is unknown: delete nothing
            raise stores.CheckpointStoreError(errno.EIO, f"manifest {path} is damaged ({exc}); garbage "
                                                  "collection stopped") from exc
    return live


def _sweep_pack(store: CheckpointStore, pack: str, refs: list[tuple[str, ChunkRef]], live: set[str],
                rewrite_below: float, spare_room: int, report: GarbageReport) -> int:
    """Delete or rewrite a pack that is (mostly) dead; returns the bytes it left as a spare."""
    total = sum(ref.length for _, ref in refs)
    kept = [(d, ref) for d, ref in refs if d in live]
    kept_bytes = sum(ref.length for _, ref in kept)
    if kept and kept_bytes >= rewrite_below * total:
        return 0
    store._index.forget([d for d, _ in refs])  # dead ones too: a later save writes them, not names a lost pack
    if kept:  # copy the live chunks into a new pack before the old one goes
        store.write_pack((d, _read_ref(store, ref)) for d, ref in kept)
        report.packs_rewritten += 1
    with contextlib.suppress(FileNotFoundError):
        (store.packs / f"{pack}.idx").unlink()  # first: from here on nothing names its chunks
    store._loaded.discard(pack)
    report.packs_deleted += 1
    report.bytes_freed += total - kept_bytes
    pack_path = store.packs / f"{pack}.pack"
    try:
        size = pack_path.stat().st_size
        if 0 < size <= spare_room:
            pack_path.rename(store.packs / f"{pack}.spare")
            report.packs_spared += 1
            report.bytes_spared += size
            return size
        pack_path.unlink()
    except FileNotFoundError:
        pass
    return 0


def _read_ref(store: CheckpointStore, ref: ChunkRef) -> memoryview:
    with open(store.packs / f"{ref.pack}.pack", "rb") as fh:
        fh.seek(ref.offset)
        return memoryview(fh.read(ref.length))


def _attempt_of(manifest: Path) -> int:
    try:
        return int(json.loads(manifest.read_bytes()).get("attempt", 0))
    except (OSError, ValueError, AttributeError):
        return 0  # unreadable: as old as can be, so it may go
