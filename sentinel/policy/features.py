"""A node's fault history as numbers: the per-node part of the learned policy's state (17 per node, for every
node of the fleet); the cluster part is what each decision reads directly (sentinel/policy/decide.py).

The same function serves the simulator (history from a fault trace) and the server (history from its
incidents), so a model trained on one reads the other. Times are seconds; a fault is (start, end, kind),
`end` None while the node is still out.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

import numpy as np

DAY = 86400.0
KINDS = ("gpu", "network", "hardware", "other")  # what failed, coarse: the trace's Class, the incident's layer

NODE_FEATURES = (
    "faults_1d", "faults_7d", "faults_30d", "faults_90d", "faults_all",
    "log_days_since_fault", "never_faulted", "log_days_since_return", "returned_within_1d",
    "returned_within_7d", "last_outage_log_hours", "last_kind_gpu", "last_kind_network",
    "last_kind_hardware", "last_kind_other", "kinds_90d", "out_now",
)


@dataclass(frozen=True)
class Fault:
    start: float
    end: float | None
    kind: str  # one of KINDS


def kind_of_trace(level: str, cls: str, desc: str) -> str:
    """The trace's Level / Class / Desc as a coarse kind (InfiniteHBD names: GPU, NIC, Parameter Plane Cable…)."""
    text = f"{cls} {desc}".lower()
    if cls.lower() == "gpu" or "gpu" in text or "xid" in text or "ecc" in text:
        return "gpu"
    if any(w in text for w in ("nic", "cable", "link", "rnic", "network", "ib ")):
        return "network"
    if level.lower().startswith("hardware"):
        return "hardware"
    return "other"


def kind_of_layer(layer: str) -> str:
    """An incident's layer as a coarse kind (the server's side of `kind_of_trace`)."""
    return {"accelerator": "gpu", "hardware": "gpu", "interconnect": "network", "node": "hardware",
            "host": "hardware"}.get(layer, "other")


def node_features(faults: Sequence[Fault], now: float) -> np.ndarray:
    """The NODE_FEATURES of one node at `now`, from its faults that started before `now`."""
    past = [f for f in faults if f.start < now]
    x = np.zeros(len(NODE_FEATURES))
    for i, days in enumerate((1, 7, 30, 90)):
        x[i] = sum(1 for f in past if now - f.start <= days * DAY)
    x[4] = len(past)
    if not past:
        x[5], x[6], x[7] = math.log1p(365.0), 1.0, math.log1p(365.0)
        return x
    last = max(past, key=lambda f: f.start)
    x[5] = math.log1p((now - last.start) / DAY)
    ended = [f.end for f in past if f.end is not None and f.end <= now]
    since_return = (now - max(ended)) / DAY if ended else 365.0
    x[7] = math.log1p(since_return)
    x[8] = 1.0 if ended and since_return <= 1 else 0.0
    x[9] = 1.0 if ended and since_return <= 7 else 0.0
    outage = ((last.end if last.end is not None and last.end <= now else now) - last.start) / 3600.0
    x[10] = math.log1p(max(0.0, outage))
    x[11 + KINDS.index(last.kind if last.kind in KINDS else "other")] = 1.0
    x[15] = len({f.kind for f in past if now - f.start <= 90 * DAY})
    x[16] = 1.0 if any(f.end is None or f.end > now for f in past) else 0.0
    return x


def faults_by_node(rows: Iterable[tuple[str, float, float | None, str]]) -> dict[str, list[Fault]]:
    """(node, start, end, kind) rows as each node's faults in start order."""
    out: dict[str, list[Fault]] = {}
    for node, start, end, kind in rows:
        out.setdefault(node, []).append(Fault(start, end, kind))
    for faults in out.values():
        faults.sort(key=lambda f: f.start)
    return out
