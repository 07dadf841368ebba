"""The writer thread's part of a save: cut the snapshot into chunks, write each tier, register the shard, and
collect the steps retention retired."""

from __future__ import annotations

import json
import logging
import time
from typing import TYPE_CHECKING

from sentinel.sdk import chunks, layout, saving
from sentinel.sdk.catalog import CatalogError
from sentinel.sdk.stores import CheckpointStore, CheckpointStoreError

if TYPE_CHECKING:
    from sentinel.sdk.checkpoint import CheckpointManager, SaveResult

log = logging.getLogger("sentinel.sdk.checkpoint")


def write(m: CheckpointManager, job: saving.Job) -> SaveResult:
    from sentinel.sdk.checkpoint import FORMAT, CheckpointError, SaveResult

    started, step, stores = time.perf_counter(), job.step, job.stores
    try:
        staged, pieces = saving.cut_snapshot(job.snapshot, m._chunking)
        by_name = {spec.name: spec for spec in staged} | job.direct  # written already: saving.write_direct
        specs = [by_name[name] for name in job.order] if job.order else staged
        manifest = json.dumps({"format": FORMAT, "job": m.job_id, "step": step, "rank": m.rank,
                               "attempt": m.attempt, "created_at": time.time(), "skeleton": job.skeleton,
                               "tensors": [s.to_json() for s in specs]}).encode()
        manifest_digest = chunks.digest(manifest)
        chunks_written, written = job.direct_written
        for store in stores:
            with store.shared():
                store.refresh()
                n, nbytes = store.write_pack(pieces, pace=saving.pacer(m.write_bytes_per_second))
                layout.write_for(store, store.manifest_path(m.job_id, step, m.rank), manifest_digest, specs)
                store.put_manifest(m.job_id, step, m.rank, manifest)
            chunks_written, written = chunks_written + n, written + nbytes
    except (OSError, CheckpointStoreError) as exc:
        m.errors += 1
        log.error("checkpoint save failed: job=%d rank=%d step=%d error=%s; earlier checkpoints are untouched",
                  m.job_id, m.rank, step, exc)
        raise CheckpointError(f"checkpoint step {step} rank {m.rank}: {exc}; earlier checkpoints are "
                              "untouched") from exc
    finally:
        saving.release(job)  # the local tier's lock from the direct writes: the manifest is written now
    result = SaveResult(step=step, tiers=[s.tier for s in stores], bytes_total=sum(s.nbytes for s in specs),
                        bytes_written=written, chunks_written=chunks_written, stall_seconds=job.stall,
                        write_seconds=time.perf_counter() - started, coalesced=job.coalesced)
    register(m, result, manifest_digest, stores)
    m.last_result = result
    log.info("checkpoint saved: job=%d rank=%d step=%d tiers=%s wrote=%d/%d bytes stall=%.3fs write=%.2fs%s",
             m.job_id, m.rank, step, ",".join(result.tiers), written, result.bytes_total, job.stall,
             result.write_seconds, f" replacing steps {job.coalesced}" if job.coalesced else "")
    return result


def register(m: CheckpointManager, result: SaveResult, manifest_digest: str,
             stores: list[CheckpointStore]) -> None:
    """Tell the catalog (or, without one, count the local steps) and collect the steps it retired."""
    retire: list[tuple[int, int | None]] = []
    if m.catalog is not None:
        try:
            answer = m.catalog.register_shard(result.step, m.rank, {
                "manifest_digest": manifest_digest, "bytes_total": result.bytes_total,
                "bytes_written": result.bytes_written, "stall_seconds": result.stall_seconds,
                "write_seconds": result.write_seconds, "attempt": m.attempt,
                "locations": [s.location() for s in stores]})
        except (CatalogError, OSError) as exc:
            m.errors += 1
            log.error("checkpoint not registered: job=%d rank=%d step=%d error=%s; the files are on disk but "
                      "recovery will not use this step", m.job_id, m.rank, result.step, exc)
            return
        result.committed = bool(answer.get("committed"))
        # (step, attempt): a step a later attempt saved again keeps that attempt's manifest
        retire = [(int(r["step"]), int(r["attempt"])) for r in answer.get("retired", [])]
    else:
        result.retired = _retire_locally(m, m.local)
        # each tier by its own steps: the persistent tier saves less often, and the local tier's
        # retention must not delete its only checkpoint
        for store in (m.local, m.replica, m.persistent):
            if store is not None and (steps := _retire_locally(m, store)):
                _collect(m, [(step, None) for step in steps], [store])
        return
    result.retired = [step for step, _ in retire]
    fresh = [entry for entry in retire if entry not in m._collected]  # a collection reads every manifest
    if fresh:
        _collect(m, fresh, [m.local, m.replica, m.persistent])
        m._collected.update(fresh)


def _retire_locally(m: CheckpointManager, store: CheckpointStore) -> list[int]:
    from sentinel.sdk.checkpoint import retained_steps

    steps = list(store.steps(m.job_id))
    return sorted(set(steps) - retained_steps(steps, keep_last=m.keep_last, keep_every=m.keep_every))


def _collect(m: CheckpointManager, steps: list[tuple[int, int | None]],
             stores: list[CheckpointStore | None]) -> None:
    for store in stores:
        if store is None or not store.root.exists():
            continue
        try:
            report = store.collect_garbage(retire=[(m.job_id, s, a) for s, a in steps])
        except (OSError, TimeoutError) as exc:
            log.warning("checkpoint garbage collection skipped: store=%s error=%s", store.root, exc)
            continue
        if report.bytes_freed or report.manifests_deleted:
            log.info("checkpoint garbage collected: store=%s retired_steps=%s freed=%d bytes packs_deleted=%d "
                     "(%d kept as spares for the next saves to overwrite)", store.root, [s for s, _ in steps],
                     report.bytes_freed, report.packs_deleted, report.packs_spared)
