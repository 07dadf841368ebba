"""Shared pieces of the fault-trace simulator's tests: the real trace, and a measured-figures file written
here (named as a fixture: the values are of the order benchmarks/measured.json holds, fixed so results do
not move when the benchmarks are re-run)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from sentinel.simulate.costs import Costs, load_costs
from sentinel.simulate.trace import SHIPPED, Trace, load_trace

TRACE = SHIPPED  # the InfiniteHBD trace, days 0–174

FIGURES = {"sentinel_xid_recovery_seconds": 0.19, "sentinel_hang_recovery_seconds": 3.57,
           "torchrun_crash_recovery_seconds": 3.9, "sentinel_checkpoint_stall_seconds_per_gib": 0.5,
           "torch_save_seconds_per_gib": 1.7, "sentinel_restore_seconds_per_gib": 2.5,
           "torch_load_seconds_per_gib": 2.0}


def write_figures(path: Path, figures: dict[str, Any]) -> Path:
    path.write_text(json.dumps({"figures": {k: {"value": v} for k, v in figures.items()}}))
    return path


@pytest.fixture
def figures_file(tmp_path: Path) -> Path:
    return write_figures(tmp_path / "measured.json", FIGURES)


@pytest.fixture
def costs(figures_file: Path) -> Costs:
    return load_costs(figures_file)


@pytest.fixture(scope="session")
def real_trace() -> Trace:
    return load_trace(TRACE)


def event(node: str, day: float, kind: str = "fault_start", desc: str = "GPU xid Error") -> dict[str, Any]:
    out: dict[str, Any] = {"node_id": node, "event_time": day, "event_type": kind}
    if kind == "fault_start":
        out["fault_type"] = {"Level": "Hardware Failure", "Class": "GPU", "Desc": desc}
    return out
