"""Policy decision rows: record one, list them, and sum up how often a shadow agreed with the active policy.
Takes a session, never commits."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from sqlalchemy import case, func, select
from sqlalchemy.orm import Session

from sentinel.policy.history import faults_opened
from sentinel.policy.models import PolicyDecision

OUTCOME_WINDOW = timedelta(days=7)  # a node chosen for a placement that faults this soon after was a poor choice
OUTCOME_DECISIONS = 1000  # the newest disagreements scored


@dataclass(frozen=True)
class Decision:
    """One decision as it is recorded (`policy_decisions`)."""

    at: datetime
    kind: str  # placement | checkpoint_interval
    job_id: int
    incident_id: int | None
    active_policy: str
    active_choice: dict[str, Any]
    shadow_policy: str = ""
    shadow_choice: dict[str, Any] | None = None
    agree: bool | None = None
    explanation: dict[str, Any] | None = None


@dataclass(frozen=True)
class Agreement:
    decisions: int
    agreements: int
    last_at: datetime | None

    @property
    def ratio(self) -> float | None:
        return self.agreements / self.decisions if self.decisions else None


def record_decision(session: Session, decision: Decision) -> PolicyDecision:
    row = PolicyDecision(at=decision.at, kind=decision.kind, job_id=decision.job_id,
                         incident_id=decision.incident_id, active_policy=decision.active_policy,
                         active_choice=decision.active_choice, shadow_policy=decision.shadow_policy,
                         shadow_choice=decision.shadow_choice, agree=decision.agree,
                         explanation=decision.explanation or {})
    session.add(row)
    return row


def list_decisions(session: Session, *, kind: str | None = None, job_id: int | None = None,
                   limit: int = 100) -> list[PolicyDecision]:
    """Newest first."""
    query = select(PolicyDecision).order_by(PolicyDecision.id.desc()).limit(limit)
    if kind is not None:
        query = query.where(PolicyDecision.kind == kind)
    if job_id is not None:
        query = query.where(PolicyDecision.job_id == job_id)
    return list(session.scalars(query))


def agreement(session: Session, *, kind: str, active_policy: str, shadow_policy: str) -> Agreement:
    """How often `shadow_policy` chose what `active_policy` did, over the decisions recorded for that pair."""
    agreed = func.sum(case((PolicyDecision.agree.is_(True), 1), else_=0))
    count, agreements, last = session.execute(
        select(func.count(PolicyDecision.id), agreed, func.max(PolicyDecision.at)).where(
            PolicyDecision.kind == kind, PolicyDecision.active_policy == active_policy,
            PolicyDecision.shadow_policy == shadow_policy)).one()
    return Agreement(int(count or 0), int(agreements or 0), last)


@dataclass(frozen=True)
class Outcome:
    """Over the placements where the shadow disagreed: how many of the nodes each side chose faulted within
    the window after the decision (up to now). Both sides are scored over the same windows."""

    disagreements: int
    active_nodes: int
    active_faulted: int
    shadow_nodes: int
    shadow_faulted: int


def placed_nodes(choice: dict[str, Any] | None) -> set[str]:
    ranks = (choice or {}).get("ranks") or {}
    return {str(slot["node"]) for slot in ranks.values() if isinstance(slot, dict) and slot.get("node")}


def placement_outcome(session: Session, *, active_policy: str, shadow_policy: str, now: datetime,
                      window: timedelta = OUTCOME_WINDOW, limit: int = OUTCOME_DECISIONS) -> Outcome:
    """Which side picked the nodes that went on to fault: the evidence for switching (or not)."""
    rows = list(session.scalars(
        select(PolicyDecision).where(PolicyDecision.kind == "placement", PolicyDecision.active_policy == active_policy,
                                     PolicyDecision.shadow_policy == shadow_policy, PolicyDecision.agree.is_(False))
        .order_by(PolicyDecision.id.desc()).limit(limit)))
    sides = [(r.at, placed_nodes(r.active_choice), placed_nodes(r.shadow_choice)) for r in rows]
    if not sides:
        return Outcome(0, 0, 0, 0, 0)
    faults = faults_opened(session, set().union(*(a | b for _, a, b in sides)), min(at for at, _, _ in sides), now)

    def faulted(nodes: set[str], at: datetime) -> int:
        until = min(at + window, now)
        return sum(1 for n in nodes if any(at < t <= until for t in faults.get(n, ())))

    return Outcome(len(sides), sum(len(a) for _, a, _ in sides), sum(faulted(a, at) for at, a, _ in sides),
                   sum(len(b) for _, _, b in sides), sum(faulted(b, at) for at, _, b in sides))
