"""A serving replica's weights are checkpointed like training state; when its accelerator fails, the
replacement (started before the old replica stops) loads them from the catalog's plan. Real server,
agents, `sentinel launch --kind serving` and replica processes."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from tests.live import Cluster, wait_for

pytestmark = pytest.mark.slow
REPLICA = [str(Path(__file__).with_name("serving_replica.py"))]


def test_a_replaced_replica_loads_the_checkpointed_weights(tmp_path):
    cluster = Cluster(tmp_path)
    out = tmp_path / "job"
    try:
        cluster.launch("llm-serve", {"SENTINEL_CHECKPOINT_LOCAL_DIR": str(tmp_path / "ckpt" / "{node}"),
                                     "SENTINEL_CHECKPOINT_PERSISTENT_DIR": str(tmp_path / "ckpt" / "shared")},
                       job=REPLICA, kind="serving")
        wait_for(lambda: all((out / f"replica{r}-attempt0.source").exists() for r in (0, 1)), timeout=120,
                 what="both replicas serving")
        job = cluster.job("llm-serve")
        victim = next(t for t in job["tasks"] if t["rank"] == 1)
        uuid, node = victim["accelerators"][0], victim["node"]
        assert cluster.api.post(f"/nodes/{node}/inject", json={"accelerator_index": int(uuid.rsplit("-", 1)[1]),
                                                                "fault": "xid", "argument": 79}).status_code == 202
        source = wait_for(lambda: next((p.read_text() for p in out.glob("replica1-attempt*.source")
                                        if not p.name.endswith("attempt0.source")), None), timeout=120,
                          what="the replacement replica serving")
        assert source == "restored:1:persistent"  # its node's local disk was drained with it
        replacement = next(p for p in out.glob("replica1-attempt*.npy") if "attempt0" not in p.name)
        assert np.array_equal(np.load(replacement), np.load(out / "replica1-attempt0.npy"))
        orders = cluster.api.get(f"/jobs/{job['id']}/orders", params={"state": "all"}).json()
        assert [o["kind"] for o in orders] == ["replace_replica"] and orders[0]["checkpoint_step"] == 1
    finally:
        cluster.close()
