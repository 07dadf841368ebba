"""Policy routes: the recorded placement and checkpoint-interval decisions, and how the shadow compares."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Depends, Query

from sentinel.auth.deps import READ, allow
from sentinel.deps import MAX_ID, ServerSettings, Sessions
from sentinel.policy import service
from sentinel.policy.schemas import DecisionKind, PolicyDecisionOut, ShadowSummary

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
def shadow_summary(sessions: Sessions, settings: ServerSettings) -> list[ShadowSummary]:
    """Per kind of decision, the configured active and shadow policies and how often they agreed so far."""
    pairs: list[tuple[DecisionKind, str, str]] = [
        ("placement", settings.placement_policy, settings.placement_shadow),
        ("checkpoint_interval", settings.checkpoint_interval_policy, settings.checkpoint_interval_shadow)]
    out = []
    with sessions() as session:
        for kind, active, shadow in pairs:
            seen = service.agreement(session, kind=kind, active_policy=active, shadow_policy=shadow)
            out.append(ShadowSummary(kind=kind, active_policy=active, shadow_policy=shadow, decisions=seen.decisions,
                                     agreements=seen.agreements, agreement_ratio=seen.ratio if shadow else None,
                                     last_at=seen.last_at))
    return out
