"""The writer thread's part of a save: cut the snapshot into chunks, write each tier, register the shard."""

from __future__ import annotations

import json
import logging
import time
from typing import TYPE_CHECKING

from sentinel.sdk import chunks, saving
from sentinel.sdk.stores import CheckpointStoreError

if TYPE_CHECKING:
    from sentinel.sdk.checkpoint import CheckpointManager, SaveResult

log = logging.getLogger("sentinel.sdk.checkpoint")


def write(m: CheckpointManager, job: saving.Job) -> SaveResult:
    from sentinel.sdk.checkpoint import FORMAT, CheckpointError, SaveResult

    started, step, stores = time.perf_counter(), job.step, job.stores
    try:
        specs, pieces = saving.cut_snapshot(job.snapshot, m._chunking)
        manifest = json.dumps({"format": FORMAT, "job": m.job_id, "step": step, "rank": m.rank,
                               "attempt": m.attempt, "created_at": time.time(), "skeleton": job.skeleton,
                               "tensors": [s.to_json() for s in specs]}).encode()
        written = chunks_written = 0
        for store in stores:
            with store.shared():
                store.refresh()
                n, nbytes = store.write_pack(pieces, pace=saving.pacer(m.write_bytes_per_second))
                store.put_manifest(m.job_id, step, m.rank, manifest)
            chunks_written, written = chunks_written + n, written + nbytes
    except (OSError, CheckpointStoreError) as exc:
        m.errors += 1
        log.error("checkpoint save failed: job=%d rank=%d step=%d error=%s; earlier checkpoints are untouched",
                  m.job_id, m.rank, step, exc)
        raise CheckpointError(f"checkpoint step {step} rank {m.rank}: {exc}; earlier checkpoints are "
                              "untouched") from exc
    result = SaveResult(step=step, tiers=[s.tier for s in stores], bytes_total=sum(s.nbytes for s in specs),
                        bytes_written=written, chunks_written=chunks_written, stall_seconds=job.stall,
                        write_seconds=time.perf_counter() - started, coalesced=job.coalesced)
    m._register(result, chunks.digest(manifest), stores)
    m.last_result = result
    log.info("checkpoint saved: job=%d rank=%d step=%d tiers=%s wrote=%d/%d bytes stall=%.3fs write=%.2fs%s",
             m.job_id, m.rank, step, ",".join(result.tiers), written, result.bytes_total, job.stall,
             result.write_seconds, f" replacing steps {job.coalesced}" if job.coalesced else "")
    return result
