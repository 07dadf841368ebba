"""What each event costs in the simulator, from the figures Sentinel's benchmarks measured and wrote to
`benchmarks/measured.json` (each with its command, date and conditions), never from constants here.

A figure the simulator needs and the file lacks is an error that names the benchmark to run; the one
figure nothing measures yet (serving failover) falls back to the warm-standby restart, and says so.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

DEFAULT_PATH = Path(__file__).resolve().parents[2] / "benchmarks" / "measured.json"

NEEDED = {  # figure → the benchmark that writes it
    "sentinel_xid_recovery_seconds": "benchmarks/recovery.py",
    "sentinel_hang_recovery_seconds": "benchmarks/recovery.py",
    "torchrun_crash_recovery_seconds": "benchmarks/recovery.py",
    "sentinel_checkpoint_stall_seconds_per_gib": "benchmarks/checkpoint.py",
    "torch_save_seconds_per_gib": "benchmarks/checkpoint.py",
    "sentinel_restore_seconds_per_gib": "benchmarks/checkpoint.py",
    "torch_load_seconds_per_gib": "benchmarks/checkpoint.py",
}


class CostsError(ValueError):
    pass


@dataclass(frozen=True)
class Costs:
    """Seconds per event. `recover_*` is fault → stepping again with warm standbys (detection included);
    `cold_restart` is torchrun's restart once it noticed; stalls and restores are per GiB of state."""

    recover_gpu: float
    recover_other: float
    cold_restart: float
    stall_per_gib: float
    baseline_stall_per_gib: float
    restore_per_gib: float
    baseline_restore_per_gib: float
    serving_failover: float
    notes: list[str] = field(default_factory=list)
    source: str = ""

    def summary(self) -> dict[str, Any]:
        return {k: v for k, v in self.__dict__.items()}


def _value(figures: dict[str, Any], name: str, path: Path) -> float:
    entry = figures.get(name)
    if not isinstance(entry, dict) or "value" not in entry:
        raise CostsError(f"{path} lacks {name!r}: run {NEEDED.get(name, 'the benchmarks')} to measure it")
    value = entry["value"]
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value) or value < 0:
        raise CostsError(f"{path}: {name} must be a finite number ≥ 0, got {value!r}")
    return float(value)


def load_costs(path: Path = DEFAULT_PATH) -> Costs:
    try:
        data = json.loads(path.read_text())
    except OSError as exc:
        raise CostsError(f"{path}: cannot read the measured figures ({exc}); run benchmarks/recovery.py and "
                         "benchmarks/checkpoint.py to write them") from None
    except json.JSONDecodeError as exc:
        raise CostsError(f"{path}: not JSON: {exc}") from None
    figures = data.get("figures") if isinstance(data, dict) else None
    if not isinstance(figures, dict):
        raise CostsError(f"{path}: expected an object with 'figures'")
    v = {name: _value(figures, name, path) for name in NEEDED}
    notes = []
    if "serving_failover_seconds" in figures:
        failover = _value(figures, "serving_failover_seconds", path)
    else:
        failover = v["sentinel_xid_recovery_seconds"]
        notes.append("serving_failover_seconds is not measured yet: the warm-standby XID recovery stands in")
    return Costs(recover_gpu=v["sentinel_xid_recovery_seconds"], recover_other=v["sentinel_hang_recovery_seconds"],
                 cold_restart=v["torchrun_crash_recovery_seconds"],
                 stall_per_gib=v["sentinel_checkpoint_stall_seconds_per_gib"],
                 baseline_stall_per_gib=v["torch_save_seconds_per_gib"],
                 restore_per_gib=v["sentinel_restore_seconds_per_gib"],
                 baseline_restore_per_gib=v["torch_load_seconds_per_gib"],
                 serving_failover=failover, notes=notes, source=str(path))
