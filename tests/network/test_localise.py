"""The probe plan, the pair matrix and the localisation, on crafted matrices: a slow link, a bad node, an
unreachable node, a bad rack, a fleet-wide slowdown; and the collective verdict."""

from __future__ import annotations

import itertools

import pytest

from sentinel.network.collective import verdict
from sentinel.network.localise import Thresholds, localise
from sentinel.network.matrix import ProbeMatrix, unreachable
from sentinel.network.plan import ProbePlan, valid_address
from sentinel.telemetry.schemas import ProbeResult

NOW = 1_800_000_000.0
NODES = [f"n{i:02d}" for i in range(12)]


def result(target: str, rtt: float | None = 0.0002, sent: int = 10, received: int | None = None,
           at: float = NOW) -> ProbeResult:
    got = sent if received is None else received
    return ProbeResult(target=target, sent=sent, received=got, rtt_p50_seconds=rtt if got else None,
                       rtt_p99_seconds=rtt * 1.5 if got and rtt else None, started_at=at - 5, ended_at=at)


def full_mesh(rtt: dict[frozenset[str], float] | None = None, lost: set[str] | None = None,
              nodes: list[str] = NODES) -> ProbeMatrix:
    m = ProbeMatrix(60.0)
    for a, b in itertools.permutations(nodes, 2):
        if lost and a in lost:
            continue  # a node that lost its link reports nothing
        if lost and b in lost:
            m.add(a, [result(b, received=0)], NOW)
        else:
            m.add(a, [result(b, (rtt or {}).get(frozenset((a, b)), 0.0002))], NOW)
    return m


def test_the_plan_gives_every_node_k_peers_and_every_node_k_probers():
    plan = ProbePlan(peers=4, round_seconds=10)
    for i, name in enumerate(NODES):
        plan.set_participant(name, f"10.0.0.{i + 1}:9481")
    plan.set_participant("no-probe", None)
    plan.set_participant("bad-addr", "example.com:9481")  # names are never targets: no lookups
    targets = {n: plan.targets(n, NOW) for n in NODES}
    assert plan.targets("no-probe", NOW) is None and plan.targets("bad-addr", NOW) is None
    probed_by = {n: 0 for n in NODES}
    for name, ts in targets.items():
        assert ts is not None and len(ts) == 4 and name not in {t.node for t in ts}
        assert len({t.node for t in ts}) == 4
        for t in ts:
            probed_by[t.node] += 1
            assert t.address == f"10.0.0.{NODES.index(t.node) + 1}:9481"
    assert set(probed_by.values()) == {4}
    # the subset rotates: over rounds every pair comes up
    seen = {(n, t.node) for r in range(40) for n in NODES for t in plan.targets(n, NOW + 10 * r) or []}
    assert len(seen) == len(NODES) * (len(NODES) - 1)


def test_addresses_must_be_ip_literals_with_a_port():
    assert valid_address("10.1.2.3:9481") and valid_address("[fd00::1]:9481")
    for bad in ("example.com:9481", "10.1.2.3", "10.1.2.3:0", "10.1.2.3:70000", ":9481", "[fd00::1]"):
        assert not valid_address(bad), bad


def test_a_slow_pair_between_healthy_nodes_is_the_link():
    found = localise(full_mesh({frozenset(("n03", "n07")): 0.012}).pairs(NOW), {}, (), Thresholds())
    assert [(link.a, link.b, link.confident) for link in found.links] == [("n03", "n07", True)]
    assert found.links[0].rtt_seconds == pytest.approx(0.012)
    assert found.nodes == [] and found.domains == [] and not found.fleet_wide
    assert found.bad_pairs == 1 and found.baseline_rtt_seconds == pytest.approx(0.0002)


def test_a_node_bad_on_every_pair_is_the_node_and_no_link_is_named():
    slow = {frozenset(("n05", other)): 0.02 for other in NODES if other != "n05"}
    found = localise(full_mesh(slow).pairs(NOW), {}, (), Thresholds())
    assert [(n.node, n.bad_peers, n.measured_peers, n.unreachable) for n in found.nodes] == [("n05", 11, 11, False)]
    assert found.links == []


def test_a_node_whose_link_is_down_is_unreachable():
    m = full_mesh(lost={"n09"})
    found = localise(m.pairs(NOW), {}, (), Thresholds())
    assert [(n.node, n.unreachable) for n in found.nodes] == [("n09", True)]
    assert unreachable(m, "n09", NOW - 15, 2) == [n for n in NODES if n != "n09"]
    assert unreachable(m, "n01", NOW - 15, 2) == []


def test_one_lost_prober_is_not_enough_and_an_answer_after_the_loss_clears_it():
    m = ProbeMatrix(60.0)
    m.add("n00", [result("n01", received=0)], NOW)
    assert unreachable(m, "n01", NOW - 15, 2) == []
    m.add("n02", [result("n01", received=0)], NOW + 1)
    assert unreachable(m, "n01", NOW - 15, 2) == ["n00", "n02"]
    m.add("n03", [result("n01")], NOW + 2)  # somebody reached it after the losses: the probers' paths, not it
    assert unreachable(m, "n01", NOW - 15, 2) == []


def test_a_rack_whose_uplink_is_slow_is_the_rack_not_its_nodes():
    rack = {"n00", "n01", "n02", "n03"}  # fine among themselves, slow to everyone outside
    slow = {frozenset((a, b)): 0.03 for a in rack for b in NODES if b not in rack}
    labels = {n: {"rack": f"r{NODES.index(n) // 4}"} for n in NODES}  # three racks of four
    found = localise(full_mesh(slow).pairs(NOW), labels, ("rack",), Thresholds())
    assert [(d.label, d.value, d.bad_nodes, d.nodes) for d in found.domains] == [("rack", "r0", sorted(rack), 4)]
    assert found.nodes == [] and found.links == []


def test_an_old_loss_that_answers_came_after_does_not_hold_back_a_new_one():
    """A prober cut off for a moment replays its lost window about n01; n01 answers everyone after that; then n01
    goes: the two probers that lose it now are enough, the replayed loss is not counted."""
    m = ProbeMatrix(60.0)
    m.add("n05", [result("n01", received=0, at=NOW - 6)], NOW)  # n05's own cut, 6 s ago
    m.add("n00", [result("n01", at=NOW - 3)], NOW)
    m.add("n02", [result("n01", at=NOW - 3)], NOW)
    assert unreachable(m, "n01", NOW - 15, 2) == []
    m.add("n00", [ProbeResult(target="n01", sent=2, received=0, started_at=NOW - 1, ended_at=NOW)], NOW)
    assert unreachable(m, "n01", NOW - 15, 2) == []
    m.add("n02", [ProbeResult(target="n01", sent=1, received=0, started_at=NOW - 0.5, ended_at=NOW)], NOW)
    assert unreachable(m, "n01", NOW - 15, 2) == ["n00", "n02"]


def test_a_pair_that_recovered_is_not_named_while_its_old_windows_age_out():
    m = full_mesh({frozenset(("n03", "n04")): 0.02})
    assert [(link.a, link.b) for link in localise(m.pairs(NOW), {}, (), Thresholds()).links] == [("n03", "n04")]
    for a, b in (("n03", "n04"), ("n04", "n03")):
        m.add(a, [result(b, 0.0002, at=NOW + 1)], NOW + 1)  # the newest window is fast again
    assert localise(m.pairs(NOW + 1), {}, (), Thresholds()).links == []


def test_a_rack_of_unreachable_nodes_is_one_domain():
    rack = {"n08", "n09", "n10", "n11"}
    labels = {n: {"rack": f"r{NODES.index(n) // 4}"} for n in NODES}
    found = localise(full_mesh(lost=rack).pairs(NOW), labels, ("rack",), Thresholds())
    assert [(d.value, d.bad_nodes) for d in found.domains] == [("r2", sorted(rack))]
    assert found.nodes == [] and found.links == []


def test_everything_slow_at_once_is_fleet_wide_and_names_nothing():
    slow = {frozenset(p): 0.01 for i, p in enumerate(itertools.combinations(NODES, 2)) if i % 3}
    found = localise(full_mesh(slow).pairs(NOW), {}, (), Thresholds())
    assert found.fleet_wide and found.links == [] and found.nodes == []


def test_a_bad_pair_with_too_few_other_measurements_is_only_a_suspect():
    m = ProbeMatrix(60.0)
    m.add("a", [result("b", 0.02)], NOW)
    m.add("a", [result("c"), result("d")], NOW)
    m.add("b", [result("c")], NOW)
    found = localise(m.pairs(NOW), {}, (), Thresholds())
    assert [(link.name, link.confident) for link in found.links] == [("a↔b", False)]


def test_the_matrix_window_and_pruning():
    m = ProbeMatrix(60.0)
    m.add("a", [result("b", 0.001)], NOW)
    m.add("a", [result("b", 0.003)], NOW + 30)
    assert m.pairs(NOW + 30)[0].rtt_p50_seconds == pytest.approx(0.002)
    assert m.pairs(NOW + 70)[0].rtt_p50_seconds == pytest.approx(0.003)  # the first fell out of the window
    m.prune(NOW + 100)
    assert m.pairs(NOW + 100) == [] and m.targets() == []
    m.add("a", [result("a")], NOW)  # a node never probes itself into the matrix
    assert m.pairs(NOW) == []


def test_the_collective_verdict_tells_a_slow_rank_from_a_slow_collective():
    nodes = {r: f"n{r // 2}" for r in range(8)}
    shares = {r: 0.6 for r in range(8)} | {5: 0.05}
    v = verdict(shares, nodes, steps=80)
    assert (v.kind, v.layer, v.ranks, v.nodes) == ("compute_straggler", "compute", [5], ["n2"])
    found = localise(full_mesh({frozenset(("n1", "n2")): 0.02}, nodes=[f"n{i}" for i in range(6)]).pairs(NOW),
                     {}, (), Thresholds())
    v = verdict({r: 0.6 for r in range(8)}, nodes, steps=80, localisation=found,
                port_alerts={"n3": ["mlx5_0/1 symbol_errors"]})
    assert (v.kind, v.layer, v.links, v.ports) == ("communication", "interconnect", ["n1↔n2"],
                                                   ["n3:mlx5_0/1 symbol_errors"])
    assert "n1↔n2" in v.summary
    v = verdict({r: 0.6 for r in range(8)}, nodes, steps=80)
    assert v.kind == "communication" and "not localised" in v.summary
    assert verdict(shares, nodes, steps=0).kind == "hang"
    assert verdict({r: 0.1 for r in range(8)}, nodes, steps=80).kind == "healthy"
