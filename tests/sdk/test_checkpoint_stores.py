"""The checkpoint store contract, held by both directory tiers: real files, real locks, real garbage collection."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from sentinel.sdk.chunks import digest
from sentinel.sdk.stores import CheckpointStore, CheckpointStoreError, LocalDirStore, SharedDirStore


@pytest.fixture(params=[LocalDirStore, SharedDirStore], ids=["local", "shared"])
def store_cls(request: pytest.FixtureRequest) -> type[CheckpointStore]:
    return request.param  # type: ignore[no-any-return]


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
from sentinel.sdk.stores import {type(store).__name__} as Store
store, step = Store({str(store.root)!r}), 1
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
