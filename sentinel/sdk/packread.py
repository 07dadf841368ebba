"""Reading a tensor's chunks back out of a store's packs with as few reads as the layout allows.

A tensor's chunks are looked up at once (sentinel.sdk.chunkindex: numpy does the arithmetic, not a Python loop
per chunk). The pack
that holds most of its bytes at one fixed shift (a first save, or the chunks a sparse update left unchanged)
is read across the whole span in one pass, in pieces read in parallel (a read releases the GIL, and the
page faults of fresh memory are the cost); the chunks it does not hold are then laid on top, read pack by
pack into a scratch buffer when they lie close together there. The caller verifies every byte.
"""

from __future__ import annotations

import errno
import os
import threading
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np

from sentinel.sdk.stores import CheckpointStoreError

if TYPE_CHECKING:
    from sentinel.sdk.stores import CheckpointStore

PIECE_BYTES = 16 << 20  # a span longer than this is read in pieces, in parallel
COPY_UNIT_MIN = 64  # runs whose offsets and lengths share a unit this large are copied by numpy at once
READERS = int(os.environ.get("SENTINEL_RESTORE_READERS", "0")) or max(1, min(4, os.cpu_count() or 1))
_pool: ThreadPoolExecutor | None = None
_pool_lock = threading.Lock()


def _readers() -> ThreadPoolExecutor:
    global _pool
    with _pool_lock:
        if _pool is None:
            _pool = ThreadPoolExecutor(max_workers=READERS, thread_name_prefix="sentinel-restore-read")
        return _pool


def read_chunks(store: CheckpointStore, digests: list[str], into: memoryview,
                touch: Callable[[], object] | None = None) -> None:
    """`touch` (the caller's page-faulting of `into`) runs on a reader thread while the reads are planned."""
    touched = _readers().submit(touch) if touch is not None else None
    try:
        _read_chunks(store, digests, into, touched)
    finally:
        if touched is not None:
            touched.result()


def _read_chunks(store: CheckpointStore, digests: list[str], into: memoryview, touched: Future[object] | None) -> None:
    try:
        packs, offsets, lengths = store._index.locate(digests)
    except KeyError as exc:
        raise CheckpointStoreError(errno.ENOENT, f"chunk {exc.args[0]} is in no pack under {store.packs}") from None
    ends = np.cumsum(lengths)
    total = int(ends[-1]) if len(digests) else 0
    if total > len(into):
        raise CheckpointStoreError(errno.EIO, f"chunks in {store.packs} are longer than the manifest says")
    if total != len(into):
        raise CheckpointStoreError(errno.EIO, f"chunks in {store.packs} are shorter than the manifest says "
                                              f"({total} of {len(into)} bytes)")
    read_extents(store, store._index.pack_name, packs, offsets, ends - lengths, lengths, into, touched)


@dataclass
class Plan:
    """How to read a tensor's runs: the main pack's span at one shift, then the other runs on top."""

    main: str  # the pack holding most of the bytes at one shift
    shift: int  # its offset minus the position in the tensor
    first: int  # the span of positions it is read across
    end: int
    pack_of: Callable[[int], str]  # pack numbers to names
    packs: np.ndarray  # the other runs' pack numbers, offsets, positions and lengths
    offsets: np.ndarray
    positions: np.ndarray
    lengths: np.ndarray


def plan(pack_of: Callable[[int], str], packs: np.ndarray, offsets: np.ndarray, positions: np.ndarray,
         lengths: np.ndarray) -> Plan | None:
    """None for no runs (an empty tensor)."""
    if not len(lengths):
        return None
    keys = packs.astype(np.int64) * (1 << 44) + (offsets - positions + (1 << 43))  # (pack, shift) in one integer
    _, inverse = np.unique(keys, return_inverse=True)
    main = inverse == int(np.argmax(np.bincount(inverse, weights=lengths)))
    rest = np.flatnonzero(~main)
    return Plan(pack_of(int(packs[main][0])), int(offsets[main][0] - positions[main][0]), int(positions[main][0]),
                int((positions[main] + lengths[main]).max()), pack_of, packs[rest], offsets[rest], positions[rest],
                lengths[rest])


def read_extents(store: CheckpointStore, pack_of: Callable[[int], str], packs: np.ndarray, offsets: np.ndarray,
                 positions: np.ndarray, lengths: np.ndarray, into: memoryview,
                 touched: Future[object] | None = None) -> None:
    """Runs of bytes (pack number, offset in it, position in `into`, length) put in place: the pack that holds
    most of the bytes at one shift is read across its whole span (in parallel pieces), the other runs on top."""
    how = plan(pack_of, packs, offsets, positions, lengths)
    if touched is not None:
        touched.result()
    if how is None:
        return
    fds: dict[str, int] = {}
    try:
        _span(store, fds, how.main, how.first + how.shift, into[how.first:how.end])
        _lay_rest(store, fds, how, into, np.ones(len(how.lengths), dtype=bool))
    finally:
        for fd in fds.values():
            os.close(fd)


def read_range(store: CheckpointStore, how: Plan, into: memoryview, start: int, stop: int) -> None:
    """The bytes of positions [start, stop) put in place, on this thread: ranges of one tensor go in parallel."""
    fds: dict[str, int] = {}
    try:
        low, high = max(start, how.first), min(stop, how.end)
        if low < high:
            _pread(store, fds, how.main, low + how.shift, into[low:high])
        ends = how.positions + how.lengths
        _lay_rest(store, fds, how, into, (how.positions < stop) & (ends > start), start, stop)
    finally:
        for fd in fds.values():
            os.close(fd)


def _lay_rest(store: CheckpointStore, fds: dict[str, int], how: Plan, into: memoryview, chosen: np.ndarray,
              start: int = 0, stop: int | None = None) -> None:
    """The plan's other runs that `chosen` marks, cut to [start, stop), pack by pack."""
    picked = np.flatnonzero(chosen)
    if not picked.size:
        return
    positions, ends = how.positions[picked], how.positions[picked] + how.lengths[picked]
    low = np.maximum(positions, start)
    high = np.minimum(ends, stop) if stop is not None else ends
    offsets, packs = how.offsets[picked] + (low - positions), how.packs[picked]
    for pack in sorted(set(packs.tolist())):  # (np.unique here imports numpy.ma on first use: 10 ms)
        mine = packs == pack
        _lay(store, fds, how.pack_of(pack), offsets[mine], low[mine], (high - low)[mine], into)


def _span(store: CheckpointStore, fds: dict[str, int], pack: str, offset: int, into: memoryview) -> None:
    if len(into) <= PIECE_BYTES or READERS == 1:
        _pread(store, fds, pack, offset, into)
        return
    _fd(store, fds, pack)  # opened once, before the pieces share it
    step = max(PIECE_BYTES, -(-len(into) // (READERS * 4)))
    futures = [_readers().submit(_pread, store, fds, pack, offset + at, into[at:at + step])
               for at in range(0, len(into), step)]
    for future in futures:
        future.result()


def _lay(store: CheckpointStore, fds: dict[str, int], pack: str, offsets: np.ndarray, positions: np.ndarray,
         lengths: np.ndarray, into: memoryview) -> None:
    """Chunks of one pack put at their places: one read of the pack's range when they fill most of it."""
    low, high = int(offsets.min()), int((offsets + lengths).max())
    if high - low <= 2 * int(lengths.sum()) + (1 << 20):
        scratch = memoryview(bytearray(high - low))
        _pread(store, fds, pack, low, scratch)
        _copy_runs(scratch, offsets - low, into, positions, lengths)
        return
    for offset, position, length in zip(offsets.tolist(), positions.tolist(), lengths.tolist(), strict=True):
        _pread(store, fds, pack, offset, into[position:position + length])


def _copy_runs(source: memoryview, sources: np.ndarray, into: memoryview, positions: np.ndarray,
               lengths: np.ndarray) -> None:
    """into[position:position + length] = source[at:at + length] for each run. Runs of whole units (embedding
    rows: thousands of 2 KiB chunks) are copied by numpy in one pass, not a Python statement each."""
    unit = int(np.gcd.reduce(np.concatenate([sources, positions, lengths]))) if len(lengths) else 0
    if unit < COPY_UNIT_MIN or len(lengths) < 16:
        for at, position, length in zip(sources.tolist(), positions.tolist(), lengths.tolist(), strict=True):
            into[position:position + length] = source[at:at + length]
        return
    counts = lengths // unit
    firsts = np.repeat(np.cumsum(counts) - counts, counts)
    within = np.arange(int(counts.sum())) - firsts  # each unit's place in its run
    src = np.repeat(sources // unit, counts) + within
    dst = np.repeat(positions // unit, counts) + within
    rows_in = np.frombuffer(source, dtype=np.uint8)[:len(source) // unit * unit].reshape(-1, unit)
    rows_out = np.frombuffer(into, dtype=np.uint8)[:len(into) // unit * unit].reshape(-1, unit)
    rows_out[dst] = rows_in[src]


def _fd(store: CheckpointStore, fds: dict[str, int], pack: str) -> int:
    fd = fds.get(pack)
    if fd is None:
        fd = fds[pack] = os.open(store.packs / f"{pack}.pack", os.O_RDONLY)
    return fd


def _pread(store: CheckpointStore, fds: dict[str, int], pack: str, offset: int, into: memoryview) -> None:
    try:
        fd = _fd(store, fds, pack)
        done = 0
        while done < len(into):
            got = os.preadv(fd, [into[done:]], offset + done)
            if got == 0:
                raise CheckpointStoreError(errno.EIO, f"{store.packs / f'{pack}.pack'} is truncated at offset "
                                                      f"{offset + done}")
            done += got
    except CheckpointStoreError:
        raise
    except OSError as exc:
        raise CheckpointStoreError(exc.errno or errno.EIO, f"reading {store.packs / f'{pack}.pack'}: "
                                                           f"{exc.strerror or exc}") from exc


def read_chunk(store: CheckpointStore, digest_hex: str, into: memoryview | None = None) -> memoryview:
    """One chunk's bytes from its pack (into `into` when given: it must be the chunk's length); not verified."""
    ref = store.chunk_ref(digest_hex)
    if ref is None:
        raise CheckpointStoreError(errno.ENOENT, f"chunk {digest_hex} is in no pack under {store.packs}")
    path = store.packs / f"{ref.pack}.pack"
    if into is not None and len(into) != ref.length:
        raise CheckpointStoreError(errno.EIO, f"chunk {digest_hex} is {ref.length} bytes in {store.packs}, "
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
