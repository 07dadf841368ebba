"""Garbage collection while other threads and another process save into the same store loses nothing.

Savers (threads here, and threads in a second real process: the store lock is flock, across processes) write
deterministic states, one job each, into one local store root, and retire their own old steps as they go (each
manager collects with its own store object). Standalone collectors in both processes keep retiring all but the
newest steps too. Afterwards every step that was not retired restores bitwise, and every retired one is gone.

Run as a script, this module is the second process: `python test_checkpoint_concurrency.py ROOT JOB...`.
"""

from __future__ import annotations

import json
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import numpy as np

from sentinel.sdk.checkpoint import CheckpointManager
from sentinel.sdk.stores import LocalDirStore

STEPS = 40
KEEP = 2  # the newest steps of each job no collector retires
CHUNK = 16 << 10
MAIN_JOBS = (1, 2)
CHILD_JOBS = (11, 12)


def state_for(job: int, step: int) -> dict[str, Any]:
    """What job `job` saves at `step`: the same bytes every time it is asked."""
    fresh = np.random.default_rng([job, step])
    slow = np.random.default_rng([job, step // 4])  # chunks that stay live across a few retirements
    cycle = np.random.default_rng([job, 1000 + step % 3])  # dead for a step, then saved again
    common = np.random.default_rng([2000 + step // 3])  # every job saves these, at about the same time
    return {"common": common.standard_normal(10_000).astype(np.float32),
            "slow": slow.standard_normal(20_000).astype(np.float32),  # under half of its pack: rewritten
            "cycle": cycle.standard_normal(5_000),
            "fresh": {0: fresh.standard_normal(20_000), "mask": fresh.random(1000) > 0.5},
            "step": step, "job": job}


def same(got: Any, want: Any) -> bool:
    if isinstance(want, dict):
        return isinstance(got, dict) and list(got) == list(want) and all(same(got[k], want[k]) for k in want)
    if isinstance(want, np.ndarray):
        return (isinstance(got, np.ndarray) and got.dtype == want.dtype and got.shape == want.shape
                and got.tobytes() == want.tobytes())
    return bool(type(got) is type(want) and got == want)


def save_loop(root: Path, job: int, retired: set[tuple[int, int]], errors: list[str]) -> None:
    """Save steps 1..STEPS of `job`, and after each save read it straight back through the same manager."""
    m = CheckpointManager(job_id=job, rank=0, node="n", local_dir=str(root), keep_last=KEEP, chunk_bytes=CHUNK,
                          catalog=False)
    try:
        for step in range(1, STEPS + 1):
            future = m.save(step, state_for(job, step))
            assert future is not None
            retired.update((job, s) for s in future.result(timeout=60).retired)
            got = m.restore(step)  # the newest step of this job: no collector retires it yet
            if got is None or not same(got.state, state_for(job, step)):
                errors.append(f"job {job} step {step} read back differently right after its save")
    except Exception as exc:
        errors.append(f"job {job}: {exc!r}")
    finally:
        m.close()


def collect_loop(root: Path, jobs: tuple[int, ...], done: threading.Event, retired: set[tuple[int, int]],
                 counts: dict[str, int], errors: list[str]) -> None:
    """Retire every step of `jobs` but the newest KEEP, over and over, until `done` (then once more)."""
    store = LocalDirStore(root)
    try:
        while True:
            finished = done.is_set()
            retire = [(job, step) for job in jobs for step in sorted(store.steps(job))[:-KEEP]]
            report = store.collect_garbage(retire=retire, timeout_seconds=30)
            retired.update(retire)
            counts["collections"] += 1
            for key in ("manifests_deleted", "packs_deleted", "packs_rewritten"):
                counts[key] += getattr(report, key)
            if finished:
                return
            time.sleep(0.005)
    except Exception as exc:
        errors.append(f"collector: {exc!r}")


def run_here(root: Path, jobs: tuple[int, ...], collect_jobs: tuple[int, ...]) -> dict[str, Any]:
    """Savers for `jobs` and one collector for `collect_jobs`, in threads of this process, until the savers end."""
    errors: list[str] = []
    retired: set[tuple[int, int]] = set()
    counts = dict.fromkeys(("collections", "manifests_deleted", "packs_deleted", "packs_rewritten"), 0)
    done = threading.Event()
    savers = [threading.Thread(target=save_loop, args=(root, job, retired, errors)) for job in jobs]
    collector = threading.Thread(target=collect_loop, args=(root, collect_jobs, done, retired, counts, errors))
    for thread in [*savers, collector]:
        thread.start()
    for thread in savers:
        thread.join(timeout=120)
    done.set()
    collector.join(timeout=120)
    return {"errors": errors, "retired": sorted(retired), **counts}


def test_gc_during_concurrent_saves_in_two_processes_loses_nothing(tmp_path: Path):
    root = tmp_path / "store"
    child = subprocess.Popen([sys.executable, __file__, str(root), *map(str, CHILD_JOBS)],
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        here = run_here(root, MAIN_JOBS, MAIN_JOBS + CHILD_JOBS)  # this collector retires the child's steps too
        out, err = child.communicate(timeout=120)
    finally:
        child.kill()
    assert child.returncode == 0, err
    there = json.loads(out.strip().splitlines()[-1])
    assert here["errors"] == [] and there["errors"] == []
    for result in (here, there):  # both collectors ran, often, while saves were going on
        assert result["collections"] >= 3 and result["manifests_deleted"] > 0
    assert here["packs_deleted"] + there["packs_deleted"] > 0

    retired = {tuple(r) for r in here["retired"] + there["retired"]}
    kept = 0
    for job in MAIN_JOBS + CHILD_JOBS:
        m = CheckpointManager(job_id=job, rank=0, node="n", local_dir=str(root), catalog=False)
        on_disk = set(m.local.steps(job))
        for step in range(1, STEPS + 1):
            if (job, step) in retired:
                assert step not in on_disk, f"job {job} step {step} was retired but its manifest is still there"
                continue
            assert step in on_disk, f"job {job} step {step} was never retired but is gone"
            got = m.restore(step)
            assert got is not None and same(got.state, state_for(job, step)), f"job {job} step {step} differs"
            kept += 1
        assert {STEPS - 1, STEPS} <= on_disk
        newest = m.restore()
        assert newest is not None and newest.step == STEPS and newest.skipped == []
        m.close()
    assert kept < len(MAIN_JOBS + CHILD_JOBS) * STEPS  # something was retired, and the rest all came back


if __name__ == "__main__":
    jobs = tuple(int(j) for j in sys.argv[2:])
    print(json.dumps(run_here(Path(sys.argv[1]), jobs, jobs)))
