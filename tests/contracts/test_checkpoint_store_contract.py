"""The CheckpointStore contract, run against every registered tier: real files, real locks, real processes,
real garbage collection. How durable each tier is lives in tests/sdk/test_checkpoint_stores.py.

A new store gets this suite by being added to `sentinel.sdk.stores.STORES` under its tier.
"""

from __future__ import annotations

import errno
import json
import subprocess
import sys
import threading
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest

from sentinel.sdk import stores
from sentinel.sdk.chunks import digest
from sentinel.sdk.stores import IDX_MAGIC, STORES, CheckpointStore, CheckpointStoreError
from tests.contracts.conftest import implementations


@pytest.fixture(params=implementations(STORES))
def store_cls(request: pytest.FixtureRequest) -> type[CheckpointStore]:
    return STORES[request.param]


@pytest.fixture
def store(store_cls: type[CheckpointStore], tmp_path: Path) -> CheckpointStore:
    return store_cls(tmp_path / "store", node="n1")


def blob(seed: int, size: int = 4096) -> bytes:
    return np.random.default_rng(seed).integers(0, 256, size, dtype=np.uint8).tobytes()


def pieces(*blobs: bytes) -> list[tuple[str, memoryview]]:
    return [(digest(b), memoryview(b)) for b in blobs]


def manifest(*blobs: bytes) -> bytes:
    return json.dumps({"tensors": [{"name": f"t{i}", "chunks": [digest(b)]} for i, b in enumerate(blobs)]}).encode()


def pack_names(store: CheckpointStore, suffix: str) -> set[str]:
    return {p.name.removesuffix(suffix) for p in store.packs.glob(f"*{suffix}")}


def test_write_pack_writes_only_the_chunks_the_store_lacks(store: CheckpointStore):
    a, b, c = blob(1), blob(2), blob(3, 1000)
    assert store.write_pack(pieces(a, b)) == (2, len(a) + len(b))
    assert store.write_pack(pieces(a, b)) == (0, 0)
    assert store.write_pack(pieces(a, c, c)) == (1, len(c))  # a duplicate inside one write is written once
    assert len(pack_names(store, ".pack")) == 2  # an all-duplicate write leaves no empty pack behind
    assert pack_names(store, ".pack") == pack_names(store, ".idx")


def test_a_fresh_store_object_on_the_same_root_sees_the_index(store_cls: type[CheckpointStore], tmp_path: Path):
    a, b = blob(1), blob(2)
    writer = store_cls(tmp_path / "store")
    writer.write_pack(pieces(a))
    reader = store_cls(tmp_path / "store")
    reader.refresh()
    assert reader.has(digest(a)) and not reader.has(digest(b))
    assert reader.write_pack(pieces(a, b)) == (1, len(b))
    writer.refresh()  # picks up the pack another object (process) wrote since its last look
    assert writer.has(digest(b))
    assert bytes(writer.read_chunk(digest(b))) == b


def test_a_digest_ending_in_zero_bytes_survives_the_index_on_disk(store_cls: type[CheckpointStore],
                                                                  tmp_path: Path):
    zero_tail = next(b for b in (blob(seed, 100) for seed in range(100_000)) if digest(b).endswith("00"))
    store_cls(tmp_path / "store").write_pack(pieces(zero_tail, blob(1)))
    fresh = store_cls(tmp_path / "store")
    fresh.refresh()
    assert fresh.has(digest(zero_tail)) and bytes(fresh.read_chunk(digest(zero_tail))) == zero_tail
    assert fresh.write_pack(pieces(zero_tail)) == (0, 0)


def test_manifests_round_trip_and_steps_lists_ranks_per_step(store: CheckpointStore):
    assert store.steps(7) == {}
    for step, rank in [(10, 1), (10, 0), (20, 0)]:
        store.put_manifest(7, step, rank, f"job 7 step {step} rank {rank}".encode())
    store.put_manifest(8, 30, 0, b"other job")
    assert store.get_manifest(7, 10, 1) == b"job 7 step 10 rank 1"
    assert store.steps(7) == {10: [0, 1], 20: [0]}
    assert store.steps(8) == {30: [0]}
    store.put_manifest(7, 20, 0, b"replaced")
    assert store.get_manifest(7, 20, 0) == b"replaced"
    assert not list(store.manifests.rglob("*.tmp"))
    with pytest.raises(CheckpointStoreError, match=r"rank-00003\.json"):
        store.get_manifest(7, 10, 3)


def test_steps_can_be_listed_while_another_process_retires_steps(store: CheckpointStore):
    """steps() takes no lock: a step directory a collector removes mid-listing is skipped, not an error."""
    churn = f"""
import time
from sentinel.sdk.stores import STORES
store, step = STORES[{store.tier!r}]({str(store.root)!r}), 1
print("ready", flush=True)
deadline = time.monotonic() + 1.0
while time.monotonic() < deadline:
    store.put_manifest(1, step, 0, b'{{"tensors": []}}')
    store.collect_garbage(retire=[(1, step)])
    step += 1
"""
    store.put_manifest(1, 0, 0, b'{"tensors": []}')  # never retired
    child = subprocess.Popen([sys.executable, "-c", churn], stdout=subprocess.PIPE, text=True)
    assert child.stdout is not None
    try:
        assert child.stdout.readline() == "ready\n"
        listings = 0
        while child.poll() is None:
            assert 0 in store.steps(1)
            listings += 1
    finally:
        child.kill()
        child.wait(timeout=10)
    assert child.returncode == 0 and listings > 100


def test_read_chunk_returns_the_bytes_into_a_given_buffer_or_a_new_one(store: CheckpointStore):
    a, b = blob(1), blob(2, 777)
    store.write_pack(pieces(a, b))
    assert bytes(store.read_chunk(digest(b))) == b
    into = memoryview(bytearray(len(a)))
    assert store.read_chunk(digest(a), into=into) is into and bytes(into) == a
    with pytest.raises(CheckpointStoreError, match="manifest expects"):
        store.read_chunk(digest(a), into=memoryview(bytearray(len(a) - 1)))
    with pytest.raises(CheckpointStoreError, match="in no pack"):
        store.read_chunk(digest(b"never written"))


def test_gc_removes_a_torn_pack_and_keeps_complete_ones(store: CheckpointStore):
    a = blob(1)
    store.write_pack(pieces(a))
    store.put_manifest(1, 1, 0, manifest(a))
    torn = store.packs / "0123456789abcdef0123456789abcdef.pack"  # a writer killed before its index
    torn.write_bytes(blob(9, 5000))
    report = store.collect_garbage()
    assert not torn.exists()
    assert report.packs_deleted == 1 and report.bytes_freed == 5000 and report.manifests_deleted == 0
    assert pack_names(store, ".pack") == pack_names(store, ".idx") and len(pack_names(store, ".pack")) == 1
    assert bytes(store.read_chunk(digest(a))) == a


def test_gc_deletes_retired_manifests_and_the_packs_nobody_references(store: CheckpointStore):
    old, shared, new = blob(1), blob(2), blob(3)
    store.write_pack(pieces(old))
    store.write_pack(pieces(shared))
    store.put_manifest(1, 1, 0, manifest(old, shared))
    store.put_manifest(1, 1, 1, manifest(old))
    store.write_pack(pieces(new))
    store.put_manifest(1, 2, 0, manifest(shared, new))
    report = store.collect_garbage(retire=[(1, 1)])
    assert report.manifests_deleted == 2 and report.packs_deleted == 1 and report.bytes_freed == len(old)
    assert report.live_chunks == 2
    assert store.steps(1) == {2: [0]}
    assert not store.manifest_path(1, 1, 0).parent.exists()
    assert len(pack_names(store, ".pack")) == 2 and pack_names(store, ".pack") == pack_names(store, ".idx")
    fresh = type(store)(store.root)
    fresh.refresh()
    assert not fresh.has(digest(old))
    assert bytes(fresh.read_chunk(digest(shared))) == shared and bytes(fresh.read_chunk(digest(new))) == new
    assert store.collect_garbage() == type(report)(live_chunks=2)  # nothing more to do


def test_gc_rewrites_a_mostly_dead_pack_with_only_its_live_chunks(store: CheckpointStore):
    live, dead1, dead2, also_live = blob(1, 1000), blob(2, 3000), blob(3, 3000), blob(4, 500)
    store.write_pack(pieces(live, dead1, dead2, also_live))
    [old_pack] = pack_names(store, ".pack")
    old_size = (store.packs / f"{old_pack}.pack").stat().st_size
    store.put_manifest(1, 5, 0, manifest(live, also_live))
    report = store.collect_garbage()
    assert report.packs_rewritten == 1 and report.bytes_freed == 6000
    [new_pack] = pack_names(store, ".pack")
    assert new_pack != old_pack and pack_names(store, ".idx") == {new_pack}
    assert (store.packs / f"{new_pack}.pack").stat().st_size == old_size - 6000
    for reader in (store, type(store)(store.root)):
        reader.refresh()
        assert not reader.has(digest(dead1)) and not reader.has(digest(dead2))
        assert bytes(reader.read_chunk(digest(live))) == live
        assert bytes(reader.read_chunk(digest(also_live))) == also_live
    # the collector's own index forgot the dead chunks: saving one again writes it rather than naming a deleted pack
    assert store.write_pack(pieces(dead1)) == (1, len(dead1))
    assert bytes(store.read_chunk(digest(dead1))) == dead1


def test_gc_keeps_a_mostly_live_pack_as_it_is(store: CheckpointStore):
    live, dead = blob(1, 3000), blob(2, 1000)
    store.write_pack(pieces(live, dead))
    before = pack_names(store, ".pack")
    store.put_manifest(1, 5, 0, manifest(live))
    report = store.collect_garbage()
    assert report.packs_rewritten == 0 and report.packs_deleted == 0 and pack_names(store, ".pack") == before
    assert bytes(store.read_chunk(digest(live))) == live


def test_a_chunk_two_writers_both_wrote_survives_gc_for_every_reader(store_cls: type[CheckpointStore],
                                                                    tmp_path: Path):
    """Concurrent saves that both lacked a chunk each write it: GC must leave every reader a readable copy."""
    both, only_a, only_b = blob(1), blob(2), blob(3)
    a, b = store_cls(tmp_path / "store"), store_cls(tmp_path / "store")
    a.refresh()
    b.refresh()
    a.write_pack(pieces(both))  # each checked before the other wrote, so both write it
    b.write_pack(pieces(both))
    a.write_pack(pieces(only_a))
    b.write_pack(pieces(only_b))
    a.put_manifest(1, 1, 0, manifest(both, only_a))
    b.put_manifest(2, 1, 0, manifest(both, only_b))
    a.refresh()  # each has now seen both copies
    b.refresh()
    store_cls(tmp_path / "store").collect_garbage()
    for reader in (a, b, store_cls(tmp_path / "store")):
        reader.refresh()
        for data in (both, only_a, only_b):
            assert bytes(reader.read_chunk(digest(data))) == data
    assert pack_names(a, ".pack") == pack_names(a, ".idx")
    # the spare copy went: the pack that held nothing but it is deleted, index and all
    assert sum(p.stat().st_size for p in a.packs.glob("*.pack")) == len(both) + len(only_a) + len(only_b)


# ---- contract points the docstrings promise (added with the move to tests/contracts) ----------------------------


def test_a_store_is_registered_under_its_tier_and_its_location_reopens_it(store_cls: type[CheckpointStore],
                                                                           tmp_path: Path):
    """A catalog entry keeps `location()`; restore finds the store again from it alone."""
    assert STORES[store_cls.tier] is store_cls
    a = blob(1)
    store = store_cls(tmp_path / "store", node="n7")
    store.write_pack(pieces(a))
    location = store.location()
    assert location == {"tier": store_cls.tier, "node": "n7", "uri": str(tmp_path / "store")}
    reopened = STORES[location["tier"]](location["uri"], node=location["node"])
    reopened.refresh()
    assert type(reopened) is store_cls and bytes(reopened.read_chunk(digest(a))) == a


def test_write_pack_paces_each_chunk_it_writes(store: CheckpointStore):
    a, b = blob(1, 1000), blob(2, 3000)
    paced: list[int] = []
    store.write_pack(pieces(a, b, a), pace=paced.append)
    assert paced == [len(a), len(b)]
    store.write_pack(pieces(b), pace=paced.append)  # nothing written, nothing paced
    assert paced == [len(a), len(b)]


def test_a_failed_write_leaves_no_pack_and_no_index_entry(store: CheckpointStore):
    a, b = blob(1), blob(2)

    def chunks_then_a_read_error() -> Iterator[tuple[str, memoryview]]:
        yield digest(a), memoryview(a)
        raise OSError(errno.EIO, "Input/output error")  # e.g. the tensor's source file could not be read

    with pytest.raises(CheckpointStoreError, match=r"writing .*\.pack failed") as raised:
        store.write_pack(chunks_then_a_read_error())
    assert isinstance(raised.value, OSError) and raised.value.errno == errno.EIO
    assert list(store.packs.iterdir()) == []
    assert not store.has(digest(a))  # a later save must write it, not name the deleted pack
    assert store.write_pack(pieces(a, b)) == (2, len(a) + len(b))
    assert bytes(store.read_chunk(digest(a))) == a


def test_a_streamed_write_writes_each_chunk_soon_after_it_was_iterated(store: CheckpointStore,
                                                                        monkeypatch: pytest.MonkeyPatch):
    """write_pack(nbytes=…): the chunks are written batch by batch as they come (saving.cut_lazily hashes each
    then, so the write reads it from the CPU's cache), the pack is cut to what was written, and a failure midway
    leaves nothing behind."""
    monkeypatch.setattr(stores, "STREAM_BATCH_BYTES", 1)  # every chunk its own batch
    a, b, c = blob(1), blob(2), blob(3, 1000)
    store.write_pack(pieces(a))
    (first,) = pack_names(store, ".pack")
    on_disk: list[int] = []

    def lazily(*blobs: bytes) -> Iterator[tuple[str, memoryview]]:
        for data in blobs:
            on_disk.append(sum(p.stat().st_size for p in store.packs.glob("*.pack")
                               if p.name != f"{first}.pack"))
            yield digest(data), memoryview(data)

    upper = len(a) + 2 * len(b) + len(c)  # an upper bound: what is known before hashing
    assert store.write_pack(lazily(a, b, c, b), nbytes=upper) == (2, len(b) + len(c))
    assert on_disk == [0, 0, len(b), len(b) + len(c)]  # b was written before c was asked for
    (pack,) = pack_names(store, ".pack") - {first}
    assert (store.packs / f"{pack}.pack").stat().st_size == len(b) + len(c)
    reader = type(store)(store.root)
    reader.refresh()
    assert bytes(reader.read_chunk(digest(c))) == c and bytes(reader.read_chunk(digest(b))) == b
    assert store.write_pack(lazily(a, b), nbytes=upper) == (0, 0)
    assert pack_names(store, ".pack") == {first, pack}  # nothing lacking: no empty pack

    def failing() -> Iterator[tuple[str, memoryview]]:
        d = blob(4)
        yield digest(d), memoryview(d)
        raise OSError(errno.EIO, "Input/output error")

    with pytest.raises(CheckpointStoreError, match=r"writing .*\.pack failed"):
        store.write_pack(failing(), nbytes=upper)
    assert pack_names(store, ".pack") == {first, pack} and not store.has(digest(blob(4)))


def test_a_store_that_cannot_be_created_says_where(store_cls: type[CheckpointStore], tmp_path: Path):
    (tmp_path / "a-file").write_bytes(b"")
    store = store_cls(tmp_path / "a-file" / "store")
    with pytest.raises(CheckpointStoreError, match=r"cannot create checkpoint store at .*a-file/store") as raised:
        store.write_pack(pieces(blob(1)))
    assert raised.value.errno == errno.ENOTDIR
    with pytest.raises(CheckpointStoreError, match=r"writing manifest .*rank-00000\.json failed"):
        store.put_manifest(1, 1, 0, b"{}")


def test_read_chunks_fills_one_buffer_across_packs_and_checks_its_length(store: CheckpointStore):
    a, b, c = blob(1, 1000), blob(2, 2000), blob(3, 500)
    store.write_pack(pieces(a, b))
    store.write_pack(pieces(c))
    order = [b, c, a, a]  # across packs, against pack order, one chunk twice
    digests = [digest(x) for x in order]
    for reader in (store, type(store)(store.root)):
        reader.refresh()
        into = memoryview(bytearray(sum(len(x) for x in order)))
        reader.read_chunks(digests, into)
        assert bytes(into) == b"".join(order)
    with pytest.raises(CheckpointStoreError, match="shorter than the manifest says"):
        store.read_chunks(digests, memoryview(bytearray(len(into) + 1)))
    with pytest.raises(CheckpointStoreError, match="longer than the manifest says"):
        store.read_chunks(digests, memoryview(bytearray(len(into) - 1)))
    with pytest.raises(CheckpointStoreError, match="in no pack"):
        store.read_chunks([digest(a), digest(b"never written")], memoryview(bytearray(len(a) + 13)))


def test_refresh_forgets_packs_another_process_deleted(store_cls: type[CheckpointStore], tmp_path: Path):
    a, kept = blob(1), blob(2)
    writer = store_cls(tmp_path / "store")
    writer.write_pack(pieces(a))
    writer.write_pack(pieces(kept))
    writer.put_manifest(1, 1, 0, manifest(a))
    writer.put_manifest(1, 2, 0, manifest(kept))
    reader = store_cls(tmp_path / "store")
    reader.refresh()
    assert reader.has(digest(a))
    store_cls(tmp_path / "store").collect_garbage(retire=[(1, 1)])
    reader.refresh()
    assert not reader.has(digest(a)) and reader.has(digest(kept))
    with pytest.raises(CheckpointStoreError, match="in no pack"):
        reader.read_chunk(digest(a))
    assert reader.write_pack(pieces(a)) == (1, len(a))


def test_a_damaged_pack_index_is_an_error_not_an_empty_pack(store: CheckpointStore):
    store.write_pack(pieces(blob(1)))
    [idx] = store.packs.glob("*.idx")
    idx.write_bytes(IDX_MAGIC + b"\0" * 5)  # a record cut short
    fresh = type(store)(store.root)
    with pytest.raises(CheckpointStoreError, match=rf"pack index .*{idx.name} is damaged"):
        fresh.refresh()


def test_gc_with_a_damaged_manifest_stops_and_deletes_nothing(store: CheckpointStore):
    a, unreferenced = blob(1), blob(2)
    store.write_pack(pieces(a))
    store.write_pack(pieces(unreferenced))
    store.put_manifest(1, 1, 0, b"{not json")
    packs_before = set(store.packs.iterdir())
    with pytest.raises(CheckpointStoreError, match=r"rank-00000\.json is damaged .*garbage collection stopped"):
        store.collect_garbage()
    assert set(store.packs.iterdir()) == packs_before
    assert bytes(store.read_chunk(digest(unreferenced))) == unreferenced


def test_gc_retiring_an_attempt_keeps_the_manifests_of_a_later_one(store: CheckpointStore):
    """A restarted job (attempt 2) that saved the step again keeps its own; attempt 1's and unnumbered ones go."""
    old, again, unnumbered = blob(1), blob(2), blob(3)
    store.write_pack(pieces(old, again, unnumbered))
    attempt = {0: 1, 1: 2}
    for rank, data in [(0, old), (1, again)]:
        store.put_manifest(1, 5, rank, json.dumps({"attempt": attempt[rank], **json.loads(manifest(data))}).encode())
    store.put_manifest(1, 5, 2, manifest(unnumbered))  # no attempt field: as old as can be
    report = store.collect_garbage(retire=[(1, 5, 1)])
    assert report.manifests_deleted == 2
    assert store.steps(1) == {5: [1]}
    assert report.live_chunks == 1 and bytes(store.read_chunk(digest(again))) == again
    assert not store.has(digest(old)) and not store.has(digest(unnumbered))


LOCK_HOLDER = """
import sys
from sentinel.sdk.stores import STORES
store = STORES[sys.argv[1]](sys.argv[2])
with store.shared():
    print("locked", flush=True)
    sys.stdin.readline()
print("released", flush=True)
"""


def test_a_save_in_another_process_holds_off_gc_but_not_other_saves(store: CheckpointStore):
    """Saves hold the store's lock shared, garbage collection exclusively, across processes."""
    a = blob(1)
    store.write_pack(pieces(a))
    store.put_manifest(1, 1, 0, manifest(a))
    holder = subprocess.Popen([sys.executable, "-c", LOCK_HOLDER, store.tier, str(store.root)],
                              stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    assert holder.stdin is not None and holder.stdout is not None
    try:
        assert holder.stdout.readline() == "locked\n"
        def another_save_locks_and_unlocks() -> None:
            with store.shared():
                pass

        another_save = threading.Thread(target=another_save_locks_and_unlocks)
        another_save.start()
        another_save.join(timeout=30)  # a bound on a failure, not a wait for success: it returns at once
        assert not another_save.is_alive(), "a second shared holder was blocked"
        with pytest.raises(TimeoutError, match="is busy"), store.exclusive(timeout_seconds=0.2):
            pass
        with pytest.raises(TimeoutError, match="is busy"):
            type(store)(store.root).collect_garbage(retire=[(1, 1)], timeout_seconds=0.2)
        assert store.steps(1) == {1: [0]} and bytes(store.read_chunk(digest(a))) == a
        holder.stdin.write("\n")
        holder.stdin.flush()
        assert holder.stdout.readline() == "released\n"
    finally:
        holder.kill()
        holder.wait(timeout=30)
    report = type(store)(store.root).collect_garbage(retire=[(1, 1)], timeout_seconds=30)
    assert report.manifests_deleted == 1 and store.steps(1) == {}


def test_a_retired_pack_is_kept_as_a_spare_and_the_next_pack_is_written_over_it(store: CheckpointStore):
    """Recycling: the dead pack's file becomes the next pack (same inode, cut to its size); nothing in it is
    indexed meanwhile, and what is read back is the new data."""
    old, kept, new = blob(1, 8000), blob(2, 9000), blob(3, 5000)
    store.write_pack(pieces(old))
    store.write_pack(pieces(kept))
    store.put_manifest(1, 1, 0, manifest(old))
    store.put_manifest(1, 2, 0, manifest(kept))
    [old_pack] = [p for p in pack_names(store, ".pack") if store.chunk_ref(digest(old)).pack == p]  # type: ignore[union-attr]
    inode = (store.packs / f"{old_pack}.pack").stat().st_ino
    report = store.collect_garbage(retire=[(1, 1)])
    assert (report.packs_deleted, report.packs_spared, report.bytes_spared) == (1, 1, 8000)
    assert [p.name for p in store.packs.glob("*.spare")] == [f"{old_pack}.spare"]
    assert not store.has(digest(old)) and pack_names(store, ".pack") == pack_names(store, ".idx")
    assert store.write_pack(pieces(new)) == (1, len(new))
    ref = store.chunk_ref(digest(new))
    assert ref is not None and ref.pack != old_pack
    path = store.packs / f"{ref.pack}.pack"
    assert path.stat().st_ino == inode and path.stat().st_size == len(new)  # the spare, cut to this pack
    assert not list(store.packs.glob("*.spare"))
    reader = type(store)(store.root)
    reader.refresh()
    assert bytes(reader.read_chunk(digest(new))) == new and bytes(reader.read_chunk(digest(kept))) == kept
    assert not reader.has(digest(old))


def test_spares_stay_within_the_live_bytes_and_can_be_dropped(store: CheckpointStore):
    small, big = blob(1, 1000), blob(2, 6000)
    store.write_pack(pieces(big))
    store.write_pack(pieces(small))
    store.put_manifest(1, 1, 0, manifest(big))
    store.put_manifest(1, 2, 0, manifest(small))
    report = store.collect_garbage(retire=[(1, 1)])
    assert (report.packs_deleted, report.packs_spared, report.bytes_freed) == (1, 0, 6000)  # 6000 > 1000 live
    assert not list(store.packs.glob("*.spare"))
    store.write_pack(pieces(big))
    store.put_manifest(1, 3, 0, manifest(big))
    assert store.collect_garbage(retire=[(1, 2)]).packs_spared == 1  # 1000 ≤ 6000 live
    assert store.drop_spares() == 1000 and not list(store.packs.glob("*.spare"))
