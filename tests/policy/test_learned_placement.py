"""The learned placement policy on its own: it avoids a risky node while another fits, uses it when nothing
else does, explains itself, and leaves best fit's choices as they were when every node is equally safe."""

from __future__ import annotations

import pytest

from sentinel.policy.features import Fault
from sentinel.policy.hazard import HazardModel
from sentinel.policy.placement import LearnedPlacement
from sentinel.remediation.placement import BestFitSameModel, Inventory, NoCapacity, PlacementRequest, Slot
from tests.policy.hazard_models import hazard_model

NOW = 1_800_000_000.0
DAY = 86400.0
RISKY = [Fault(NOW - 3 * DAY, NOW - 2 * DAY, "gpu"), Fault(NOW - 2 * DAY, NOW - 0.5 * DAY, "network")]
MOVE_BOTH = PlacementRequest(1, {0: ["a-0"], 1: ["a-1"]}, frozenset({0, 1}))


def inventory(free: dict[str, int]) -> Inventory:
    """Node a holds the job (both ranks); the others have `free[node]` free accelerators."""
    slots = {f"a-{i}": Slot(f"a-{i}", "a", i, "h100", 80 * 2**30) for i in range(2)}
    slots |= {f"{n}-{i}": Slot(f"{n}-{i}", n, i, "h100", 80 * 2**30) for n, k in free.items() for i in range(k)}
    return Inventory(slots=slots, free={u for u in slots if not u.startswith("a-")})


def learned(history: dict[str, list[Fault]], model: HazardModel | None = None) -> LearnedPlacement:
    return LearnedPlacement(model or hazard_model()).with_history(history, NOW)


def test_a_risky_node_is_avoided_while_another_fits() -> None:
    inv = inventory({"b": 2, "c": 2})
    assert {n for n, _ in BestFitSameModel().place(MOVE_BOTH, inv).values()} == {"b"}, "best fit: by name"
    policy = learned({"b": RISKY})
    assert {n for n, _ in policy.place(MOVE_BOTH, inv).values()} == {"c"}
    assert policy.last is not None and policy.last["avoided"]["node"] == "b"
    assert policy.last["chosen"][0]["ranks"] == [0, 1] and policy.last["chosen"][0]["risk"] < 0.05
    [line] = policy.explanation()
    assert line.startswith("placement (learned): ranks 0, 1 → c (risk 0.02: log_days_since_fault=5.9)")
    assert line.endswith("avoided b (risk 0.98: faults_7d=2, faults_30d=2)")


def test_the_risky_node_is_used_when_nothing_else_fits() -> None:
    policy = learned({"b": RISKY})
    out = policy.place(MOVE_BOTH, inventory({"b": 2, "c": 1}))
    assert {n for n, _ in out.values()} == {"b"}, "the group stays together on the only node that holds it"
    assert policy.last is not None and policy.last["avoided"] is None
    assert "→ b (risk 0.98" in policy.explanation()[0]
    with pytest.raises(NoCapacity):
        policy.place(MOVE_BOTH, inventory({"b": 1}))


def test_nodes_under_the_avoid_risk_go_safest_first_and_the_knob_is_the_models() -> None:
    one_fault = {"b": [Fault(NOW - 5 * DAY, NOW - 4 * DAY, "gpu")]}
    policy = learned(one_fault)
    assert 0.2 < policy.risks.risk("b") < 0.6
    assert {n for n, _ in policy.place(MOVE_BOTH, inventory({"b": 2, "c": 2})).values()} == {"c"}
    tolerant = learned(one_fault, hazard_model(avoid_risk=0.9))
    assert {n for n, _ in tolerant.place(MOVE_BOTH, inventory({"b": 2, "c": 2})).values()} == {"c"}, \
        "below the knob it is still safest first"
    assert tolerant.explanation()[0].endswith("avoided b (risk 0.53: faults_7d=1, faults_30d=1)")


def test_with_every_node_equally_safe_it_places_by_name_and_keeps_best_fits_contract() -> None:
    """Equal risks are ordered by name, as `decide.order_by_risk` (the simulator's) does; best fit is unchanged."""
    policy = learned({})
    out = policy.place(PlacementRequest(1, {0: [], 1: []}, frozenset({0, 1})), inventory({"b": 4, "c": 2}))
    assert {n for n, _ in out.values()} == {"b"}
    assert BestFitSameModel().place(PlacementRequest(1, {0: [], 1: []}, frozenset({0, 1})),
                                    inventory({"b": 4, "c": 2})) == {0: ("c", ["c-0"]), 1: ("c", ["c-1"])}, \
        "best fit still takes the tightest fit"
    assert policy.last is not None and policy.last["avoided"] is None


def test_a_restart_in_place_is_not_explained() -> None:
    policy = learned({"b": RISKY})
    inv = inventory({"b": 2})
    assert policy.place(PlacementRequest(1, {0: ["a-0"], 1: ["a-1"]}, frozenset()), inv) == \
        {0: ("a", ["a-0"]), 1: ("a", ["a-1"])}
    assert policy.explanation() == []


def test_a_learned_policy_without_a_model_file_says_which_file(tmp_path, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    import sentinel.policy.placement as module

    monkeypatch.setattr(module, "DEFAULT_PATH", tmp_path / "missing.json")
    with pytest.raises(ValueError, match=r"missing\.json cannot be loaded \(the file does not exist\)"):
        LearnedPlacement()
