"""A save that finds the previous one still writing does not wait for it: it is coalesced or skipped, and its
result and the manager's counters say which. The copy of what optimizers own overlaps the next forward and
backward by default, and a tensor changed in place meanwhile fails that save. Real directories, a paced (slow)
writer thread."""

from __future__ import annotations

import threading
import time
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from sentinel.sdk.checkpoint import CheckpointError, CheckpointManager, CorruptCheckpoint

JOB = 9
SLOW = 4e6  # bytes/s: an 8 MB state takes about 2 s to write


def manager_options(tmp_path: Path, **kwargs: Any) -> dict[str, Any]:
    options: dict[str, Any] = {"job_id": JOB, "rank": 0, "node": "node-a", "local_dir": str(tmp_path / "{node}"),
                               "catalog": False, "write_bytes_per_second": SLOW, "keep_last": 10}
    return options | kwargs


def manager(tmp_path: Path, **kwargs: Any) -> CheckpointManager:
    return CheckpointManager(**manager_options(tmp_path, **kwargs))


def state(step: int) -> dict[str, Any]:
    return {"w": np.arange(2_000_000, dtype=np.float32) + step, "step": step}  # no two chunks alike


def timed_save(m: CheckpointManager, step: int) -> tuple[float, Any]:
    started = time.perf_counter()
    future = m.save(step, state(step))
    assert future is not None
    return time.perf_counter() - started, future


def test_saves_during_a_write_are_coalesced_into_the_newest(tmp_path: Path):
    m = manager(tmp_path)
    _, first = timed_save(m, 1)
    stall2, second = timed_save(m, 2)
    stall3, third = timed_save(m, 3)  # step 2 is queued, not begun: step 3 replaces it
    assert not first.done(), "the first write (about 2 s) is still going"
    assert stall2 < 0.5 and stall3 < 0.5, f"a save during a write took {stall2:.2f} s and {stall3:.2f} s"
    replaced = second.result(timeout=1)  # resolved at once, not after the write
    assert (replaced.outcome, replaced.superseded_by, replaced.tiers) == ("coalesced", 3, [])
    written = third.result(timeout=30)
    assert written.outcome == "written" and written.coalesced == [2] and written.tiers == ["local"]
    assert first.result().outcome == "written"
    assert m.saves_coalesced == 1 and m.saves_skipped == 0
    m.close()
    assert m.local.steps(JOB) == {1: [0], 3: [0]}
    got = m.restore()
    assert got is not None and got.step == 3 and np.array_equal(got.state["w"], state(3)["w"])


def test_skip_policy_takes_nothing_and_says_so(tmp_path: Path):
    m = manager(tmp_path, when_busy="skip")
    _, first = timed_save(m, 1)
    stall, second = timed_save(m, 2)
    assert stall < 0.1 and second.done()
    skipped = second.result()
    assert (skipped.outcome, skipped.tiers, skipped.bytes_written) == ("skipped", [], 0)
    assert m.saves_skipped == 1
    first.result(timeout=30)
    m.close()
    assert m.local.steps(JOB) == {1: [0]}


def test_a_persistent_tier_due_at_a_replaced_save_is_written_by_the_next(tmp_path: Path):
    m = manager(tmp_path, persistent_dir=str(tmp_path / "persistent"), persistent_every=2)
    timed_save(m, 1)
    _, second = timed_save(m, 2)  # due on the persistent tier too, but queued behind step 1
    _, third = timed_save(m, 3)
    assert second.result(timeout=1).outcome == "coalesced"
    assert third.result(timeout=30).tiers == ["local", "persistent"]
    m.close()
    assert m.persistent is not None and m.persistent.steps(JOB) == {3: [0]}


def test_wait_policy_blocks_as_before(tmp_path: Path):
    m = manager(tmp_path, when_busy="wait")
    _, first = timed_save(m, 1)
    stall, second = timed_save(m, 2)
    assert first.done() and stall > 1.0, "it waited for the first write"
    assert second.result(timeout=30).outcome == "written"
    m.close()
    with pytest.raises(ValueError, match="when_busy"):
        manager(tmp_path, when_busy="sometimes")


def test_given_its_optimizer_the_manager_guards_it(tmp_path: Path):
    torch = pytest.importorskip("torch")
    model = torch.nn.Linear(16, 4)
    optimizer = torch.optim.Adam(model.parameters())
    m = manager(tmp_path, optimizers=[optimizer], write_bytes_per_second=None)
    assert m._guarded == [optimizer]
    model(torch.randn(2, 16)).sum().backward()
    optimizer.step()
    want = {k: v.clone() for k, v in model.state_dict().items()}
    future = m.save(1, {"model": model.state_dict(), "optim": optimizer.state_dict()})
    assert future is not None
    model(torch.randn(2, 16)).sum().backward()
    optimizer.step()  # waits for the snapshot of the parameters
    future.result(timeout=30)
    m.close()
    got = m.restore(1)
    assert got is not None and all(torch.equal(got.state["model"][k], v) for k, v in want.items())


def test_a_small_chunked_tensor_is_verified_whole_and_a_bad_row_is_named(tmp_path: Path):
    m = manager(tmp_path, write_bytes_per_second=None)
    table = np.random.default_rng(0).standard_normal((4096, 64)).astype(np.float32)  # 256-byte rows
    future = m.save(1, {"embed.weight": table})
    assert future is not None
    future.result(timeout=30)
    m.close()
    pack = next(m.local.packs.glob("*.pack"))
    data = bytearray(pack.read_bytes())
    data[600 * 256 + 3] ^= 0x01  # a row in the middle of the table
    pack.write_bytes(bytes(data))
    with pytest.raises(CorruptCheckpoint, match=r"'embed.weight' chunk \d+ of \d+ is corrupt"):
        m.restore(1)


class SlowStage(CheckpointManager):
    """Copies on the stage thread take 50 ms each: whatever the loop does right after save() comes first."""

    def _stage(self, name: str, value: Any, stream: Any = None) -> Any:
        if threading.current_thread() is not threading.main_thread():
            time.sleep(0.05)
        return super()._stage(name, value, stream)


class GatedStage(CheckpointManager):
    """The stage thread's work waits for `gate`: the test's in-place change comes first, whatever the load
    (a 50 ms head start lost to the scheduler on a busy CI machine once). All of its work: a first save writes
    the guarded tensors straight into the store (no copy), and gating only the copies left that write racing
    the change (the save then rightly succeeded: half the runs of tests/sdk)."""

    gate = threading.Event()

    def _stage_later(self, job: Any) -> None:
        self.gate.wait(10)
        super()._stage_later(job)


def adam(torch: Any) -> tuple[Any, Any]:
    torch.manual_seed(0)
    model = torch.nn.Linear(32, 8)
    optimizer = torch.optim.Adam(model.parameters())
    model(torch.randn(4, 32)).sum().backward()
    optimizer.step()  # the manager sees it step: from now on it is guarded
    return model, optimizer


def test_by_default_every_optimizer_that_steps_is_guarded(tmp_path: Path):
    torch = pytest.importorskip("torch")
    m = SlowStage(**manager_options(tmp_path, write_bytes_per_second=None))
    model, optimizer = adam(torch)
    warm = m.save(0, {"model": model.state_dict(), "optim": optimizer.state_dict()})  # allocates the buffers
    assert warm is not None and warm.result(timeout=30).outcome == "written"
    want = {k: v.clone() for k, v in model.state_dict().items()}
    future = m.save(1, {"model": model.state_dict(), "optim": optimizer.state_dict()})
    assert future is not None
    model(torch.randn(4, 32)).sum().backward()
    optimizer.step()  # waits for the stage thread's copies (the global step hook)
    result = future.result(timeout=30)
    assert result.stall_seconds > 0.1, "the step waited for the overlapped copy, and that wait is the stall"
    m.close()
    got = m.restore(1)
    assert got is not None and all(torch.equal(got.state["model"][k], v) for k, v in want.items())
    assert m.overlap_disabled is None


def test_a_guarded_tensor_changed_in_place_before_its_copy_fails_the_save_not_the_checkpoint(tmp_path: Path):
    torch = pytest.importorskip("torch")
    m = GatedStage(**manager_options(tmp_path, write_bytes_per_second=None))
    m.gate = threading.Event()
    model, optimizer = adam(torch)
    future = m.save(1, {"model": model.state_dict(), "optim": optimizer.state_dict()})
    assert future is not None
    with torch.no_grad():
        model.weight.mul_(2)  # not an optimizer step: nothing waits, the copy may mix both states
    m.gate.set()
    with pytest.raises(CheckpointError, match=r"step 1 .*weight.*changed in place"):
        future.result(timeout=30)
    assert m.overlap_disabled is not None and m.errors == 1
    want = {k: v.clone() for k, v in model.state_dict().items()}
    second = m.save(2, {"model": model.state_dict(), "optim": optimizer.state_dict()})  # copied before it returns
    assert second is not None
    with torch.no_grad():
        model.weight.mul_(2)
    assert second.result(timeout=30).outcome == "written"
    m.close()
    assert m.local.steps(JOB) == {2: [0]}
    got = m.restore(2)
    assert got is not None and all(torch.equal(got.state["model"][k], v) for k, v in want.items())


@pytest.mark.parametrize("how", ["argument", "environment"])
def test_guard_false_copies_everything_before_save_returns(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                          how: str):
    torch = pytest.importorskip("torch")
    if how == "environment":
        monkeypatch.setenv("SENTINEL_CHECKPOINT_GUARD", "0")
    options = manager_options(tmp_path, write_bytes_per_second=None) | ({"guard": False} if how == "argument" else {})
    m = SlowStage(**options)
    model, optimizer = adam(torch)
    want = {k: v.clone() for k, v in model.state_dict().items()}
    future = m.save(1, {"model": model.state_dict(), "optim": optimizer.state_dict()})
    assert future is not None
    with torch.no_grad():
        model.weight.mul_(2)  # after save() returned: not in the checkpoint
    assert future.result(timeout=30).outcome == "written"
    m.close()
    got = m.restore(1)
    assert got is not None and all(torch.equal(got.state["model"][k], v) for k, v in want.items())


class SlowManifest(CheckpointManager):
    """The writer thread starts 0.5 s late: the manifest comes well after save() returned."""

    def _write(self, job: Any) -> Any:
        time.sleep(0.5)
        return super()._write(job)


def test_a_first_save_writes_its_chunks_at_once_and_keeps_them_from_collection_until_its_manifest(tmp_path: Path):
    m = SlowManifest(**manager_options(tmp_path, write_bytes_per_second=None))
    data = state(1)
    want = data["w"].copy()
    future = m.save(1, data)  # nothing saved before: written straight to the local tier, no buffer copied
    assert future is not None
    data["w"] += 1  # after save() returned: not in the checkpoint
    assert list(m.local.packs.glob("*.pack")), "its chunks are on disk before save() returned"
    with pytest.raises(TimeoutError):  # another process's collection would find a pack no manifest names yet
        type(m.local)(m.local.root).collect_garbage(timeout_seconds=0.2)
    assert future.result(timeout=30).outcome == "written"
    assert type(m.local)(m.local.root).collect_garbage().packs_deleted == 0
    second = m.save(2, data)  # from now on it is copied into a buffer and written by the writer thread
    assert second is not None
    data["w"] += 1
    assert second.result(timeout=30).outcome == "written"
    m.close()
    for step, expected in ((1, want), (2, want + 1)):
        got = m.restore(step)
        assert got is not None and np.array_equal(got.state["w"], expected)
