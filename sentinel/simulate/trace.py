"""Fault traces: the InfiniteHBD format (a JSON list of `fault_start` / `fault_end` events per node, times in
days) read and checked, and synthetic Poisson / Weibull faults in the same shape.

A record that cannot be right is an error naming it (`record 17: fault_end before fault_start …`), never a
silently skewed result: missing fields, unknown event types, times that are not finite numbers, an end with
no open start, and node ids beyond the modelled cluster (or not in the inventory, when one is given).
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from sentinel.policy.features import KINDS, kind_of_trace

DAY = 86400.0
SHIPPED = Path(__file__).with_name("traces") / "infinitehbd_days_0_174.json"  # see traces/README.md


class TraceError(ValueError):
    """A trace file that cannot be replayed; the message names the record."""


@dataclass(frozen=True)
class TraceFault:
    node: str
    start: float  # seconds since the trace's day 0
    end: float | None  # None: still out when the trace ends
    kind: str  # features.KINDS
    label: str  # "Level / Class / Desc" as the trace says it


@dataclass
class Trace:
    nodes: list[str]  # every node of the modelled cluster, the trace's ids first
    faults: list[TraceFault]  # by start time
    source: str
    last_day: float  # the last event's day

    def between(self, first_day: float, last_day: float) -> list[TraceFault]:
        """Faults that touch [first_day, last_day): started before the end and not over before the start."""
        a, b = first_day * DAY, last_day * DAY
        return [f for f in self.faults if f.start < b and (f.end is None or f.end > a)]

    def rate_per_1000_node_days(self, first_day: float, last_day: float) -> float:
        a, b = first_day * DAY, last_day * DAY
        starts = sum(1 for f in self.faults if a <= f.start < b)
        return 1000.0 * starts / max(1e-9, len(self.nodes) * (last_day - first_day))


def _field(record: Any, index: int, name: str) -> Any:
    if not isinstance(record, dict) or name not in record:
        raise TraceError(f"record {index}: missing field {name!r}")
    return record[name]


def parse_trace(events: Any, *, nodes: int = 400, inventory: list[str] | None = None,
                source: str = "trace") -> Trace:
    """Events as the InfiniteHBD trace has them; `nodes` is the modelled cluster's size (the trace's own
    ids plus anonymous healthy nodes up to it), `inventory` the full list of valid ids when known."""
    if not isinstance(events, list):
        raise TraceError(f"{source}: expected a JSON list of events, got {type(events).__name__}")
    known = set(inventory) if inventory is not None else None
    seen: dict[str, None] = dict.fromkeys(inventory or [])
    open_: dict[str, tuple[int, float, str, str]] = {}
    faults: list[TraceFault] = []
    last = 0.0
    for i, rec in enumerate(events):
        node, when, what = _field(rec, i, "node_id"), _field(rec, i, "event_time"), _field(rec, i, "event_type")
        if not isinstance(node, str) or not node:
            raise TraceError(f"record {i}: node_id must be a non-empty string, got {node!r}")
        if isinstance(when, bool) or not isinstance(when, int | float) or not math.isfinite(when) or when < 0:
            raise TraceError(f"record {i}: event_time must be a finite number of days ≥ 0, got {when!r}")
        if known is not None and node not in known:
            raise TraceError(f"record {i}: node_id {node!r} is not in the inventory")
        if node not in seen:
            if len(seen) >= nodes:
                raise TraceError(f"record {i}: node_id {node!r} is node {len(seen) + 1} of a {nodes}-node cluster "
                                 "(raise --nodes or fix the trace)")
            seen[node] = None
        last = max(last, float(when))
        if what == "fault_start":
            kind_of = _field(rec, i, "fault_type")
            if not isinstance(kind_of, dict):
                raise TraceError(f"record {i}: fault_type must be an object with Level, Class, Desc")
            level, cls, desc = (str(kind_of.get(k, "")) for k in ("Level", "Class", "Desc"))
            if node in open_:
                raise TraceError(f"record {i}: fault_start for {node} at day {when} while its fault from record "
                                 f"{open_[node][0]} is still open")
            open_[node] = (i, float(when), kind_of_trace(level, cls, desc), f"{level} / {cls} / {desc}")
        elif what == "fault_end":
            if node not in open_:
                raise TraceError(f"record {i}: fault_end for {node} at day {when} with no open fault_start")
            j, start, kind, label = open_.pop(node)
            if when < start:
                raise TraceError(f"record {i}: fault_end at day {when} before its fault_start at day {start} "
                                 f"(record {j}, node {node})")
            faults.append(TraceFault(node, start * DAY, float(when) * DAY, kind, label))
        else:
            raise TraceError(f"record {i}: event_type must be fault_start or fault_end, got {what!r}")
    for node, (_j, start, kind, label) in open_.items():
        faults.append(TraceFault(node, start * DAY, None, kind, label))
    names = list(seen) + [f"node-{k:04d}" for k in range(max(0, nodes - len(seen)))]
    faults.sort(key=lambda f: (f.start, f.node))
    return Trace(nodes=names, faults=faults, source=source, last_day=last)


def load_trace(path: Path, *, nodes: int = 400, inventory: Path | None = None) -> Trace:
    try:
        events = json.loads(path.read_text())
    except (OSError, UnicodeDecodeError) as exc:
        raise TraceError(f"{path}: cannot read: {exc}") from None
    except json.JSONDecodeError as exc:
        raise TraceError(f"{path}: not JSON: {exc}") from None
    ids = None
    if inventory is not None:
        try:
            ids = [line.strip() for line in inventory.read_text().splitlines() if line.strip()]
        except OSError as exc:
            raise TraceError(f"{inventory}: cannot read: {exc}") from None
    return parse_trace(events, nodes=max(nodes, len(ids or [])), inventory=ids, source=str(path))


def synthetic_trace(*, nodes: int, days: float, per_1000_node_days: float, repair_hours: float,
                    seed: int, shape: float = 1.0) -> Trace:
    """Faults per node as a renewal process: Weibull gaps (shape 1 is Poisson) at the given mean rate, in
    its steady state from day 0, exponential repairs with mean `repair_hours`; kinds drawn uniformly. A node
    out at day 0 has its fault from before day 0 (history to the policies)."""
    rng = np.random.default_rng(seed)
    names = [f"node-{k:04d}" for k in range(nodes)]
    rate = per_1000_node_days / 1000.0 / DAY  # per node-second
    faults: list[TraceFault] = []
    if rate > 0:
        scale = 1.0 / rate / math.gamma(1.0 + 1.0 / shape)
        warmup = 10.0 / rate  # start each node's process well before day 0, so day 0 is not a renewal for all
        for name in names:
            t = -warmup
            while True:
                t += float(scale * rng.weibull(shape))
                if t >= days * DAY:
                    break
                end = t + float(rng.exponential(repair_hours * 3600.0))
                if end > 0:  # out at day 0 or later: the replay needs it
                    faults.append(TraceFault(name, t, end, KINDS[int(rng.integers(len(KINDS)))], "synthetic"))
                t = end
    faults.sort(key=lambda f: (f.start, f.node))
    return Trace(nodes=names, faults=faults, source=f"synthetic {per_1000_node_days:g}/1000 node-days", last_day=days)
