"""The checkpoint interval Sentinel recommends for a job: a plugin (`checkpoint_interval_policy`, entry points
`sentinel.checkpoint_interval`). Young/Daly from the live failure rate is the default; the learned one (from
the risks of the job's own nodes) and the shadow that runs beside the active one are in sentinel/policy/.
"""

from __future__ import annotations

import math
from abc import ABC, abstractmethod
from dataclasses import dataclass
from datetime import datetime
from importlib.metadata import entry_points

from sqlalchemy.orm import Session


@dataclass(frozen=True)
class IntervalAsk:
    """What a recommendation is made from: the catalog's save cost and the live failure rate."""

    job_id: int
    stall_seconds: float | None  # what the loop waits per save (median of recent steps); None before the first
    mtbf_seconds: float | None  # of the job's share of the fleet, from the live failure rate; None: none seen
    accelerators: tuple[str, ...]  # the job's accelerators (its latest attempt)
    now: datetime


class CheckpointIntervalPolicy(ABC):
    name: str = ""  # as settings name it; a wrapper (the shadow's recorder) answers with the policy it wraps

    @abstractmethod
    def interval_seconds(self, session: Session, ask: IntervalAsk) -> float | None:
        """The recommended seconds between checkpoints; None when there is nothing to go on yet."""


def young_daly_seconds(cost_seconds: float, mtbf_seconds: float) -> float:
    """The checkpoint interval that minimises expected lost time: √(2·C·MTBF) (Young 1974, Daly 2006)."""
    return math.sqrt(2.0 * max(cost_seconds, 1e-6) * mtbf_seconds)


class YoungDaly(CheckpointIntervalPolicy):
    """√(2·stall·MTBF) once a save was measured and a failure seen."""

    name = "young-daly"

    def interval_seconds(self, session: Session, ask: IntervalAsk) -> float | None:
        if ask.mtbf_seconds is None or ask.stall_seconds is None:
            return None
        return young_daly_seconds(ask.stall_seconds, ask.mtbf_seconds)


INTERVAL_POLICIES: dict[str, type[CheckpointIntervalPolicy]] = {YoungDaly.name: YoungDaly}


def load_interval_policy(name: str) -> CheckpointIntervalPolicy:
    if name not in INTERVAL_POLICIES:
        for ep in entry_points(group="sentinel.checkpoint_interval"):
            if ep.name == name:
                INTERVAL_POLICIES[name] = ep.load()
    if name not in INTERVAL_POLICIES:
        raise ValueError(f"checkpoint interval policy {name!r} is unknown; known: "
                         f"{', '.join(sorted(INTERVAL_POLICIES))}")
    return INTERVAL_POLICIES[name]()
