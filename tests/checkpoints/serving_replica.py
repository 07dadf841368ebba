"""A serving replica for test_serving_live.py: loads its weights from the catalog's plan, or makes and
checkpoints them on first start, writes what it serves to OUT_DIR, then serves until stopped."""

from __future__ import annotations

import os
import time
from pathlib import Path

import numpy as np

from sentinel.sdk.checkpoint import CheckpointManager

rank, attempt = int(os.environ["RANK"]), int(os.environ.get("SENTINEL_ATTEMPT", "0"))
out = Path(os.environ["OUT_DIR"])
ckpt = CheckpointManager(every=1, persistent_every=1)
restored = ckpt.restore()
if restored is not None:
    weights, source = restored.state["weights"], f"restored:{restored.step}:{restored.location['tier']}"
else:
    weights, source = np.random.default_rng(1000 + rank).standard_normal(250_000).astype(np.float32), "fresh"
    result = ckpt.save(1, {"weights": weights, "version": "v1"})
    assert result is not None and result.result().committed
np.save(out / f"replica{rank}-attempt{attempt}.npy", weights)
(out / f"replica{rank}-attempt{attempt}.source").write_text(source)
while True:  # serving
    time.sleep(0.2)
