"""CheckpointManager end to end on real directories: exact round trips, incremental writes, tiers, retention,
and corruption that is found, named and stepped around."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from sentinel.sdk.checkpoint import CheckpointError, CheckpointManager, CorruptCheckpoint, Restored, SaveResult

JOB = 7


def manager(tmp_path: Path, **kwargs: Any) -> CheckpointManager:
    options: dict[str, Any] = {"job_id": JOB, "rank": 0, "node": "node-a",
                               "local_dir": str(tmp_path / "local" / "{node}"), "catalog": False}
    options.update(kwargs)
    return CheckpointManager(**options)


def saved(m: CheckpointManager, step: int, state: Any) -> SaveResult:
    future = m.save(step, state)
    assert future is not None, f"no tier is due at step {step}"
    return future.result(timeout=30)


def restored(m: CheckpointManager, step: int | None = None) -> Restored:
    got = m.restore(step)
    assert got is not None
    return got


def assert_identical(got: Any, want: Any, path: str = "state") -> None:
    """Same structure, same container and key types, same dtypes and shapes, the same bytes."""
    assert type(got) is type(want) or (isinstance(want, dict) and type(got) is dict), f"{path}: {type(got)}"
    if isinstance(want, dict):
        assert list(got) == list(want), f"{path}: keys {list(got)} != {list(want)}"
        for key in want:
            assert type(key) is type(next(k for k in got if k == key)), f"{path}: key {key!r} changed type"
            assert_identical(got[key], want[key], f"{path}[{key!r}]")
    elif isinstance(want, (list, tuple)):
        assert len(got) == len(want), path
        for i, (g, w) in enumerate(zip(got, want, strict=True)):
            assert_identical(g, w, f"{path}[{i}]")
    elif isinstance(want, np.ndarray):
        assert (got.dtype, got.shape) == (want.dtype, want.shape), path
        assert got.tobytes() == np.ascontiguousarray(want).tobytes(), f"{path}: bytes differ"
    elif type(want).__module__.startswith("torch"):
        import torch

        assert (got.dtype, got.shape, got.device) == (want.dtype, want.shape, torch.device("cpu")), path
        assert got.is_contiguous(), path
        as_bytes = [t.contiguous().reshape(-1).view(torch.uint8) for t in (got, want)] if want.numel() else []
        assert not as_bytes or torch.equal(*as_bytes), f"{path}: bytes differ"
    else:
        assert got == want, path


def numpy_state(seed: int) -> dict[str, Any]:
    rng = np.random.default_rng(seed)
    return {"weights": rng.standard_normal((64, 33)).astype(np.float32), "ids": rng.integers(0, 1 << 40, 100),
            "nested": {1: [rng.random(7), np.arange(6, dtype=np.int16).reshape(2, 3)], "pair": (1.5, 2)},
            "big_endian": np.arange(5, dtype=">f8"), "mask": rng.random(9) > 0.5, "empty": np.zeros((0, 4)),
            "scalar": np.array(3.25), "plain": [None, True, 1, 2.5, "x"]}


def test_restore_with_nothing_saved_returns_none(tmp_path: Path):
    m = manager(tmp_path, persistent_dir=str(tmp_path / "persistent"))
    assert m.restore() is None
    with pytest.raises(CheckpointError, match="step 5"):
        m.restore(step=5)
    m.close()


@pytest.mark.torch
def test_a_torch_model_and_adam_state_round_trip_bitwise(tmp_path: Path):
    torch = pytest.importorskip("torch")
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 4))
    opt = torch.optim.Adam(model.parameters(), lr=1e-3, betas=(0.8, 0.99))
    for _ in range(2):
        opt.zero_grad()
        model(torch.randn(5, 8)).pow(2).sum().backward()
        opt.step()
    state = {"model": model.state_dict(), "optim": opt.state_dict(), "epoch": 3, "name": "run",
             "rng": np.random.default_rng(1).random(4), "half": torch.randn(3, 5).to(torch.bfloat16),
             "strided": torch.arange(12.0).reshape(3, 4).t(), "zero_d": torch.tensor(7, dtype=torch.int64),
             "none": torch.empty(0, 3), "pairs": (torch.ones(2, dtype=torch.bool), (1, "a"), [2.5, None])}
    assert isinstance(next(iter(state["optim"]["state"])), int) and state["optim"]["param_groups"][0]["params"]
    m = manager(tmp_path)
    result = saved(m, 10, state)
    assert result.tiers == ["local"] and 0 < result.bytes_written <= result.bytes_total
    m.close()

    got = restored(manager(tmp_path))
    assert got.step == 10 and got.skipped == [] and got.location["node"] == "node-a"
    assert_identical(got.state, state)
    assert got.state["half"].dtype == torch.bfloat16
    model2 = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 4))
    opt2 = torch.optim.Adam(model2.parameters())
    model2.load_state_dict(got.state["model"])
    opt2.load_state_dict(got.state["optim"])
    assert opt2.param_groups[0]["betas"] == (0.8, 0.99)
    assert torch.equal(opt2.state[model2[0].weight]["exp_avg"], opt.state[model[0].weight]["exp_avg"])


def test_a_numpy_only_state_saves_and_restores_without_torch(tmp_path: Path):
    code = f"""
import json, sys
sys.modules["torch"] = None  # as if torch were not installed: importing it fails
sys.path.insert(0, {str(Path(__file__).parent)!r})
from test_checkpoint_manager import assert_identical, manager, numpy_state, restored, saved
from pathlib import Path
m = manager(Path({str(tmp_path)!r}))
saved(m, 1, numpy_state(1))
saved(m, 2, numpy_state(2))
got = restored(m)
assert_identical(got.state, numpy_state(2))
assert_identical(restored(m, 1).state, numpy_state(1))
m.close()
print(json.dumps({{"step": got.step, "torch": sys.modules["torch"] is not None}}))
"""
    run = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert run.returncode == 0, run.stderr
    assert json.loads(run.stdout.strip().splitlines()[-1]) == {"step": 2, "torch": False}


def test_unchanged_state_writes_nothing_and_a_changed_tensor_writes_only_its_chunks(tmp_path: Path):
    rng = np.random.default_rng(0)
    state = {"big": rng.standard_normal(1 << 18).astype(np.float32), "small": rng.random(1000).astype(np.float32)}
    m = manager(tmp_path, chunk_bytes=64 << 10)
    first = saved(m, 1, state)
    assert first.bytes_written == first.bytes_total == (1 << 20) + 4000 and first.chunks_written == 17
    again = saved(m, 2, state)
    assert (again.bytes_written, again.chunks_written) == (0, 0)
    state["small"][3] += 1
    small = saved(m, 3, state)
    assert (small.bytes_written, small.chunks_written) == (4000, 1)
    state["big"][100_000] = 42.0
    big = saved(m, 4, state)
    assert (big.bytes_written, big.chunks_written) == (64 << 10, 1)
    m.close()
    assert_identical(restored(manager(tmp_path)).state, state)


def test_an_embedding_with_one_percent_of_rows_changed_writes_under_five_percent(tmp_path: Path):
    rng = np.random.default_rng(0)
    state = {"model": {"tok_embed.weight": rng.standard_normal((2048, 512)).astype(np.float32),
                       "head.weight": rng.standard_normal((64, 512)).astype(np.float32)}}
    m = manager(tmp_path)
    first = saved(m, 1, state)
    rows = rng.choice(2048, size=20, replace=False)
    state["model"]["tok_embed.weight"][rows] += 1.0
    second = saved(m, 2, state)
    assert 20 * 512 * 4 <= second.bytes_written <= 0.05 * first.bytes_total
    m.close()
    assert_identical(restored(manager(tmp_path)).state, state)


def test_tiers_are_written_at_their_cadence(tmp_path: Path):
    m = manager(tmp_path, every=2, persistent_every=4, keep_last=100, persistent_dir=str(tmp_path / "persistent"))
    tiers = {}
    for step in range(1, 9):
        future = m.save(step, {"x": np.full(10, step)})
        tiers[step] = future.result().tiers if future is not None else None
    m.close()
    assert tiers == {1: None, 2: ["local"], 3: None, 4: ["local", "persistent"], 5: None, 6: ["local"],
                     7: None, 8: ["local", "persistent"]}
    assert m.local.steps(JOB) == {2: [0], 4: [0], 6: [0], 8: [0]}
    assert m.persistent is not None and m.persistent.steps(JOB) == {4: [0], 8: [0]}
    shutil.rmtree(tmp_path / "local")  # the node is gone: the persistent tier still has step 8
    got = restored(manager(tmp_path, persistent_dir=str(tmp_path / "persistent")))
    assert got.step == 8 and got.location["tier"] == "persistent" and int(got.state["x"][0]) == 8


def test_a_replica_node_gets_a_copy_in_its_local_dir(tmp_path: Path):
    m = manager(tmp_path, replica_node="node-b")
    state = numpy_state(3)
    result = saved(m, 5, state)
    m.close()
    assert result.tiers == ["local", "local"]
    for node in ("node-a", "node-b"):
        assert (tmp_path / "local" / node / "manifests" / f"job-{JOB}" / f"step-{5:012d}" / "rank-00000.json").is_file()
    shutil.rmtree(tmp_path / "local" / "node-a")  # the node died; the rank restarts on its peer
    got = restored(manager(tmp_path, node="node-b"))
    assert got.step == 5 and got.location == {"tier": "local", "node": "node-b",
                                              "uri": str(tmp_path / "local" / "node-b")}
    assert_identical(got.state, state)


def test_local_retention_keeps_the_last_n_and_every_mth_step(tmp_path: Path):
    m = manager(tmp_path, keep_last=2, keep_every=5)
    results = {step: saved(m, step, numpy_state(step)) for step in range(1, 13)}
    m.close()
    assert {step: r.retired for step, r in results.items() if r.retired} == {
        3: [1], 4: [2], 5: [3], 6: [4], 8: [6], 9: [7], 10: [8], 11: [9]}
    assert sorted(m.local.steps(JOB)) == [5, 10, 11, 12]
    for step in (5, 10, 11, 12):
        assert_identical(restored(manager(tmp_path), step).state, numpy_state(step))
    live = sum(p.stat().st_size for p in m.local.packs.glob("*.pack"))
    assert live < 5 * results[12].bytes_total  # the chunks only retired steps used were collected


def test_local_retention_does_not_delete_the_only_persistent_checkpoint(tmp_path: Path):
    persistent = str(tmp_path / "persistent")
    m = manager(tmp_path, keep_last=2, persistent_every=4, persistent_dir=persistent)
    for step in range(1, 7):
        saved(m, step, numpy_state(step))
    m.close()
    assert sorted(m.local.steps(JOB)) == [5, 6]
    assert m.persistent is not None and m.persistent.steps(JOB) == {4: [0]}
    shutil.rmtree(tmp_path / "local")
    got = restored(manager(tmp_path, persistent_dir=persistent))
    assert got.step == 4
    assert_identical(got.state, numpy_state(4))


def two_steps(tmp_path: Path) -> tuple[CheckpointManager, dict[str, Any], dict[str, Any]]:
    rng = np.random.default_rng(0)
    first = {"frozen": rng.random(5000), "moving": {"layer": rng.random((50, 50)).astype(np.float32)}}
    second = {"frozen": first["frozen"], "moving": {"layer": first["moving"]["layer"] + 1}}
    m = manager(tmp_path, keep_last=10)
    saved(m, 1, first)
    saved(m, 2, second)
    m.close()
    return manager(tmp_path, keep_last=10), first, second


def test_a_flipped_byte_in_a_pack_is_named_and_restore_falls_back_to_the_older_step(tmp_path: Path):
    m, first, _ = two_steps(tmp_path)
    spec = next(t for t in json.loads(m.local.get_manifest(JOB, 2, 0))["tensors"] if t["name"] == "moving.layer")
    m.local.refresh()
    ref = m.local.chunk_refs()[spec["chunks"][0]]
    pack = m.local.packs / f"{ref.pack}.pack"
    with open(pack, "r+b") as fh:
        fh.seek(ref.offset + 123)
        byte = fh.read(1)
        fh.seek(ref.offset + 123)
        fh.write(bytes([byte[0] ^ 0x01]))

    with pytest.raises(CorruptCheckpoint) as caught:
        m.restore(step=2)
    message = str(caught.value)
    assert "step 2" in message and "tensor 'moving.layer' chunk 1 of 1 is corrupt" in message
    assert spec["chunks"][0] in message and str(pack) in message

    got = restored(m)
    assert got.step == 1
    assert_identical(got.state, first)
    assert got.skipped and all("tensor 'moving.layer' chunk 1 of 1 is corrupt" in s for s in got.skipped)


def test_a_damaged_manifest_is_named_and_restore_falls_back_to_the_older_step(tmp_path: Path):
    m, first, _ = two_steps(tmp_path)
    path = m.local.manifest_path(JOB, 2, 0)
    path.write_bytes(path.read_bytes()[:-40])  # a truncated manifest
    with pytest.raises(CorruptCheckpoint, match=re.escape(f"the manifest {path} is damaged")):
        m.restore(step=2)
    got = restored(m)
    assert got.step == 1 and got.skipped and str(path) in got.skipped[0]
    assert_identical(got.state, first)
    # and a manifest that still parses but names a chunk no pack holds
    manifest = json.loads(m.local.get_manifest(JOB, 1, 0))
    manifest["tensors"][0]["chunks"][0] = "0" * 32
    m.local.manifest_path(JOB, 1, 0).write_text(json.dumps(manifest))
    with pytest.raises(CheckpointError, match=r"0{32} is in no pack"):
        m.restore(step=1)


def test_a_guarded_optimizer_waits_for_the_overlapped_snapshot(tmp_path: Path):
    """With guard(), save() returns before the parameters are copied; the next optimizer step waits for
    the copy, and buffers the forward pass mutates (BatchNorm) are copied before save() returns."""
    torch = pytest.importorskip("torch")
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(64, 64), torch.nn.BatchNorm1d(64), torch.nn.Linear(64, 8))
    optimizer = torch.optim.Adam(model.parameters())

    class SlowSnapshot(CheckpointManager):
        """Copies on the writer thread take 50 ms each: the next optimizer step surely comes in the middle."""

        def _stage(self, name: str, value: Any, stream: Any = None) -> Any:
            if threading.current_thread() is not threading.main_thread():
                time.sleep(0.05)
            return super()._stage(name, value, stream)

    m = SlowSnapshot(job_id=JOB, rank=0, node="node-a", local_dir=str(tmp_path / "local" / "{node}"), catalog=False)
    m.guard(optimizer)
    x = torch.randn(32, 64)
    model(x).sum().backward()
    optimizer.step()
    warm = m.save(0, {"model": model.state_dict(), "optim": optimizer.state_dict()})  # allocates the buffers
    assert warm is not None and warm.result().outcome == "written"
    expected = {"model": {k: v.clone() for k, v in model.state_dict().items()},
                "optim": {i: {k: v.clone() if torch.is_tensor(v) else v for k, v in s.items()}
                          for i, s in optimizer.state_dict()["state"].items()}}
    future = m.save(1, {"model": model.state_dict(), "optim": optimizer.state_dict()})
    assert future is not None
    model(x).sum().backward()  # moves BatchNorm's running stats while the snapshot may still run
    optimizer.step()  # must wait for the snapshot of the parameters and Adam's moments
    result = future.result()
    assert result.stall_seconds > 0.1, "the optimizer step waited for the copies, and that is the stall"
    state = restored(m, 1).state
    assert_identical(state["model"], expected["model"])
    assert_identical(state["optim"]["state"], expected["optim"])
    assert not torch.equal(state["model"]["0.weight"], model.state_dict()["0.weight"]), "the model moved on"
