"""The placement contract, run against every registered placement policy (best-fit, learned): ranks keep
their accelerators unless replaced, a restart in place never raises NoCapacity even on a full fleet, a group
that shared a node stays together when one node holds it, same model and at least the memory, never a node
to avoid, NoCapacity when nothing fits, and the inventory is left as it was."""

from __future__ import annotations

from collections.abc import Callable

import pytest

import sentinel.policy.placement  # noqa: F401  (registers "learned")
from sentinel.policy.placement import LearnedPlacement
from sentinel.remediation.placement import (
    POLICIES,
    BestFitSameModel,
    Inventory,
    NoCapacity,
    PlacementPolicy,
    PlacementRequest,
    Slot,
)
from tests.contracts.conftest import implementations
from tests.policy.hazard_models import hazard_model

GiB = 2**30
FACTORIES: dict[str, Callable[[], PlacementPolicy]] = {
    "best-fit": BestFitSameModel,
    "learned": lambda: LearnedPlacement(hazard_model()).with_history({}, 1_800_000_000.0),
}


@pytest.fixture(params=implementations(POLICIES))
def policy(request: pytest.FixtureRequest) -> PlacementPolicy:
    return FACTORIES[request.param]()


def inventory(nodes: dict[str, int], *, busy: set[str] = frozenset(), model: str = "h100",  # type: ignore[assignment]
              memory: int = 80 * GiB, extra: dict[str, Slot] | None = None) -> Inventory:
    slots = {f"{n}-{i}": Slot(f"{n}-{i}", n, i, model, memory) for n, count in nodes.items() for i in range(count)}
    slots.update(extra or {})
    return Inventory(slots=slots, free={u for u in slots if u not in busy})


def test_a_restart_in_place_never_lacks_capacity(policy: PlacementPolicy) -> None:
    inv = inventory({"a": 2}, busy={"a-0", "a-1"})
    ranks = {0: ["a-0"], 1: ["a-1"]}
    assert policy.place(PlacementRequest(1, ranks, frozenset()), inv) == {0: ("a", ["a-0"]), 1: ("a", ["a-1"])}


def test_kept_ranks_stay_and_moved_ones_get_free_matching_accelerators(policy: PlacementPolicy) -> None:
    small = Slot("c-0", "c", 0, "h100", 40 * GiB)
    other = Slot("d-0", "d", 0, "a100", 80 * GiB)
    inv = inventory({"a": 2, "b": 1}, busy={"a-0", "a-1"}, extra={"c-0": small, "d-0": other})
    inv.free.discard("a-1")
    out = policy.place(PlacementRequest(1, {0: ["a-0"], 1: ["a-1"]}, frozenset({1})), inv)
    assert out[0] == ("a", ["a-0"])
    assert out[1] == ("b", ["b-0"]), "same model, at least the memory: not c (40 GiB) nor d (a100)"


def test_a_group_that_shared_a_node_stays_together(policy: PlacementPolicy) -> None:
    inv = inventory({"a": 2, "b": 1, "c": 1, "d": 4})
    inv.free -= {"a-0", "a-1"}
    out = policy.place(PlacementRequest(1, {0: ["a-0"], 1: ["a-1"]}, frozenset({0, 1})), inv)
    assert {out[0][0], out[1][0]} == {"d"} and len({*out[0][1], *out[1][1]}) == 2


def test_without_a_node_for_the_whole_group_it_goes_rank_by_rank(policy: PlacementPolicy) -> None:
    inv = inventory({"a": 2, "b": 1, "c": 1})
    inv.free -= {"a-0", "a-1"}
    out = policy.place(PlacementRequest(1, {0: ["a-0"], 1: ["a-1"]}, frozenset({0, 1})), inv)
    assert sorted(n for n, _ in out.values()) == ["b", "c"]


def test_a_new_job_avoids_the_nodes_it_is_told_to(policy: PlacementPolicy) -> None:
    inv = inventory({"a": 2, "b": 2})
    out = policy.place(PlacementRequest(1, {0: [], 1: []}, frozenset({0, 1}), avoid_nodes=frozenset({"a"})), inv)
    assert {n for n, _ in out.values()} == {"b"}


def test_no_capacity_says_what_was_missing(policy: PlacementPolicy) -> None:
    inv = inventory({"a": 2, "b": 1})
    inv.free -= {"a-0", "a-1"}
    with pytest.raises(NoCapacity, match="'h100'"):
        policy.place(PlacementRequest(7, {0: ["a-0"], 1: ["a-1"]}, frozenset({0, 1})), inv)
    with pytest.raises(NoCapacity):
        policy.place(PlacementRequest(8, {0: []}, frozenset({0})), inventory({"a": 1}, busy={"a-0"}))


def test_the_inventory_is_left_as_it_was(policy: PlacementPolicy) -> None:
    inv = inventory({"a": 2, "b": 2})
    before = set(inv.free)
    policy.place(PlacementRequest(1, {0: [], 1: []}, frozenset({0, 1})), inv)
    assert inv.free == before


def test_each_accelerator_goes_to_one_rank(policy: PlacementPolicy) -> None:
    inv = inventory({"a": 4, "b": 4})
    out = policy.place(PlacementRequest(1, {r: [] for r in range(3)}, frozenset(range(3)), accelerators_per_rank=2),
                       inv)
    taken = [u for _, uuids in out.values() for u in uuids]
    assert len(taken) == 6 == len(set(taken)) and all(len(u) == 2 for _, u in out.values())
