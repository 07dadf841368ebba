"""A checkpoint that does not fit fails with a clear error and leaves the earlier checkpoints intact.

The disk is a real 4 MiB tmpfs, mounted in a private user and mount namespace (`unshare -rm`), so the test
needs neither root nor a loop device. Run as a script, this module is the child that saves into it and
prints what it saw as JSON: `python test_checkpoint_disk_full.py DIR`.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from sentinel.sdk.checkpoint import CheckpointManager
from sentinel.sdk.chunks import digest
from sentinel.sdk.stores import LocalDirStore

DISK = "4m"
MOUNT_FAILED = 77


def child(directory: Path) -> dict[str, Any]:
    small = {"w": np.random.default_rng(1).standard_normal(50_000), "step": 1}  # 400 KB
    big = {"w": np.random.default_rng(2).standard_normal(1_000_000)}  # 8 MB: cannot fit
    m = CheckpointManager(job_id=3, rank=0, node="n", local_dir=str(directory), catalog=False)
    first = m.save(1, small)
    assert first is not None
    first.result()
    used_before = shutil.disk_usage(directory).used
    failing = m.save(2, big)
    assert failing is not None
    error = failing.exception()
    used_after = shutil.disk_usage(directory).used
    packs = sorted(p.name for p in m.local.packs.iterdir())
    torn = [p for p in packs if p.endswith(".pack") and p.removesuffix(".pack") + ".idx" not in packs]
    collected = m.local.collect_garbage()
    restored = m.restore()
    third = m.save(3, {"w": small["w"] + 1, "step": 3})  # the store still works once the big save is given up
    assert third is not None
    third.result()
    m.close()
    again = m.restore(3)
    return {
        "error_type": type(error).__name__, "error": str(error), "errors": m.errors,
        "steps": sorted(m.local.steps(3)), "torn": torn, "leftover_files": [p for p in packs if p.startswith(".")],
        "grew_by": used_after - used_before, "collected_packs": collected.packs_deleted,
        "restored_step": restored.step if restored else None,
        "restored_exact": restored is not None and restored.state["step"] == 1
        and restored.state["w"].tobytes() == small["w"].tobytes(),
        "step_3_exact": again is not None and again.state["w"].tobytes() == (small["w"] + 1).tobytes(),
    }


def test_a_full_disk_fails_the_save_clearly_and_keeps_earlier_checkpoints(tmp_path: Path):
    if shutil.which("unshare") is None:
        pytest.skip("needs unshare(1) to mount a small tmpfs in a private namespace")
    disk = tmp_path / "disk"
    result = run_child(tmp_path)
    assert result["error_type"] == "CheckpointError"
    assert "No space left on device" in result["error"] and "earlier checkpoints are untouched" in result["error"]
    assert "step 2" in result["error"] and str(disk) in result["error"]  # which save, and where
    assert result["errors"] == 1
    assert result["torn"] == [] and result["leftover_files"] == [] and result["collected_packs"] == 0
    assert result["grew_by"] < 64 << 10  # the partial pack was removed, not left to fill the disk
    assert result["steps"] == [1, 3]
    assert result["restored_step"] == 1 and result["restored_exact"] and result["step_3_exact"]


def spares_child(directory: Path) -> dict[str, Any]:
    """Two spare packs hold the room a new pack needs: the write that fails gets them back and succeeds."""
    store = LocalDirStore(directory / "store")
    blobs = [np.random.default_rng(seed).integers(0, 256, size, dtype=np.uint8).tobytes()
             for seed, size in enumerate((512 << 10, 512 << 10, 1 << 20))]
    for step, data in enumerate(blobs):
        store.write_pack([(digest(data), memoryview(data))])
        store.put_manifest(1, step, 0, json.dumps({"tensors": [{"chunks": [digest(data)]}]}).encode())
    spared = store.collect_garbage(retire=[(1, 0), (1, 1)]).packs_spared  # 1 MiB of spares, 1 MiB live
    (directory / "filler").write_bytes(b"\0" * (shutil.disk_usage(directory).free - (300 << 10)))
    big = np.random.default_rng(9).integers(0, 256, 1200 << 10, dtype=np.uint8).tobytes()  # needs both spares' room
    written = store.write_pack([(digest(big), memoryview(big))])
    reader = LocalDirStore(directory / "store")
    reader.refresh()
    return {"spared": spared, "written": list(written), "spares_left": len(list(store.packs.glob("*.spare"))),
            "read_back": bytes(reader.read_chunk(digest(big))) == big}


def run_child(tmp_path: Path, *args: str) -> dict[str, Any]:
    disk = tmp_path / "disk"
    disk.mkdir()
    script = (f'mount -t tmpfs -o size={DISK} tmpfs "$1" || exit {MOUNT_FAILED}; '
              'dir="$1"; python="$2"; module="$3"; shift 3; exec "$python" "$module" "$dir" "$@"')
    run = subprocess.run(["unshare", "-rm", "sh", "-c", script, "sh", str(disk), sys.executable, __file__, *args],
                         capture_output=True, text=True, timeout=120)
    if run.returncode == MOUNT_FAILED or (run.returncode != 0 and run.stderr.startswith("unshare:")):
        pytest.skip(f"cannot mount a tmpfs in a user namespace here: {run.stderr.strip()}")
    assert run.returncode == 0, run.stderr
    return dict(json.loads(run.stdout.strip().splitlines()[-1]))


def test_a_full_disk_takes_the_room_of_spare_packs_back(tmp_path: Path):
    if shutil.which("unshare") is None:
        pytest.skip("needs unshare(1) to mount a small tmpfs in a private namespace")
    result = run_child(tmp_path, "spares")
    assert result == {"spared": 2, "written": [1, 1200 << 10], "spares_left": 0, "read_back": True}


if __name__ == "__main__":
    if sys.argv[2:] == ["spares"]:
        print(json.dumps(spares_child(Path(sys.argv[1]))))
    else:
        print(json.dumps(child(Path(sys.argv[1]))))
