"""Policy routes: the recorded placement and checkpoint-interval decisions, and how the shadow compares."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Depends, Query

from sentinel.auth.deps import READ, allow
from sentinel.clock import to_datetime
from sentinel.deps import MAX_ID, ServerClock, ServerSettings, Sessions
from sentinel.policy import service
from sentinel.policy.schemas import DecisionKind, PlacementOutcome, PolicyDecisionOut, ShadowSummary

router = APIRouter(prefix="/policy", tags=["policy"])


@router.get("/decisions", response_model=list[PolicyDecisionOut], dependencies=[Depends(allow(READ))])
def list_decisions(sessions: Sessions, kind: DecisionKind | None = None,
                   job: Annotated[int | None, Query(ge=1, le=MAX_ID)] = None,
                   limit: Annotated[int, Query(ge=1, le=1000)] = 100) -> list[PolicyDecisionOut]:
    """Newest first: what the active policy chose, what the shadow would have, whether they agree, and why."""
    with sessions() as session:
        return [PolicyDecisionOut.model_validate(r)
                for r in service.list_decisions(session, kind=kind, job_id=job, limit=limit)]


@router.get("/shadow", response_model=list[ShadowSummary], dependencies=[Depends(allow(READ))])
def shadow_summary(sessions: Sessions, settings: ServerSettings, clock: ServerClock) -> list[ShadowSummary]:
    """Per kind of decision, the configured active and shadow policies and how often they agreed so far; for
    placement, over the decisions where they disagreed, how many of the nodes each side chose faulted within
    7 days after."""
    pairs: list[tuple[DecisionKind, str, str]] = [
        ("placement", settings.placement_policy, settings.placement_shadow),
        ("checkpoint_interval", settings.checkpoint_interval_policy, settings.checkpoint_interval_shadow)]
    out = []
    with sessions() as session:
        for kind, active, shadow in pairs:
            seen = service.agreement(session, kind=kind, active_policy=active, shadow_policy=shadow)
            outcome = None
            if kind == "placement" and shadow:
                o = service.placement_outcome(session, active_policy=active, shadow_policy=shadow,
                                              now=to_datetime(clock.time()))
                outcome = PlacementOutcome(window_days=service.OUTCOME_WINDOW.total_seconds() / 86400.0,
                                           disagreements=o.disagreements, active_nodes=o.active_nodes,
                                           active_faulted=o.active_faulted, shadow_nodes=o.shadow_nodes,
                                           shadow_faulted=o.shadow_faulted)
            out.append(ShadowSummary(kind=kind, active_policy=active, shadow_policy=shadow, decisions=seen.decisions,
                                     agreements=seen.agreements, agreement_ratio=seen.ratio if shadow else None,
                                     last_at=seen.last_at, outcome=outcome))
    return out
