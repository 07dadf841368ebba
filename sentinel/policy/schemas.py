from __future__ import annotations

from datetime import datetime
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict

DecisionKind = Literal["placement", "checkpoint_interval"]


class PolicyDecisionOut(BaseModel):
    """One decision: the active policy's choice and, in shadow mode, the shadow's beside it.

    A placement choice is `{"ranks": {rank: {node, accelerators}}}` for the ranks placed anew, or
    `{"no_capacity": why}`; an interval choice is `{"interval_seconds": s}` (null: no recommendation yet); a
    shadow that failed has `{"error": why}`. `explanation` holds a learned policy's reasons by role ("active",
    "shadow"): each chosen node's risk and the features that moved it most, and the node it avoided."""

    model_config = ConfigDict(from_attributes=True)

    id: int
    at: datetime
    kind: DecisionKind
    job_id: int
    incident_id: int | None
    active_policy: str
    active_choice: dict[str, Any]
    shadow_policy: str
    shadow_choice: dict[str, Any] | None
    agree: bool | None  # null when no shadow ran
    explanation: dict[str, Any]


class ShadowSummary(BaseModel):
    """How often the configured shadow chose what the active policy did, per kind of decision."""

    kind: DecisionKind
    active_policy: str
    shadow_policy: str  # '' when no shadow is configured
    decisions: int  # recorded for this active/shadow pair
    agreements: int
    agreement_ratio: float | None  # agreements ÷ decisions; null without a shadow or before the first decision
    last_at: datetime | None
    outcome: PlacementOutcome | None = None  # placement with a shadow: whose nodes went on to fault


class PlacementOutcome(BaseModel):
    """Over the newest placements (up to 1,000) where the shadow disagreed: the nodes each side chose, and how
    many of them faulted (a critical hardware incident or a silent node) within `window_days` after."""

    window_days: float
    disagreements: int
    active_nodes: int
    active_faulted: int
    shadow_nodes: int
    shadow_faulted: int
