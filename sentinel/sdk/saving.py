"""The save pipeline behind CheckpointManager.save: jobs, buffer slots, and a low-priority writer thread.

A save is a `Job`: its snapshot (host buffers of one slot), the tiers it is due on, and its future. One job
at a time is written. A save that finds a job still writing never waits for it; by the manager's
`when_busy` policy it is
  "coalesce" (default): snapshotted into the other slot and queued; a newer save that comes before it is
              begun replaces it (the replaced save's result says `outcome="coalesced"`, `superseded_by`),
  "skip":     not taken at all (`outcome="skipped"`),
  "wait":     the old behaviour, it blocks until the write is done.
A replaced or skipped save's tiers are carried to the next save that is written, so a persistent-tier
save is never lost to a busy local write, only postponed.

The writer thread hashes and writes at a lower CPU priority (`os.setpriority` on its own thread id), so on
a host whose cores also compute, compute wins and the write takes what is left; copies the loop waits for
(guard()'s deferred snapshot) run on a second thread at normal priority.
"""

from __future__ import annotations

import logging
import os
import sys
import threading
from collections.abc import Callable, Iterator
from concurrent.futures import Future
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from sentinel.sdk import chunks, hugepages

log = logging.getLogger("sentinel.sdk.checkpoint")
WHEN_BUSY = ("coalesce", "skip", "wait")
SLOTS = 2  # buffer sets: the one being written and the newest pending snapshot
WRITER_NICENESS = 10  # added to the writer thread's nice value (19: the least CPU share)
WHOLE_DIGEST_BELOW = 256 << 10  # tensors cut smaller than this also get digests of whole segments
SEGMENT_BYTES = 16 << 20  # (restore verifies the segments in parallel, not 100,000s of chunks one by one)
DIRECT_MIN_BYTES_PER_SECOND = 1e9  # DirectWrites: into cached pages 4-8 GB/s here, a new file 0.4
DIRECT_SLACK_SECONDS = 0.02  # what a small write's files cost whatever its size
DIRECT_BACKOFF_SAVES = 10


@dataclass(eq=False)
class Job:
    step: int
    stores: list[Any]
    slot: int
    skeleton: Any = None
    snapshot: dict[str, Any] = field(default_factory=dict)
    later: dict[str, Any] = field(default_factory=dict)  # guarded tensors the stage thread copies
    versions: dict[str, int] = field(default_factory=dict)  # their version counters when save() returned
    stall: float = 0.0
    coalesced: list[int] = field(default_factory=list)  # older steps whose saves this one replaced
    future: Future[Any] = field(default_factory=Future)
    started: bool = False  # begun (or in flight from the start: nothing was live): never replaced
    superseded_by: int | None = None
    order: list[str] = field(default_factory=list)  # tensor names as flattened (the manifest's order)
    direct: dict[str, chunks.TensorSpec] = field(default_factory=dict)  # written straight to the local tier
    direct_written: tuple[int, int] = (0, 0)  # their (chunks, bytes) written
    direct_packs: list[tuple[str, list[str]]] = field(default_factory=list)  # (pack, digests) of those writes
    ready: dict[Any, Any] = field(default_factory=dict)  # per CUDA device: an event after the work save() followed
    lock_fd: int | None = None  # the local tier's shared lock, held from the first direct write to the manifest


def lower_priority(niceness: int) -> None:
    """Make the calling thread nicer (Linux: a thread's nice value is its own); best effort elsewhere."""
    if niceness <= 0:
        return
    try:
        tid = threading.get_native_id()
        os.setpriority(os.PRIO_PROCESS, tid, min(19, os.getpriority(os.PRIO_PROCESS, tid) + niceness))
    except (OSError, AttributeError) as exc:  # not permitted or not Linux: the writer keeps its priority
        log.debug("checkpoint writer priority unchanged: %s", exc)


def stage(staging: dict[str, Any], name: str, value: Any, *, one_thread: bool = False, stream: Any = None) -> Any:
    """Copy into this tensor's host buffer in `staging` (allocating only when the shape changed).

    `one_thread`: a CPU tensor is copied by numpy on this thread alone. torch's copy_ off the main thread starts
    a second OpenMP team as wide as the machine, which fights the training loop's for the same cores.
    `stream` (a CUDA tensor's, from CopyStreams): the copy is queued there and not waited for; the caller
    synchronizes the stream once its copies are queued."""
    buffer = staging.get(name)
    if isinstance(value, np.ndarray):
        if not (isinstance(buffer, np.ndarray) and buffer.shape == value.shape and buffer.dtype == value.dtype):
            buffer = staging[name] = np.empty_like(value, order="C")
            hugepages.advise_tensor(buffer)  # fresh (huge pages only on request: sentinel.sdk.hugepages)
        np.copyto(buffer, value)
        return buffer
    torch = sys.modules["torch"]
    if not (isinstance(buffer, torch.Tensor) and buffer.shape == value.shape and buffer.dtype == value.dtype):
        pin = value.device.type == "cuda"
        buffer = staging[name] = torch.empty(value.shape, dtype=value.dtype, pin_memory=pin)
        hugepages.advise_tensor(buffer)
    if one_thread and value.device.type == "cpu" and value.is_contiguous() and value.numel():
        np.copyto(np.asarray(bytes_of(buffer)), np.asarray(bytes_of(value.detach())))  # the GIL released
        return buffer
    if stream is not None and value.device.type == "cuda":
        value.record_stream(stream)  # its memory is not reused before the copy has read it
        with torch.cuda.stream(stream):
            buffer.copy_(value.detach(), non_blocking=True)
        return buffer
    buffer.copy_(value.detach(), non_blocking=value.device.type == "cuda")
    if value.device.type == "cuda":
        torch.cuda.current_stream(value.device).synchronize()
    return buffer


class CopyStreams:
    """The guarded CUDA tensors' device-to-host copies, on a stream of their own per device, after the work the
    saving thread had queued when save() was called (an event recorded on its current stream then).

    On the stage thread's own current stream (the legacy default stream) the copies would queue among the next
    forward's and backward's kernels instead of overlapping them on the copy engine, and would not be ordered
    after an optimizer step the loop ran on a stream of its own."""

    def __init__(self) -> None:
        self.streams: dict[Any, Any] = {}

    def mark(self, tensors: dict[str, Any]) -> dict[Any, Any]:
        """On the saving thread: per CUDA device among `tensors`, an event after the work queued so far."""
        events: dict[Any, Any] = {}
        for value in tensors.values():
            if not isinstance(value, np.ndarray) and value.device.type == "cuda" and value.device not in events:
                torch = sys.modules["torch"]
                event = events[value.device] = torch.cuda.Event()
                event.record(torch.cuda.current_stream(value.device))
        return events

    def begin(self, ready: dict[Any, Any]) -> None:
        """On the stage thread, before a save's copies: each device's stream waits for that save's event."""
        for device, event in ready.items():
            stream = self.streams.get(device)
            if stream is None:
                stream = self.streams[device] = sys.modules["torch"].cuda.Stream(device=device)
            stream.wait_event(event)

    def stream(self, value: Any, ready: dict[Any, Any]) -> Any:
        """The stream `value`'s copy goes on (None for a CPU tensor or array)."""
        if isinstance(value, np.ndarray) or value.device not in ready:
            return None
        return self.streams[value.device]

    def synchronize(self, ready: dict[Any, Any]) -> None:
        """Wait until the copies queued for this save are in host memory."""
        for device in ready:
            if device in self.streams:
                self.streams[device].synchronize()


def unbuffered(staging: dict[str, Any], tensors: dict[str, Any], before: set[str]) -> dict[str, Any]:
    """The CPU tensors never saved `before` that have no host buffer in `staging` (a first save): copying them
    would first fault in fresh memory, about as slow as writing them, and then they would be written anyway."""
    fresh = {}
    for name, value in tensors.items():
        buffer: Any = staging.get(name)
        if name not in before and not (type(buffer) is type(value) and buffer.shape == value.shape
                                       and buffer.dtype == value.dtype):
            fresh[name] = value
    return writable(fresh)


def writable(tensors: dict[str, Any]) -> dict[str, Any]:
    """The tensors (and arrays) that can be hashed and written from where they lie: on the CPU, contiguous,
    not empty."""
    out = {}
    for name, value in tensors.items():
        if isinstance(value, np.ndarray):
            if value.size and value.flags.c_contiguous:
                out[name] = value
        elif value.device.type == "cpu" and value.numel() and value.is_contiguous():
            out[name] = value.detach()
    return out


def write_direct(job: Job, store: Any, tensors: dict[str, Any], chunking: dict[str, Any]) -> None:
    """Hash and write these tensors into `store` now, instead of copying them for the writer thread; the store
    stays locked (shared) until the writer has written the manifest that names them."""
    if job.lock_fd is None:
        job.lock_fd = store.hold_shared()
        store.refresh()
    specs, pieces = cut_lazily(tensors, chunking)  # hashed as written: each byte read from memory once
    n, nbytes = store.write_pack(pieces, wrote=job.direct_packs, nbytes=sum(spec.nbytes for spec in specs))
    job.direct.update((spec.name, spec) for spec in specs)
    job.direct_written = (job.direct_written[0] + n, job.direct_written[1] + nbytes)


def release(job: Job, store: Any = None) -> None:
    """The local tier's lock from the direct writes. With `store` (the save failed), the chunks they wrote are
    not to be named by a later save: a tensor changed while it was written may not match its digests."""
    if store is not None:
        for _, digests in job.direct_packs:
            store.distrust(digests)
    if job.lock_fd is not None:
        os.close(job.lock_fd)
        job.lock_fd = None


class DirectWrites:
    """Whether the stage thread writes the guarded CPU tensors straight into the local tier in steady state
    (one pass over them, not a copy into buffers and a write of the copy later; the guarded step() waits for
    it as it waits for the copy): while a spare pack can take (most of) them (overwriting cached pages) and
    the last such write ran at DIRECT_MIN_BYTES_PER_SECOND or more (give or take DIRECT_SLACK_SECONDS). After
    a slower one (a page cache that must first be written back, a real disk) the next DIRECT_BACKOFF_SAVES
    saves copy instead."""

    def __init__(self) -> None:
        self.backoff = 0
        self.writes = 0  # steady direct writes made

    def allowed(self, store: Any, tensors: dict[str, Any]) -> bool:
        if self.backoff:
            self.backoff -= 1
            return False
        nbytes = sum(len(bytes_of(v)) for v in tensors.values())  # (chunks the store has are not written again:
        return bool(nbytes) and store.largest_spare() >= 0.9 * nbytes  # a spare is a little short of them all)

    def wrote(self, step: int, nbytes: int, seconds: float) -> None:
        self.writes += 1
        if seconds > DIRECT_SLACK_SECONDS + nbytes / DIRECT_MIN_BYTES_PER_SECOND:
            self.backoff = DIRECT_BACKOFF_SAVES
            log.info("checkpoint direct writes paused: step=%d wrote %d bytes at %.2f GB/s; the next %d saves "
                     "copy first", step, nbytes, nbytes / seconds / 1e9, DIRECT_BACKOFF_SAVES)


def bytes_of(buffer: Any) -> memoryview:
    if isinstance(buffer, np.ndarray):
        return buffer.reshape(-1).view(np.uint8).data
    torch = sys.modules["torch"]
    if buffer.numel() == 0:
        return memoryview(b"")
    return memoryview(buffer.reshape(-1).view(torch.uint8).numpy())


def cut_snapshot(snapshot: dict[str, Any], chunking: dict[str, Any]
                 ) -> tuple[list[chunks.TensorSpec], list[tuple[str, memoryview]]]:
    """Specs and (digest, bytes) pieces of a snapshot, every piece hashed now."""
    specs, pieces = cut_lazily(snapshot, chunking)
    return specs, list(pieces)


def cut_lazily(snapshot: dict[str, Any], chunking: dict[str, Any]
               ) -> tuple[list[chunks.TensorSpec], Iterator[tuple[str, memoryview]]]:
    """Specs and (digest, bytes) pieces of a snapshot, each piece hashed as it is iterated (a spec's digests are
    complete once the pieces are spent): a writer that writes each piece soon after reads it from the CPU's
    cache, not from memory again. A tensor cut into small chunks (embedding rows) also gets a digest per ~16 MiB
    segment, so a restore verifies it a segment at a time (in parallel), not a row at a time."""
    specs: list[chunks.TensorSpec] = []
    cuts: list[tuple[chunks.TensorSpec, memoryview]] = []
    for name, buffer in snapshot.items():
        data = bytes_of(buffer)
        itemsize = buffer.itemsize if isinstance(buffer, np.ndarray) else buffer.element_size()
        size = chunks.chunk_bytes_for(name, list(buffer.shape), itemsize, **chunking)
        spec = chunks.TensorSpec(name=name, dtype=chunks.dtype_name(buffer), shape=list(buffer.shape),
                                 nbytes=len(data), chunk_bytes=size)
        specs.append(spec)
        cuts.append((spec, data))

    def pieces() -> Iterator[tuple[str, memoryview]]:
        for spec, data in cuts:
            if spec.chunk_bytes < WHOLE_DIGEST_BELOW and len(data) > spec.chunk_bytes:
                spec.segment_bytes = max(spec.chunk_bytes, SEGMENT_BYTES // spec.chunk_bytes * spec.chunk_bytes)
                spec.segments = [chunks.digest(segment) for segment in chunks.cut(data, spec.segment_bytes)]
            for piece in chunks.cut(data, spec.chunk_bytes):
                d = chunks.digest(piece)
                spec.chunks.append(d)
                yield d, piece

    return specs, pieces()


def pacer(bytes_per_second: float | None) -> Callable[[int], None] | None:
    if not bytes_per_second:
        return None
    import time

    rate, start, done = float(bytes_per_second), time.monotonic(), [0]

    def pace(nbytes: int) -> None:
        done[0] += nbytes
        ahead = done[0] / rate - (time.monotonic() - start)
        if ahead > 0:
            time.sleep(ahead)

    return pace


def merge_stores(first: list[Any], second: list[Any]) -> list[Any]:
    """The tiers of both, in the order of the first then the new ones of the second (each store once)."""
    out = list(first)
    out += [s for s in second if all(s is not t for t in out)]
    return out
