"""The learned checkpoint interval policy ("learned"): Young/Daly on the predicted fault rate of the job's own
nodes, × the tuned `interval_factor` (`decide.learned_interval_seconds`, as the simulator tuned it)."""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from sqlalchemy import select
from sqlalchemy.orm import Session

from sentinel.accelerators.models import Accelerator
from sentinel.checkpoints.interval import INTERVAL_POLICIES, CheckpointIntervalPolicy, IntervalAsk
from sentinel.nodes.models import Node
from sentinel.policy import decide
from sentinel.policy.hazard import DEFAULT_PATH, HazardModel
from sentinel.policy.risk import NodeRisks, load_model


@dataclass(frozen=True)
class IntervalChoice:
    seconds: float | None
    explanation: dict[str, Any] = field(default_factory=dict)  # why, as JSON (empty for a heuristic)


def job_nodes(session: Session, uuids: tuple[str, ...]) -> list[str]:
    """The nodes that hold these accelerators, by name."""
    if not uuids:
        return []
    return sorted(set(session.scalars(select(Node.name).join(Accelerator, Accelerator.node_id == Node.id)
                                      .where(Accelerator.uuid.in_(uuids)))))


class LearnedInterval(CheckpointIntervalPolicy):
    """The stall from the catalog's costs; the fault rate from the hazard model's risk of each node the job
    runs on (Poisson per node over the model's horizon). None until a save was measured and the job has nodes."""

    name = "learned"
    RISKS_SECONDS = 10.0  # the fleet's risks are read once this often: a scrape asks for every job at once

    def __init__(self, model: HazardModel | None = None):
        self.model = model if model is not None else load_model(DEFAULT_PATH)
        self._risks: NodeRisks | None = None

    def risks(self, session: Session, now: datetime) -> NodeRisks:
        """The fleet's risks at `now`, read from its incidents at most every RISKS_SECONDS (one query for all
        jobs of a scrape, not one per job); a clock that went back reads again."""
        cached, at = self._risks, now.timestamp()
        if cached is None or not 0 <= at - cached.now < self.RISKS_SECONDS:
            cached = self._risks = NodeRisks.load(session, self.model, now)
        return cached

    def interval_seconds(self, session: Session, ask: IntervalAsk) -> float | None:
        return self.choose(session, ask).seconds

    def choose(self, session: Session, ask: IntervalAsk) -> IntervalChoice:
        if ask.stall_seconds is None:
            return IntervalChoice(None, {"reason": "no checkpoint save measured yet"})
        nodes = job_nodes(session, ask.accelerators)
        if not nodes:
            return IntervalChoice(None, {"reason": "the job runs on no known node yet"})
        risks = self.risks(session, ask.now)
        seconds = decide.learned_interval_seconds(ask.stall_seconds, [risks.risk(n) for n in nodes],
                                                  self.model.horizon_days, self.model.params)
        return IntervalChoice(seconds, {"nodes": [risks.record(n) for n in nodes],
                                        "horizon_days": self.model.horizon_days,
                                        "interval_factor": decide.knob(self.model.params, "interval_factor")})


def choose(policy: CheckpointIntervalPolicy, session: Session, ask: IntervalAsk) -> IntervalChoice:
    """Any interval policy's recommendation, with the learned one's explanation."""
    if isinstance(policy, LearnedInterval):
        return policy.choose(session, ask)
    return IntervalChoice(policy.interval_seconds(session, ask))


INTERVAL_POLICIES[LearnedInterval.name] = LearnedInterval  # `checkpoint_interval_policy = "learned"`
