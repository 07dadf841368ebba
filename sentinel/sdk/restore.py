"""Loading a checkpoint back: follow the plan, verify every byte, fall back when something is wrong."""

from __future__ import annotations

import json
import logging
import os
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from typing import TYPE_CHECKING, Any

from sentinel.sdk import chunks, layout, packread
from sentinel.sdk.catalog import CatalogError
from sentinel.sdk.stores import CheckpointStore, CheckpointStoreError

if TYPE_CHECKING:
    from sentinel.sdk.checkpoint import CheckpointManager, Restored

log = logging.getLogger("sentinel.sdk.checkpoint")
MAX_ROUNDS = 8
PREFAULT_BYTES = 1 << 20
READERS = max(1, min(4, os.cpu_count() or 1))  # tensors (or ranges of one) read and verified at once
RANGE_BYTES = 16 << 20  # a tensor read through its layout goes in ranges of about this many bytes


def restore(m: CheckpointManager, step: int | None, agree: Callable[[int], int] | None) -> Restored | None:
    if step is not None:
        return load_step(m, step, [s.location() for s in _stores(m)], None, [])
    if m.catalog is None:
        return _restore_without_catalog(m, agree)
    return _restore_from_plan(m, agree)


def _stores(m: CheckpointManager) -> list[CheckpointStore]:
    return [s for s in (m.local, m.replica, m.persistent) if s is not None]


def _restore_from_plan(m: CheckpointManager, agree: Callable[[int], int] | None) -> Restored | None:
    from sentinel.sdk.checkpoint import CheckpointError

    assert m.catalog is not None
    skipped: list[str] = []
    for _ in range(MAX_ROUNDS):
        plan = m.catalog.recovery_plan()
        step = plan.get("step")
        if step is None:
            if skipped or plan.get("skipped"):
                _from_scratch(m, skipped + list(plan.get("skipped", [])))
            return None
        shard = next((r for r in plan.get("ranks", []) if int(r["rank"]) == m.rank), None)
        restored = None
        if shard is None:
            skipped.append(f"step {step}: the plan has no shard for rank {m.rank}")
            if agree is None:
                return None  # a serving replica that never saved: it starts fresh
        else:
            own = int(shard.get("step", step))  # a serving replica's own newest step
            try:
                restored = load_step(m, own, shard["locations"], shard.get("manifest_digest"), skipped)
            except CheckpointError as exc:  # load_step put each location's problem in `skipped`
                try:
                    m.catalog.report_invalid(own, m.rank, str(exc))
                except (CatalogError, OSError) as report_error:
                    raise CheckpointError(f"{exc}; and the catalog could not be told: {report_error}") from exc
        if agree is not None and agree(int(step) if restored is not None else -1) != int(step):
            continue  # a rank could not load this step; it told the catalog, so the next plan is older
        if restored is not None:
            restored.skipped = skipped
            return restored
    raise CheckpointError(f"job {m.job_id} rank {m.rank}: no usable checkpoint after {MAX_ROUNDS} plans: "
                          + "; ".join(skipped[-MAX_ROUNDS:]))


def _restore_without_catalog(m: CheckpointManager, agree: Callable[[int], int] | None) -> Restored | None:
    from sentinel.sdk.checkpoint import CheckpointError

    available: dict[int, list[CheckpointStore]] = {}
    for store in _stores(m):
        for step, ranks in store.steps(m.job_id).items():
            if m.rank in ranks:
                available.setdefault(step, []).append(store)
    skipped: list[str] = []
    ceiling: int | None = None
    while True:
        restored = None
        for step in sorted(available, reverse=True):
            if ceiling is not None and step > ceiling:
                continue
            try:
                restored = load_step(m, step, [s.location() for s in available[step]], None, skipped)
                break
            except CheckpointError:
                continue  # load_step put each location's problem in `skipped`
        proposal = restored.step if restored is not None else -1
        agreed = agree(proposal) if agree is not None else proposal
        if agreed == proposal:
            if restored is not None:
                restored.skipped = skipped
            elif skipped:
                _from_scratch(m, skipped)
            return restored
        if agreed < 0:
            return None
        ceiling = agreed


def _from_scratch(m: CheckpointManager, skipped: list[str]) -> None:
    """Checkpoints exist but none is usable: say so loudly, the job is about to redo everything."""
    log.warning("no usable checkpoint, starting from scratch: job=%d rank=%d passed_over=%s", m.job_id, m.rank,
                "; ".join(skipped[-5:]))


def load_step(m: CheckpointManager, step: int, locations: list[dict[str, str]], manifest_digest: str | None,
              skipped: list[str]) -> Restored:
    """This rank's shard of `step` from the first location that reads back intact."""
    from sentinel.sdk.checkpoint import CheckpointError, CorruptCheckpoint, Restored

    problems: list[str] = []
    corrupt = False
    for location in locations:
        store = m.store_for(location)
        where = f"{store.root} ({store.tier} tier{', node ' + store.node if store.node else ''})"
        try:
            with store.shared():
                state = _load(store, m.job_id, step, m.rank, manifest_digest, where)
            return Restored(step=step, state=state, location=store.location(), skipped=skipped)
        except CorruptCheckpoint as exc:
            corrupt = True
            problems.append(str(exc))
        except (CheckpointStoreError, OSError, ValueError, KeyError) as exc:
            problems.append(f"step {step} rank {m.rank} at {where}: {exc}")
        skipped.append(problems[-1])
    if not locations:
        problems.append(f"step {step} rank {m.rank}: no location holds it")
        skipped.append(problems[-1])
    cls = CorruptCheckpoint if corrupt else CheckpointError
    raise cls("; ".join(problems))


def _load(store: CheckpointStore, job: int, step: int, rank: int, manifest_digest: str | None, where: str) -> Any:
    """With a layout, the reads start first and the manifest is parsed meanwhile (a table of small chunks
    has a manifest of megabytes); nothing read is used before the manifest's digests agree with it."""
    from sentinel.sdk.checkpoint import CorruptCheckpoint

    path, label = store.manifest_path(job, step, rank), f"step {step} rank {rank} at {where}"
    plan, raw = layout.read(path), store.get_manifest(job, step, rank)
    with ThreadPoolExecutor(max_workers=READERS, thread_name_prefix="sentinel-restore") as pool:
        started = [_start(pool, store, *tensor) for tensor in plan.tensors] if plan else []
        try:
            raw_digest = chunks.digest(raw)
            if manifest_digest is not None and raw_digest != manifest_digest:
                raise CorruptCheckpoint(f"{label}: the manifest {path} does not match the digest the catalog "
                                        f"recorded ({manifest_digest}); it was changed after it was written")
            try:
                manifest = json.loads(raw)
                specs = [chunks.TensorSpec.from_json(t) for t in manifest["tensors"]]
                skeleton = manifest["skeleton"]
            except (ValueError, KeyError, TypeError) as exc:
                raise CorruptCheckpoint(f"{label}: the manifest {path} is damaged ({exc!r})") from exc
        except BaseException:
            pool.shutdown(cancel_futures=True)
            raise
        loaded: list[Any] = [None] * len(specs)
        if plan is not None and plan.fits(raw_digest, specs):
            loaded = [_verified(spec, *one) for spec, one in zip(specs, started, strict=True)]
        rest = [i for i, tensor in enumerate(loaded) if tensor is None]
        if rest:
            if plan is not None:
                log.info("checkpoint layout stale, reading through the chunk index: %s tensors=%d of %d", label,
                         len(rest), len(specs))
            store.refresh()
            for i, tensor in zip(rest, pool.map(lambda i: _tensor(store, specs[i], label), rest), strict=True):
                loaded[i] = tensor
    return chunks.unflatten(skeleton, {spec.name: tensor for spec, tensor in zip(specs, loaded, strict=True)})


def _start(pool: ThreadPoolExecutor, store: CheckpointStore, spec: chunks.TensorSpec, extents: layout.Extents
           ) -> tuple[Any, memoryview, list[Future[list[str] | None]]]:
    """A tensor's reads started where its layout says, range by range in parallel; each range returns the
    digests of the pieces it holds (`spec.chunk_bytes` each, from the layout), checked once the manifest is."""
    tensor, view = chunks.empty_like_spec(spec)
    how = packread.plan(extents.names.__getitem__, extents.packs, extents.offsets, extents.positions,
                        extents.lengths)
    unit = spec.chunk_bytes
    step = max(unit, RANGE_BYTES // unit * unit) if unit else RANGE_BYTES
    futures = [pool.submit(_range, store, how, view, at, min(at + step, spec.nbytes), unit)
               for at in range(0, spec.nbytes, step)] if how is not None else []
    return tensor, view, futures


def _range(store: CheckpointStore, how: packread.Plan, view: memoryview, start: int, stop: int,
           unit: int) -> list[str] | None:
    try:
        packread.read_range(store, how, view, start, stop)
    except (CheckpointStoreError, OSError, IndexError):
        return None  # a pack gone or cut short: the index path decides
    return [chunks.digest(view[at:min(at + unit, stop)]) for at in range(start, stop, unit)] if unit else []


def _verified(spec: chunks.TensorSpec, tensor: Any, view: memoryview, ranges: list[Future[list[str] | None]]) -> Any:
    """The tensor if its bytes match the manifest's digests, else None."""
    got = [future.result() for future in ranges]
    if any(digests is None for digests in got):
        return None
    units = spec.check_units()
    if units is None:
        return tensor if chunks.digest(view) == spec.digest else None
    return tensor if [d for digests in got if digests for d in digests] == units[1] else None


def _tensor(store: CheckpointStore, spec: chunks.TensorSpec, where: str) -> Any:
    """One tensor read into fresh memory and verified (reads and digests release the GIL: tensors go in
    parallel). With digests of its segments (or, format 1, of all its bytes), one pass checks it; a mismatch
    is then found chunk by chunk."""
    from sentinel.sdk.checkpoint import CorruptCheckpoint

    tensor, view = chunks.empty_like_spec(spec)
    touch = None  # fresh pages faulted in first (while the reads are planned): inside read() it is slower
    if spec.nbytes >= PREFAULT_BYTES:
        touch = tensor.zero_ if hasattr(tensor, "zero_") else lambda: tensor.fill(0)
    store.read_chunks(spec.chunks, view, touch)
    if spec.digest is not None and chunks.digest(view) == spec.digest:
        return tensor
    size = spec.segment_bytes
    if spec.segments and all(chunks.digest(view[i * size:(i + 1) * size]) == expected
                             for i, expected in enumerate(spec.segments)):
        return tensor
    for index, expected in enumerate(spec.chunks):
        piece = view[index * spec.chunk_bytes:(index + 1) * spec.chunk_bytes]
        actual = chunks.digest(piece)
        if actual != expected:
            ref = store.chunk_ref(expected)
            place = f"{store.packs / (ref.pack + '.pack')} offset {ref.offset}" if ref else "unknown pack"
            raise CorruptCheckpoint(
                f"{where}: tensor {spec.name!r} chunk {index + 1} of {len(spec.chunks)} is corrupt (expected "
                f"digest {expected}, read {actual}; {place})")
    if spec.digest is not None or spec.segments:
        raise CorruptCheckpoint(f"{where}: tensor {spec.name!r} does not match its digest"
                                f"{' (' + spec.digest + ')' if spec.digest else 's of its segments'} although each "
                                "chunk does: the manifest is inconsistent")
    return tensor
