"""The SDK against a real server: a corrupted chunk makes restore() refuse that step, tell the catalog,
and load the older one; from then on the recovery plan skips the damaged step for every rank."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from sentinel.sdk.catalog import Catalog
from sentinel.sdk.checkpoint import CheckpointManager
from tests.live import LiveServer

pytestmark = pytest.mark.slow


def test_a_corrupted_chunk_is_reported_and_the_plan_falls_back(tmp_path: Path):
    server = LiveServer(tmp_path / "server", f"sqlite:///{tmp_path / 'server' / 'sentinel.db'}").start()
    try:
        api = server.api()
        job = api.post("/jobs", json={"name": "fallback", "world_size": 1}).json()["id"]
        catalog = Catalog(server.url, server.token("launcher", "fallback"), job)
        m = CheckpointManager(job_id=job, rank=0, node="node-a", local_dir=str(tmp_path / "ckpt" / "{node}"),
                              catalog=catalog)
        first = {"w": np.arange(1 << 16, dtype=np.float32)}
        second = {"w": first["w"] * 2}
        for step, state in ((1, first), (2, second)):
            future = m.save(step, state)
            assert future is not None and future.result().committed
        assert api.get(f"/jobs/{job}/recovery-plan").json()["step"] == 2

        newest = max(m.local.packs.glob("*.pack"), key=lambda p: p.stat().st_mtime_ns)  # step 2's chunks
        data = bytearray(newest.read_bytes())
        data[100] ^= 0xFF
        newest.write_bytes(bytes(data))

        restored = m.restore()
        assert restored is not None and restored.step == 1
        assert np.array_equal(restored.state["w"], first["w"])
        assert any("tensor 'w' chunk 1 of 1 is corrupt" in s for s in restored.skipped), restored.skipped
        plan = api.get(f"/jobs/{job}/recovery-plan").json()
        assert plan["step"] == 1 and "failed verification" in plan["skipped"][0]
        shard = api.get(f"/jobs/{job}/checkpoints/2").json()["shards"][0]
        assert shard["state"] == "invalid" and str(newest) in shard["invalid_reason"]
        m.close()
    finally:
        server.stop()
