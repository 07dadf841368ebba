"""CheckpointManager: tiered, incremental, verified checkpoints that block training only for a snapshot.

    ckpt = CheckpointManager()                      # job, rank, node, dirs and server from SENTINEL_*
    restored = ckpt.restore()                       # the server's recovery plan, every chunk verified
    for step in range(start, steps):
        train_one_step()
        ckpt.save(step + 1, {"model": model.state_dict(), "optim": opt.state_dict()})
    ckpt.close()

`save` copies the state into reused host buffers (the only part the loop waits for), then a writer
thread hashes it into chunks, writes the chunks each tier lacks, writes the rank's manifest and
registers the shard with the catalog. The local tier is written every `every` steps (and copied to a
peer node's local tier when `replica_node` is set), the persistent tier every `persistent_every`.
After `ckpt.guard(optimizer)` even that copy overlaps the next forward and backward: the parameters
and optimizer state are copied on the writer thread and `optimizer.step()` waits until they are.
"""

from __future__ import annotations

import json
import logging
import os
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from contextlib import AbstractContextManager, nullcontext
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from sentinel.sdk import chunks
from sentinel.sdk.catalog import Catalog, CatalogError
from sentinel.sdk.stores import CheckpointStore, CheckpointStoreError, LocalDirStore, SharedDirStore
from sentinel.sdk.telemetry import env_int

log = logging.getLogger("sentinel.sdk.checkpoint")
FORMAT = 1


class CheckpointError(RuntimeError):
    pass


class CorruptCheckpoint(CheckpointError):
    """A manifest or chunk does not match its digest: the bytes on disk are not the bytes written."""


@dataclass
class SaveResult:
    step: int
    tiers: list[str]
    bytes_total: int
    bytes_written: int
    chunks_written: int
    stall_seconds: float
    write_seconds: float
    committed: bool | None = None  # None without a catalog
    retired: list[int] = field(default_factory=list)


@dataclass
class Restored:
    step: int
    state: Any
    location: dict[str, str]
    skipped: list[str] = field(default_factory=list)  # what was tried first and why it was refused


def retained_steps(steps: list[int], *, keep_last: int, keep_every: int = 0) -> set[int]:
    """The last `keep_last` steps, plus every step that is a multiple of `keep_every` (0: none)."""
    ordered = sorted(set(steps))
    keep = set(ordered[-keep_last:]) if keep_last > 0 else set()
    if keep_every > 0:
        keep.update(s for s in ordered if s % keep_every == 0)
    return keep


class CheckpointManager:
    def __init__(self, *, job_id: int | None = None, rank: int | None = None, node: str | None = None,
                 local_dir: str | None = None, persistent_dir: str | None = None, replica_node: str | None = None,
                 every: int = 1, persistent_every: int = 10, keep_last: int = 3, keep_every: int = 0,
                 chunk_bytes: int = chunks.DEFAULT_CHUNK_BYTES, row_chunk_bytes: int = chunks.DEFAULT_ROW_CHUNK_BYTES,
                 row_chunked: tuple[str, ...] = chunks.ROW_CHUNKED, catalog: Catalog | bool | None = True,
                 write_bytes_per_second: float | None = None, attempt: int | None = None):
        self.job_id = job_id if job_id is not None else (env_int("SENTINEL_JOB_ID") or 0)
        self.rank = rank if rank is not None else (env_int("SENTINEL_RANK", "RANK") or 0)
        attempt = attempt if attempt is not None else env_int("SENTINEL_ATTEMPT", "TORCHELASTIC_RESTART_COUNT")
        self.attempt = attempt or 0  # under torchrun too: a restarted attempt may save a step again
        self.node = node or os.environ.get("SENTINEL_NODE") or os.uname().nodename
        self.local_template = (local_dir or os.environ.get("SENTINEL_CHECKPOINT_LOCAL_DIR")
                               or os.path.join(tempfile.gettempdir(), "sentinel-checkpoints", "{node}"))
        persistent = persistent_dir or os.environ.get("SENTINEL_CHECKPOINT_PERSISTENT_DIR")
        peer = replica_node or os.environ.get("SENTINEL_CHECKPOINT_REPLICA_NODE") or None
        peer = peer if peer != self.node else None  # a rank moved onto its replica node keeps one copy
        self.local = LocalDirStore(self.local_template.format(node=self.node), node=self.node)
        self.replica = LocalDirStore(self.local_template.format(node=peer), node=peer) if peer else None
        self.persistent = SharedDirStore(persistent) if persistent else None
        self.every, self.persistent_every = max(1, every), max(1, persistent_every)
        self.keep_last, self.keep_every = keep_last, keep_every
        self._chunking = {"chunk_bytes": chunk_bytes, "row_chunk_bytes": row_chunk_bytes, "row_chunked": row_chunked}
        self.catalog = (Catalog.from_env(self.job_id) if catalog is True else catalog or None)
        self.write_bytes_per_second = write_bytes_per_second
        self._staging: dict[str, Any] = {}
        self._writer = ThreadPoolExecutor(max_workers=1, thread_name_prefix="sentinel-checkpoint")
        self._inflight: Future[SaveResult] | None = None
        self._lock = threading.Lock()
        self._guarded: list[Any] = []  # optimizers whose step() waits for the snapshot (guard())
        self._snapshotted = threading.Event()
        self._snapshotted.set()
        self._guard_wait = 0.0  # what the guarded optimizers' step() waited for the current snapshot
        self._waiting_since: float | None = None  # when a guarded step() began to wait for it
        self._collected: set[tuple[int, int | None]] = set()  # retired (step, attempt)s already collected
        self.last_result: SaveResult | None = None
        self.errors = 0

    def __repr__(self) -> str:
        return f"CheckpointManager(job={self.job_id}, rank={self.rank}, node={self.node!r})"

    # -- saving -----------------------------------------------------------------------------------------
    def tiers_for(self, step: int) -> list[CheckpointStore]:
        stores: list[CheckpointStore] = []
        if step % self.every == 0:
            stores.append(self.local)
            if self.replica is not None:
                stores.append(self.replica)
        if self.persistent is not None and step % self.persistent_every == 0:
            stores.append(self.persistent)
        return stores

    def save(self, step: int, state: Any) -> Future[SaveResult] | None:
        """Snapshot `state` and write it in the background; None when no tier is due at this step."""
        stores = self.tiers_for(step)
        if not stores:
            return None
        started = time.perf_counter()
        with _paused():  # the loop waits here on purpose: the server does not judge it hung meanwhile
            self.wait()  # one save in flight: its buffers are the ones we are about to overwrite
            skeleton, tensors = chunks.flatten(state)
            guarded = self._guarded_storage()
            later = {name: value for name, value in tensors.items() if guarded and _storage(value) in guarded}
            snapshot = {name: self._stage(name, value) for name, value in tensors.items() if name not in later}
        stall = time.perf_counter() - started
        if later:
            self._guard_wait, self._waiting_since = 0.0, None
            self._snapshotted.clear()
        future = self._writer.submit(self._snapshot_and_write, step, skeleton, snapshot, later, stores, stall)
        with self._lock:
            self._inflight = future
        return future

    def guard(self, *optimizers: Any) -> None:
        """Overlap the snapshot with the next forward and backward passes (as CheckFreq does).

        From now on `save` copies before it returns only what these optimizers do not own (buffers such as
        BatchNorm's running stats, plain values); their parameters and state are copied by the writer
        thread, and each optimizer's `step()` waits for that copy, so no update lands in the middle of it.
        """
        for optimizer in optimizers:
            optimizer.register_step_pre_hook(lambda *_: self.wait_snapshot())
            self._guarded.append(optimizer)

    def wait_snapshot(self) -> None:
        """Block until the save in flight has copied the guarded tensors (called by guarded optimizers)."""
        if not self._snapshotted.is_set():
            if self._waiting_since is None:
                self._waiting_since = time.perf_counter()  # the writer turns this into the save's stall
            with _paused():
                self._snapshotted.wait()

    def _guarded_storage(self) -> set[int]:
        owned: set[int] = set()
        for optimizer in self._guarded:
            owned.update(p.data_ptr() for group in optimizer.param_groups for p in group["params"] if p.numel())
            for per_param in optimizer.state.values():
                owned.update(v.data_ptr() for v in per_param.values() if chunks.is_tensor(v) and v.numel())
        return owned

    def _snapshot_and_write(self, step: int, skeleton: Any, snapshot: dict[str, Any], later: dict[str, Any],
                            stores: list[CheckpointStore], stall: float) -> SaveResult:
        try:
            for name, value in later.items():
                snapshot[name] = self._stage(name, value)
        finally:
            done = time.perf_counter()
            self._snapshotted.set()
            waiting_since, self._waiting_since = self._waiting_since, None
            self._guard_wait = done - waiting_since if waiting_since is not None else 0.0
        return self._write(step, skeleton, snapshot, stores, stall)

    def _stage(self, name: str, value: Any) -> Any:
        """Copy into this tensor's host buffer from the last save (allocating only when the shape changed)."""
        buffer = self._staging.get(name)
        if isinstance(value, np.ndarray):
            if not (isinstance(buffer, np.ndarray) and buffer.shape == value.shape and buffer.dtype == value.dtype):
                buffer = self._staging[name] = np.empty_like(value, order="C")
            np.copyto(buffer, value)
            return buffer
        torch = sys.modules["torch"]
        if not (isinstance(buffer, torch.Tensor) and buffer.shape == value.shape and buffer.dtype == value.dtype):
            pin = value.device.type == "cuda"
            buffer = self._staging[name] = torch.empty(value.shape, dtype=value.dtype, pin_memory=pin)
        buffer.copy_(value.detach(), non_blocking=value.device.type == "cuda")
        if value.device.type == "cuda":
            torch.cuda.current_stream(value.device).synchronize()
        return buffer

    def wait(self) -> SaveResult | None:
        """Block until the save in flight is written; returns its result (its error is logged, not raised)."""
        with self._lock:
            future, self._inflight = self._inflight, None
        if future is None:
            return None
        try:
            return future.result()
        except Exception:
            return None

    def close(self) -> None:
        with _paused():
            self.wait()
        self._writer.shutdown(wait=True)

    def _pace(self) -> Callable[[int], None] | None:
        if not self.write_bytes_per_second:
            return None
        rate, start, done = float(self.write_bytes_per_second), time.monotonic(), [0]

        def pace(nbytes: int) -> None:
            done[0] += nbytes
            ahead = done[0] / rate - (time.monotonic() - start)
            if ahead > 0:
                time.sleep(ahead)

        return pace

    def _write(self, step: int, skeleton: Any, snapshot: dict[str, Any], stores: list[CheckpointStore],
               stall: float) -> SaveResult:
        started = time.perf_counter()
        try:
            specs, pieces = self._chunk(snapshot)
            manifest = json.dumps({"format": FORMAT, "job": self.job_id, "step": step, "rank": self.rank,
                                   "attempt": self.attempt, "created_at": time.time(), "skeleton": skeleton,
                                   "tensors": [s.to_json() for s in specs]}).encode()
            written = chunks_written = 0
            for store in stores:
                with store.shared():
                    store.refresh()
                    n, nbytes = store.write_pack(pieces, pace=self._pace())
                    store.put_manifest(self.job_id, step, self.rank, manifest)
                chunks_written, written = chunks_written + n, written + nbytes
        except (OSError, CheckpointStoreError) as exc:
            self.errors += 1
            log.error("checkpoint save failed: job=%d rank=%d step=%d error=%s; earlier checkpoints are untouched",
                      self.job_id, self.rank, step, exc)
            raise CheckpointError(f"checkpoint step {step} rank {self.rank}: {exc}; earlier checkpoints are "
                                  "untouched") from exc
        stall += self._guard_wait  # what guarded optimizers waited for the snapshot (0 without guard())
        result = SaveResult(step=step, tiers=[s.tier for s in stores], bytes_total=sum(s.nbytes for s in specs),
                            bytes_written=written, chunks_written=chunks_written, stall_seconds=stall,
                            write_seconds=time.perf_counter() - started)
        self._register(result, chunks.digest(manifest), stores)
        self.last_result = result
        log.info("checkpoint saved: job=%d rank=%d step=%d tiers=%s wrote=%d/%d bytes stall=%.3fs write=%.2fs",
                 self.job_id, self.rank, step, ",".join(result.tiers), written, result.bytes_total, stall,
                 result.write_seconds)
        return result

    def _chunk(self, snapshot: dict[str, Any]) -> tuple[list[chunks.TensorSpec], list[tuple[str, memoryview]]]:
        specs: list[chunks.TensorSpec] = []
        pieces: list[tuple[str, memoryview]] = []
        for name, buffer in snapshot.items():
            data = _bytes_of(buffer)
            size = chunks.chunk_bytes_for(name, list(buffer.shape), buffer.element_size()
                                          if not isinstance(buffer, np.ndarray) else buffer.itemsize,
                                          **self._chunking)  # type: ignore[arg-type]
            spec = chunks.TensorSpec(name=name, dtype=chunks.dtype_name(buffer), shape=list(buffer.shape),
                                     nbytes=len(data), chunk_bytes=size)
            for piece in chunks.cut(data, size):
                d = chunks.digest(piece)
                spec.chunks.append(d)
                pieces.append((d, piece))
            specs.append(spec)
        return specs, pieces

    def _register(self, result: SaveResult, manifest_digest: str, stores: list[CheckpointStore]) -> None:
        retire: list[tuple[int, int | None]] = []
        if self.catalog is not None:
            try:
                answer = self.catalog.register_shard(result.step, self.rank, {
                    "manifest_digest": manifest_digest, "bytes_total": result.bytes_total,
                    "bytes_written": result.bytes_written, "stall_seconds": result.stall_seconds,
                    "write_seconds": result.write_seconds, "attempt": self.attempt,
                    "locations": [s.location() for s in stores]})
            except (CatalogError, OSError) as exc:
                self.errors += 1
                log.error("checkpoint not registered: job=%d rank=%d step=%d error=%s; the files are on disk but "
                          "recovery will not use this step", self.job_id, self.rank, result.step, exc)
                return
            result.committed = bool(answer.get("committed"))
            # (step, attempt): a step a later attempt saved again keeps that attempt's manifest
            retire = [(int(r["step"]), int(r["attempt"])) for r in answer.get("retired", [])]
        else:
            result.retired = self._retire_locally(self.local)
            # each tier by its own steps: the persistent tier saves less often, and the local tier's
            # retention must not delete its only checkpoint
            for store in (self.local, self.replica, self.persistent):
                if store is not None and (steps := self._retire_locally(store)):
                    self._collect([(step, None) for step in steps], [store])
            return
        result.retired = [step for step, _ in retire]
        fresh = [entry for entry in retire if entry not in self._collected]  # a collection reads every manifest
        if fresh:
            self._collect(fresh, [self.local, self.replica, self.persistent])
            self._collected.update(fresh)

    def _retire_locally(self, store: CheckpointStore) -> list[int]:
        steps = list(store.steps(self.job_id))
        return sorted(set(steps) - retained_steps(steps, keep_last=self.keep_last, keep_every=self.keep_every))

    def _collect(self, steps: list[tuple[int, int | None]], stores: list[CheckpointStore | None]) -> None:
        for store in stores:
            if store is None or not store.root.exists():
                continue
            try:
                report = store.collect_garbage(retire=[(self.job_id, s, a) for s, a in steps])
            except (OSError, TimeoutError) as exc:
                log.warning("checkpoint garbage collection skipped: store=%s error=%s", store.root, exc)
                continue
            if report.bytes_freed or report.manifests_deleted:
                log.info("checkpoint garbage collected: store=%s retired_steps=%s freed=%d bytes packs_deleted=%d",
                         store.root, [s for s, _ in steps], report.bytes_freed, report.packs_deleted)

    # -- restoring --------------------------------------------------------------------------------------
    def restore(self, step: int | None = None, *, agree: Callable[[int], int] | None = None) -> Restored | None:
        """Load this rank's shard of the newest usable step (the server's plan), or of `step`.

        Every manifest and chunk is verified. With a plan, a shard that fails verification is reported
        and the plan is asked again (it then falls back). `agree(step)` returns the minimum over ranks
        (see sentinel.sdk.torch.agree_min) so that every rank loads the same step; -1 means "failed".
        None: nothing to restore, start from scratch.
        """
        from sentinel.sdk.restore import restore

        restored = restore(self, step, agree)
        if restored is not None:
            _resume_telemetry(restored.step)
        return restored

    def store_for(self, location: dict[str, str]) -> CheckpointStore:
        if location.get("tier") == "persistent":
            if self.persistent is not None and str(self.persistent.root) == location.get("uri"):
                return self.persistent
            return SharedDirStore(location["uri"])
        node = location.get("node") or ""
        if node == self.node:
            return self.local
        if self.replica is not None and node == self.replica.node:
            return self.replica
        return LocalDirStore(self.local_template.format(node=node), node=node)


def _storage(value: Any) -> int:
    """Where a tensor's data lives (0 for arrays and empty tensors: never guarded)."""
    return int(value.data_ptr()) if not isinstance(value, np.ndarray) and value.numel() else 0


def _bytes_of(buffer: Any) -> memoryview:
    if isinstance(buffer, np.ndarray):
        return buffer.reshape(-1).view(np.uint8).data
    torch = sys.modules["torch"]
    if buffer.numel() == 0:
        return memoryview(b"")
    return memoryview(buffer.reshape(-1).view(torch.uint8).numpy())


def _paused() -> AbstractContextManager[None]:
    """The process's telemetry marks a checkpoint pause (nothing without one)."""
    import sentinel.sdk

    telemetry = sentinel.sdk._default
    return telemetry.pause("checkpoint") if telemetry is not None else nullcontext()


def _resume_telemetry(step: int) -> None:
    """The SDK's step counter continues from the restored step, so lost work is counted right."""
    import sentinel.sdk

    telemetry = sentinel.sdk._default
    if telemetry is not None:
        telemetry.resume_at(step)

