"""A shard's layout (where its bytes lie in one store, beside its manifest): a restore reads through it without
loading the store's chunk index, and one that is missing, damaged, made for another manifest or left stale by
garbage collection never costs correctness."""

from __future__ import annotations

import json
import logging
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from sentinel.sdk import layout, packread, restore, saving
from sentinel.sdk.checkpoint import CheckpointManager, CorruptCheckpoint
from sentinel.sdk.chunks import digest

JOB = 3
ROWS, DIM = 4096, 64  # float32: 256-byte rows, 8 to a 2 KiB chunk, 512 chunks


def manager(tmp_path: Path, **kwargs: Any) -> CheckpointManager:
    return CheckpointManager(job_id=JOB, rank=0, node="node-a", local_dir=str(tmp_path / "local"), catalog=False,
                             **kwargs)


def table_state(table: np.ndarray) -> dict[str, Any]:
    return {"embedding.weight": table.copy(), "head": np.arange(1000, dtype=np.float64), "epoch": 2}


def save(m: CheckpointManager, step: int, state: Any) -> None:
    future = m.save(step, state)
    assert future is not None
    future.result(timeout=30)


def restore_fresh(tmp_path: Path, step: int | None = None) -> tuple[Any, int]:
    """Restored state by a manager as after a restart, and how many chunks it had to index to get it."""
    reader = manager(tmp_path, keep_last=10)
    try:
        got = reader.restore(step)
        assert got is not None
        assert reader.local is not None
        return got.state, len(reader.local._index)
    finally:
        reader.close()


def assert_same(got: dict[str, Any], want: dict[str, Any]) -> None:
    assert list(got) == list(want)
    for key, value in want.items():
        if isinstance(value, np.ndarray):
            assert got[key].dtype == value.dtype and got[key].tobytes() == value.tobytes(), key
        else:
            assert got[key] == value


def sparse_steps(tmp_path: Path, *, changed: float, keep_last: int = 10) -> tuple[CheckpointManager, list[dict]]:
    """Step 1 a full table; step 2 with a share of its rows changed at random (a second pack)."""
    rng = np.random.default_rng(5)
    table = rng.standard_normal((ROWS, DIM)).astype(np.float32)
    m = manager(tmp_path, keep_last=keep_last)
    states = [table_state(table)]
    save(m, 1, states[0])
    rows = rng.permutation(ROWS)[:int(ROWS * changed)]
    table[rows] += 1.0
    states.append(table_state(table))
    save(m, 2, states[1])
    return m, states


def flip_a_byte_of_row(m: CheckpointManager, row: int) -> None:
    """Corrupt the first byte of a table row of step 2 where its layout says it lies."""
    plan = layout.read(m.local.manifest_path(JOB, 2, 0))
    assert plan is not None
    runs = next(r for s, r in plan.tensors if s.name == "embedding.weight")
    where = row * DIM * 4
    run = int(np.flatnonzero((runs.positions <= where) & (where < runs.positions + runs.lengths))[0])
    with open(m.local.packs / f"{runs.names[int(runs.packs[run])]}.pack", "r+b") as fh:
        at = int(runs.offsets[run]) + where - int(runs.positions[run])
        fh.seek(at)
        byte = fh.read(1)
        fh.seek(at)
        fh.write(bytes([byte[0] ^ 0x01]))


def test_a_restore_reads_through_the_layout_without_indexing_a_chunk(tmp_path: Path):
    m, states = sparse_steps(tmp_path, changed=0.03)
    m.close()
    manifest = m.local.manifest_path(JOB, 2, 0)
    assert layout.path(manifest).exists() and len(set(layout.packs_named(manifest) or [])) == 2  # both packs
    got, indexed = restore_fresh(tmp_path)
    assert_same(got, states[1])
    assert indexed == 0
    got, indexed = restore_fresh(tmp_path, step=1)
    assert_same(got, states[0])
    assert indexed == 0


@pytest.mark.parametrize("row", [1000, 2047, 4095])
def test_a_table_read_in_ranges_is_verified_segment_by_segment(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                               row: int):
    """A 1 MiB table in 64 KiB segments read in 128 KiB ranges (16 MiB each in use): every range checks its
    own segments, and a flipped byte in any of them sends the restore to the index, which names the chunk."""
    monkeypatch.setattr(saving, "SEGMENT_BYTES", 64 << 10)
    monkeypatch.setattr(restore, "RANGE_BYTES", 128 << 10)
    m, states = sparse_steps(tmp_path, changed=0.03)
    m.close()
    manifest = json.loads(m.local.get_manifest(JOB, 2, 0))
    table = next(t for t in manifest["tensors"] if t["name"] == "embedding.weight")
    assert table["segment_bytes"] == 64 << 10 and len(table["segments"]) == 16
    got, indexed = restore_fresh(tmp_path)
    assert_same(got, states[1])
    assert indexed == 0
    flip_a_byte_of_row(m, row)
    reader = manager(tmp_path)
    with pytest.raises(CorruptCheckpoint, match=rf"tensor 'embedding.weight' chunk {row // 8 + 1} of 512 is corrupt"):
        reader.restore(step=2)
    reader.close()


def test_collection_that_moves_chunks_rewrites_the_layouts_naming_their_old_pack(tmp_path: Path):
    m, states = sparse_steps(tmp_path, changed=0.8, keep_last=1)  # step 1 retired: its pack 80% dead, rewritten
    m.close()
    report = m.local.collect_garbage()
    assert report.manifests_deleted == 0
    assert not m.local.manifest_path(JOB, 1, 0).parent.exists()  # its layout went with its manifest
    manifest = m.local.manifest_path(JOB, 2, 0)
    present = {p.stem for p in m.local.packs.glob("*.pack")}
    named = layout.packs_named(manifest)
    assert named is not None and set(named) <= present
    got, indexed = restore_fresh(tmp_path)
    assert_same(got, states[1])
    assert indexed == 0  # without the rewrite the layout names a pack that is a spare now: the index is loaded


@pytest.mark.parametrize("damage", ["garbage", "truncated", "another manifest's", "deleted"])
def test_a_layout_that_is_damaged_or_not_this_manifests_only_costs_the_index(tmp_path: Path, damage: str,
                                                                           caplog: pytest.LogCaptureFixture):
    m, states = sparse_steps(tmp_path, changed=0.03)
    m.close()
    path = layout.path(m.local.manifest_path(JOB, 2, 0))
    if damage == "garbage":
        path.write_bytes(b"SNTLAY1\n" + bytes(range(256)) * 8)
    elif damage == "truncated":
        path.write_bytes(path.read_bytes()[:-100])
    elif damage == "another manifest's":
        shutil.copy(layout.path(m.local.manifest_path(JOB, 1, 0)), path)
    else:
        path.unlink()
    with caplog.at_level(logging.INFO, logger="sentinel.sdk.checkpoint"):
        got, indexed = restore_fresh(tmp_path)
    assert_same(got, states[1])
    assert indexed > 0
    if damage in ("garbage", "truncated"):
        assert "checkpoint layout unusable" in caplog.text and str(path.with_suffix(".json")) in caplog.text


def test_bytes_the_layout_leads_to_are_verified_and_corruption_is_named_by_chunk(tmp_path: Path):
    m, _ = sparse_steps(tmp_path, changed=0.03)
    m.close()
    flip_a_byte_of_row(m, 1000)  # chunk 126, where the layout sends the read
    reader = manager(tmp_path)
    with pytest.raises(CorruptCheckpoint, match=r"tensor 'embedding.weight' chunk 126 of 512 is corrupt"):
        reader.restore(step=2)
    reader.close()


def test_collection_deletes_a_layout_whose_manifest_was_never_written(tmp_path: Path):
    m, _ = sparse_steps(tmp_path, changed=0.03)
    m.close()
    orphan = layout.path(m.local.manifest_path(JOB, 9, 0))  # a writer killed between the two files
    orphan.parent.mkdir(parents=True)
    shutil.copy(layout.path(m.local.manifest_path(JOB, 2, 0)), orphan)
    m.local.collect_garbage()
    assert not orphan.exists()
    assert layout.path(m.local.manifest_path(JOB, 2, 0)).exists()


def test_a_manifest_keeps_many_digests_as_one_string_and_one_of_format_1_still_restores(tmp_path: Path):
    m, states = sparse_steps(tmp_path, changed=0.03)
    m.close()
    path = m.local.manifest_path(JOB, 2, 0)
    manifest = json.loads(path.read_bytes())
    table = next(t for t in manifest["tensors"] if t["name"] == "embedding.weight")
    assert "chunks" not in table and len(table["chunks_hex"]) == 512 * 32
    hexed = table.pop("chunks_hex")
    table["chunks"] = [hexed[i:i + 32] for i in range(0, len(hexed), 32)]  # as format 1 wrote it:
    del table["segments"], table["segment_bytes"]  # a list, and one digest over all the bytes
    table["digest"] = digest(states[1]["embedding.weight"].tobytes())
    path.write_text(json.dumps(manifest))
    got, indexed = restore_fresh(tmp_path)  # the layout was made for the other text: the index path
    assert_same(got, states[1])
    assert indexed > 0
    assert m.local.collect_garbage().manifests_deleted == 0
    assert_same(restore_fresh(tmp_path, step=1)[0], states[0])  # collection read both forms: nothing lost


@pytest.mark.parametrize("unit", [1, 2048])
def test_runs_copied_at_once_land_where_one_by_one_would(unit: int):
    rng = np.random.default_rng(unit)
    source = rng.integers(0, 256, 300 * 2048, dtype=np.uint8)
    n = 40
    lengths = rng.integers(1, 4, n) * 2048 if unit > 1 else rng.integers(1, 3000, n)
    sources = rng.integers(0, len(source) - int(lengths.max()), n) // unit * unit
    positions = np.cumsum(lengths) - lengths  # back to back in the target
    into = np.zeros(int(lengths.sum()) + 100, dtype=np.uint8)
    packread._copy_runs(memoryview(source), sources, memoryview(into), positions, lengths)
    want = np.zeros_like(into)
    for at, position, length in zip(sources, positions, lengths, strict=True):
        want[position:position + length] = source[at:at + length]
    assert into.tobytes() == want.tobytes()


def test_a_restore_in_a_fresh_process_imports_nothing_on_its_way(tmp_path: Path):
    """A restart's restore does not pay for imports (np.unique, for one, imports numpy.ma on first use: 10 ms of
    a 20 ms restore of a 20 MB table): once the SDK's modules are in, restoring a layout with runs from two
    packs loads no module."""
    m, _ = sparse_steps(tmp_path, changed=0.03)
    m.close()
    script = f"""
import sys
from sentinel.sdk import checkpoint, restore
before = set(sys.modules)
m = checkpoint.CheckpointManager(job_id={JOB}, rank=0, node="node-a", local_dir={str(tmp_path / "local")!r},
                                 catalog=False)
got = m.restore()
assert got is not None and got.step == 2
print(sorted(set(sys.modules) - before))
"""
    child = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120)
    assert child.returncode == 0, child.stderr
    assert child.stdout.strip() == "[]"
