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
By default (`guard=True`, SENTINEL_CHECKPOINT_GUARD) even that copy overlaps the next forward and backward:
the parameters and state of every torch optimizer seen stepping are copied on a stage thread, and the next
`optimizer.step()` waits until they are (a global step pre-hook). Each such tensor's version counter is
checked after its copy: one changed in place meanwhile (not by a step) fails that save instead of writing a
torn checkpoint, and turns the overlap off for the rest of the run.
"""

from __future__ import annotations

import contextlib
import logging
import os
import tempfile
import threading
import time
import weakref
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from contextlib import AbstractContextManager, nullcontext
from dataclasses import dataclass, field
from typing import Any

from sentinel.sdk import chunks, guarding, saving
from sentinel.sdk.catalog import Catalog
from sentinel.sdk.stores import CheckpointStore, LocalDirStore, SharedDirStore
from sentinel.sdk.telemetry import env_int

log = logging.getLogger("sentinel.sdk.checkpoint")
FORMAT = 2  # 2: a tensor of many chunks lists their digests as one string (chunks_hex)


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
    outcome: str = "written"  # or "coalesced" (a newer save replaced it before it began) or "skipped"
    superseded_by: int | None = None  # the step whose save replaced this one (outcome "coalesced")
    coalesced: list[int] = field(default_factory=list)  # older steps whose queued saves this one replaced


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
                 write_bytes_per_second: float | None = None, attempt: int | None = None,
                 optimizers: tuple[Any, ...] | list[Any] = (), when_busy: str | None = None,
                 writer_niceness: int = saving.WRITER_NICENESS, guard: bool | None = None):
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
        self.when_busy = when_busy or os.environ.get("SENTINEL_CHECKPOINT_WHEN_BUSY") or "coalesce"
        if self.when_busy not in saving.WHEN_BUSY:
            raise ValueError(f"when_busy must be one of {saving.WHEN_BUSY}, not {self.when_busy!r}")
        self._staging: list[dict[str, Any]] = [{} for _ in range(saving.SLOTS)]  # one buffer set per slot
        self._slot = 0
        self._stager = ThreadPoolExecutor(max_workers=1, thread_name_prefix="sentinel-checkpoint-stage")
        self._writer = ThreadPoolExecutor(max_workers=1, thread_name_prefix="sentinel-checkpoint",
                                          initializer=saving.lower_priority, initargs=(writer_niceness,))
        self._jobs: list[saving.Job] = []  # saves not yet resolved, oldest first
        self._carried: list[CheckpointStore] = []  # tiers of skipped saves, written by the next save
        self.saves_coalesced = self.saves_skipped = 0
        self._lock = threading.Lock()
        self._guarded: list[Any] = []  # optimizers whose step() waits for the snapshot (guard())
        self._seen: weakref.WeakSet[Any] = weakref.WeakSet()  # torch optimizers seen stepping (guard=True)
        self.auto_guard = guard if guard is not None else guarding.env_flag("SENTINEL_CHECKPOINT_GUARD", True)
        self._global_hook: Any = None
        self.overlap_disabled: str | None = None  # why the snapshot is no longer overlapped, once it is not
        self._snapshotted = threading.Event()
        self._on_stage_thread = threading.local()
        self._written_direct: set[str] = set()  # tensors a first save wrote straight to the local tier
        self._direct = saving.DirectWrites()
        self._copies = saving.CopyStreams()
        self._snapshotted.set()
        self._waiting_since: float | None = None  # when a guarded step() began to wait for it
        self._collected: set[tuple[int, int | None]] = set()  # retired (step, attempt)s already collected
        self.last_result: SaveResult | None = None
        self.errors = 0
        self.guard(*optimizers)  # given the optimizers, the snapshot overlaps the next forward and backward
        guarding.watch_optimizers(self)

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

    def save(self, step: int, state: Any, *, when_busy: str | None = None) -> Future[SaveResult] | None:
        """Snapshot `state` and write it in the background; None when no tier is due at this step.

        With a save still writing, `when_busy` (default: the manager's) says what happens instead of
        waiting for it: see sentinel.sdk.saving. The future's result says what became of this step."""
        stores = self.tiers_for(step)
        if not stores:
            return None
        policy = when_busy or self.when_busy
        if policy not in saving.WHEN_BUSY:
            raise ValueError(f"when_busy must be one of {saving.WHEN_BUSY}, not {policy!r}")
        started = time.perf_counter()
        guarding.watch_optimizers(self)
        if policy == "wait" and self._live():
            with _paused():  # the loop waits here on purpose: the server does not judge it hung meanwhile
                self.wait()
        with self._lock:
            live = self._live()
            if live and policy == "skip":
                self._carried = saving.merge_stores(self._carried, stores)
                self.saves_skipped += 1
                log.info("checkpoint skipped: job=%d rank=%d step=%d (step %d is still being written)",
                         self.job_id, self.rank, step, live[0].step)
                return _resolved(SaveResult(step=step, tiers=[], bytes_total=0, bytes_written=0, chunks_written=0,
                                            stall_seconds=time.perf_counter() - started, write_seconds=0.0,
                                            outcome="skipped"))
            replaced = next((j for j in live if not j.started), None)  # queued, not begun: this save replaces it
            if replaced is not None:
                replaced.superseded_by = step
                live.remove(replaced)
                self.saves_coalesced += 1
            slot = min(set(range(saving.SLOTS)) - {j.slot for j in live})
            carried = self._carried + (replaced.stores if replaced is not None else [])
            job = saving.Job(step=step, stores=saving.merge_stores(stores, carried), slot=slot, started=not live,
                             coalesced=[*replaced.coalesced, replaced.step] if replaced is not None else [])
            self._carried = []
            self._jobs = [*live, job]
        if replaced is not None:
            replaced.future.set_result(SaveResult(step=replaced.step, tiers=[], bytes_total=0, bytes_written=0,
                                                  chunks_written=0, stall_seconds=replaced.stall, write_seconds=0.0,
                                                  outcome="coalesced", superseded_by=step))
        self._snapshot(job, state, defer=not live)
        job.stall = time.perf_counter() - started
        self._stager.submit(self._stage_later, job)
        return job.future

    def _live(self) -> list[saving.Job]:
        return [j for j in self._jobs if not j.future.done()]

    def _snapshot(self, job: saving.Job, state: Any, *, defer: bool) -> None:
        """Copy what must be copied before save() returns; with guard() and no write in flight, the guarded
        tensors are left to the stage thread (`job.later`)."""
        with _paused():
            job.skeleton, tensors = chunks.flatten(state)
            guarded = guarding.guarded_storage(self) if defer and self.overlap_disabled is None else set()
            job.later = {name: value for name, value in tensors.items()
                         if guarded and guarding.storage(value) in guarded}
            job.versions = {name: value._version for name, value in job.later.items()}
            job.ready = self._copies.mark(job.later)
            job.order = list(tensors)
            self._slot = job.slot
            now = {name: value for name, value in tensors.items() if name not in job.later}
            direct = self._write_direct(job, now) if defer else set()
            job.snapshot = {name: self._stage(name, value) for name, value in now.items() if name not in direct}
        if job.later:
            self._waiting_since = None
            self._snapshotted.clear()

    def guard(self, *optimizers: Any) -> None:
        """Overlap the snapshot with the next forward and backward passes (as CheckFreq does).

        From now on `save` copies before it returns only what these optimizers do not own (buffers such as
        BatchNorm's running stats, plain values); their parameters and state are copied by the stage
        thread, and each optimizer's `step()` waits for that copy, so no update lands in the middle of it.
        Safe when nothing but these optimizers' step() changes those tensors in place between a save and
        the next step (no manual edits of parameters, no EMA written into them outside step()).
        """
        for optimizer in optimizers:
            if any(optimizer is o for o in self._guarded):
                continue
            optimizer.register_step_pre_hook(lambda *_: self.wait_snapshot())
            self._guarded.append(optimizer)

    def wait_snapshot(self) -> None:
        """Block until the save in flight has copied the guarded tensors (called by guarded optimizers)."""
        if not self._snapshotted.is_set():
            if self._waiting_since is None:
                self._waiting_since = time.perf_counter()  # the stage thread turns this into the save's stall
            with _paused():
                self._snapshotted.wait()

    def _stage_later(self, job: saving.Job) -> None:
        """On the stage thread: copy the guarded tensors, release guarded step()s, hand the job to the writer."""
        try:
            self._slot = job.slot
            self._on_stage_thread.active = True  # its copies use this thread alone (saving.stage)
            direct = self._write_direct(job, job.later, steady=True)
            try:
                self._copies.begin(job.ready)
                for name, value in job.later.items():
                    if name not in direct:
                        job.snapshot[name] = self._stage(name, value, self._copies.stream(value, job.ready))
            finally:
                self._copies.synchronize(job.ready)  # (also after a failure: no copy still writes into a buffer)
            guarding.check_versions(self, job)
        except BaseException as exc:
            saving.release(job, self.local)
            job.future.set_exception(exc)
            return
        finally:
            if job.later:
                done = time.perf_counter()
                self._snapshotted.set()
                waiting_since, self._waiting_since = self._waiting_since, None
                job.stall += done - waiting_since if waiting_since is not None else 0.0
        self._writer.submit(self._run, job)

    def _write_direct(self, job: saving.Job, tensors: dict[str, Any], *, steady: bool = False) -> set[str]:
        """A save with nothing in flight, due on the local tier alone, writes the tensors it has never saved straight
        into it (a first save: one pass instead of a copy into fresh memory and a write). Later saves copy them,
        except the stage thread's guarded ones while saving.DirectWrites allows (`steady`)."""
        if len(job.stores) != 1 or job.stores[0] is not self.local or self.write_bytes_per_second:
            return set()  # (a paced write belongs on the writer thread)
        unbuffered, measured = saving.unbuffered(self._staging[job.slot], tensors, self._written_direct), False
        if steady and not unbuffered:
            candidates = saving.writable(tensors)
            if self._direct.allowed(self.local, candidates):
                unbuffered, measured = candidates, True
        if not unbuffered:
            return set()
        try:
            started, before = time.perf_counter(), job.direct_written[1]
            saving.write_direct(job, self.local, unbuffered, self._chunking)
            if measured:
                self._direct.wrote(job.step, job.direct_written[1] - before, time.perf_counter() - started)
        except (OSError, TimeoutError) as exc:  # copied instead: the writer thread meets it and reports it
            log.debug("checkpoint direct write failed, copying instead: step=%d error=%s", job.step, exc)
            if not job.direct:
                saving.release(job)
            return set()
        self._written_direct.update(unbuffered)  # once: from the next save on they have buffers and are copied
        return set(unbuffered)

    def _stage(self, name: str, value: Any, stream: Any = None) -> Any:
        """Copy into this tensor's host buffer from the last save in its slot (allocating only when needed); a
        CUDA tensor's copy on `stream` is left in flight (see saving.CopyStreams)."""
        one_thread = getattr(self._on_stage_thread, "active", False)
        return saving.stage(self._staging[self._slot], name, value, one_thread=one_thread, stream=stream)

    def _run(self, job: saving.Job) -> None:
        with self._lock:
            if job.superseded_by is not None:
                return  # a newer save replaced it before it began; its future says so already
            job.started = True
        try:
            result = self._write(job)
        except BaseException as exc:
            job.future.set_exception(exc)
            return
        job.future.set_result(result)

    def wait(self) -> SaveResult | None:
        """Block until every save in flight is written; returns the newest one's result (its error is logged,
        not raised)."""
        result = None
        for job in list(self._jobs):
            try:
                result = job.future.result()
            except Exception:
                result = None
        return result

    def close(self) -> None:
        """Wait for the saves in flight; then the spare packs of this manager's stores go (disk space)."""
        with _paused():
            self.wait()
        self._stager.shutdown(wait=True)
        self._writer.shutdown(wait=True)
        if self._global_hook is not None:
            self._global_hook.remove()
            self._global_hook = None
        for store in (self.local, self.replica, self.persistent):
            if store is not None and store.packs.is_dir():
                with contextlib.suppress(OSError):
                    store.drop_spares()

    def _write(self, job: saving.Job) -> SaveResult:
        from sentinel.sdk.writing import write

        return write(self, job)

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


def _resolved(result: SaveResult) -> Future[SaveResult]:
    future: Future[SaveResult] = Future()
    future.set_result(result)
    return future


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

