"""In steady state the stage thread writes the guarded CPU tensors straight into a spare pack of the local tier
instead of copying them into buffers for the writer thread (saving.DirectWrites); a slow such write makes the
next saves copy; and a save that fails after writing chunks leaves them to no later save. Real directories."""

from __future__ import annotations

import threading
from pathlib import Path
from typing import Any

import pytest

from sentinel.sdk import saving
from sentinel.sdk.checkpoint import CheckpointError, CheckpointManager
from tests.sdk.test_checkpoint_busy import GatedStage

JOB = 11


@pytest.fixture
def unhurried(monkeypatch: pytest.MonkeyPatch) -> None:
    """No write counts as slow: on a loaded machine a 0.8 MB write can take 20 ms and pause the direct writes
    (test_a_slow_direct_write_makes_the_next_saves_copy is about that)."""
    monkeypatch.setattr(saving, "DIRECT_SLACK_SECONDS", 60.0)


def options(tmp_path: Path) -> dict[str, Any]:
    return {"job_id": JOB, "rank": 0, "node": "node-a", "local_dir": str(tmp_path / "{node}"), "catalog": False,
            "keep_last": 1}


def train(torch: Any) -> tuple[Any, Any, Any]:
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(256, 256), torch.nn.Linear(256, 8))
    optimizer = torch.optim.Adam(model.parameters())

    def step() -> None:
        model(torch.randn(4, 256)).square().mean().backward()
        optimizer.step()  # guarded: waits for the save in flight to have its tensors
        optimizer.zero_grad()

    step()
    return model, optimizer, step


def snapshot(model: Any, optimizer: Any) -> dict[str, Any]:
    return {"model": model.state_dict(), "optim": optimizer.state_dict()}


def test_in_steady_state_guarded_tensors_go_straight_into_a_spare_pack(tmp_path: Path, unhurried: None):
    torch = pytest.importorskip("torch")
    m = CheckpointManager(**options(tmp_path))
    model, optimizer, step = train(torch)
    wants = {}
    for n in range(1, 6):
        wants[n] = {k: v.clone() for k, v in model.state_dict().items()}
        future = m.save(n, snapshot(model, optimizer))
        assert future is not None
        step()  # right after save(): the direct write must come first
        assert future.result(timeout=30).outcome == "written"
    # save 1 wrote directly (a first save), 2 copied (no spare yet: keep_last=1 retires step 1 after it), from
    # 3 on each went into the spare its predecessor's retirement left
    assert m._direct.writes == 3 and m._direct.backoff == 0
    got = m.restore(5)
    assert got is not None and all(torch.equal(got.state["model"][k], v) for k, v in wants[5].items())
    m.close()


def test_a_slow_direct_write_makes_the_next_saves_copy(tmp_path: Path):
    store = type("Store", (), {"largest_spare": lambda self: 1 << 30})()
    tensors = {"w": saving.np.zeros(1 << 20, dtype=saving.np.float32)}
    direct = saving.DirectWrites()
    assert direct.allowed(store, tensors)
    direct.wrote(7, 4 << 20, 0.5)  # 8 MB/s: a page cache being written back, or a real disk
    assert [direct.allowed(store, tensors) for _ in range(saving.DIRECT_BACKOFF_SAVES)] == [False] * 10
    assert direct.allowed(store, tensors)
    direct.wrote(8, 4 << 20, 0.001)  # 4 GB/s: into cached pages
    assert direct.allowed(store, tensors)
    small = type("Store", (), {"largest_spare": lambda self: 1 << 10})()
    assert not direct.allowed(small, tensors), "no spare holds them: copying beats filling a new file"


def test_chunks_written_by_a_save_that_failed_are_written_again_not_named(tmp_path: Path, unhurried: None):
    torch = pytest.importorskip("torch")
    m = GatedStage(**options(tmp_path))
    m.gate = threading.Event()
    m.gate.set()
    model, optimizer, step = train(torch)
    for n in range(1, 4):  # to steady state: a spare is there
        future = m.save(n, snapshot(model, optimizer))
        assert future is not None
        step()
        future.result(timeout=30)
    writes = m._direct.writes
    m.gate.clear()
    failed = m.save(4, snapshot(model, optimizer))
    assert failed is not None
    with torch.no_grad():
        model[0].weight.mul_(2)  # not an optimizer step: nothing waits for the save
    m.gate.set()
    with pytest.raises(CheckpointError, match=r"step 4 .*weight.*changed in place"):
        failed.result(timeout=30)
    assert m._direct.writes == writes + 1, "the failed save wrote its guarded tensors straight into the store"
    again = m.save(5, snapshot(model, optimizer))  # the same bytes as step 4 wrote, copied before it returns
    assert again is not None
    result = again.result(timeout=30)
    weight = model[0].weight.numel() * 4
    assert result.bytes_written >= weight, "step 4's chunks are not trusted: step 5 wrote its own"
    want = {k: v.clone() for k, v in model.state_dict().items()}
    got = m.restore(5)
    assert got is not None and all(torch.equal(got.state["model"][k], v) for k, v in want.items())
    m.close()
