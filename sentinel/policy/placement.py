"""The learned placement policy ("learned"): best fit's contract, with the nodes that fit tried safest first by
the hazard model's risk of each (`decide.order_by_risk`, the same function the simulator tuned)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from datetime import datetime
from typing import Any

from sqlalchemy.orm import Session

from sentinel.policy import decide
from sentinel.policy.features import Fault
from sentinel.policy.hazard import DEFAULT_PATH, HazardModel
from sentinel.policy.risk import NodeRisks, load_model
from sentinel.remediation.placement import (
    POLICIES,
    BestFitSameModel,
    Inventory,
    Placement,
    PlacementRequest,
    Slot,
)


def ranks_text(ranks: Sequence[int]) -> str:
    return f"rank {ranks[0]}" if len(ranks) == 1 else f"ranks {', '.join(str(r) for r in ranks)}"


def moved_by_node(placement: Placement, moved: frozenset[int]) -> dict[str, list[int]]:
    """The ranks that were placed anew, by the node they got."""
    out: dict[str, list[int]] = {}
    for rank in sorted(moved):
        if rank in placement:
            out.setdefault(placement[rank][0], []).append(rank)
    return out


class LearnedPlacement(BestFitSameModel):
    """Best fit's contract and capacity rules: ranks keep their accelerators unless replaced, a restart in place
    never fails, a group that shared a node stays together when one node holds it, same model and at least the
    memory. Only the order of the nodes that fit differs: safest first by the hazard model's risk, a node above
    the tuned `avoid_risk` only when no other fits (ties: by name, as in the simulator).

    `prepare` reads the fleet's fault history (sentinel/policy/history.py) and returns the policy for that one
    decision, which keeps its explanation (`explanation`, `last`); unprepared, no node has faults."""

    name = "learned"

    def __init__(self, model: HazardModel | None = None, risks: NodeRisks | None = None):
        self.model = model if model is not None else load_model(DEFAULT_PATH)
        self.risks = risks if risks is not None else NodeRisks(self.model, {}, 0.0)
        self._seen: dict[str, int] = {}  # node → its matching free accelerators when first considered
        self.last: dict[str, Any] | None = None  # the last placement's explanation, as JSON

    def prepare(self, session: Session, now: datetime, *, incident_id: int | None = None) -> LearnedPlacement:
        return LearnedPlacement(self.model, NodeRisks.load(session, self.model, now))

    def with_history(self, history: Mapping[str, Sequence[Fault]], now: float) -> LearnedPlacement:
        """The policy for a decision at `now` given these fault histories (tests, tools)."""
        return LearnedPlacement(self.model, NodeRisks(self.model, history, now))

    def order_nodes(self, nodes: list[str], by_node: dict[str, list[Slot]]) -> list[str]:
        for node in nodes:
            self._seen.setdefault(node, len(by_node[node]))
        return decide.order_by_risk(nodes, self.risks.of(nodes), self.model.params)

    def place(self, request: PlacementRequest, inventory: Inventory) -> Placement:
        self._seen, self.last = {}, None
        placement = super().place(request, inventory)
        self.last = self._explain(placement, request.replace)
        return placement

    def _explain(self, placement: Placement, moved: frozenset[int]) -> dict[str, Any]:
        """Each chosen node with its risk and top features; the node avoided: of those that could have taken the
        work and are riskier than every chosen one, the one best fit would have tried first."""
        chosen = moved_by_node(placement, moved)
        highest = max((self.risks.risk(n) for n in chosen), default=0.0)
        avoided = sorted((n for n in self._seen if n not in chosen and self.risks.risk(n) > highest),
                         key=lambda n: (self._seen[n], n))
        return {"chosen": [{**self.risks.record(n), "ranks": ranks} for n, ranks in chosen.items()],
                "avoided": self.risks.record(avoided[0]) if avoided else None,
                "avoid_risk": decide.knob(self.model.params, "avoid_risk")}

    def describe(self) -> str:
        """'rank 1 → n7 (risk 0.03: faults_30d=0, …); avoided n3 (risk 0.41: …)' for the last placement."""
        if not self.last or not self.last["chosen"]:
            return ""
        text = ", ".join(f"{ranks_text(c['ranks'])} → {c['node']} ({self.risks.note(c['node'])})"
                         for c in self.last["chosen"])
        avoided = self.last["avoided"]
        return text + (f"; avoided {avoided['node']} ({self.risks.note(avoided['node'])})" if avoided else "")

    def explanation(self) -> list[str]:
        text = self.describe()
        return [f"placement (learned): {text}"] if text else []


POLICIES[LearnedPlacement.name] = LearnedPlacement  # `placement_policy = "learned"`; wiring.py gives it its model
