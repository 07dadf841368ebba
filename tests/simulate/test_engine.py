"""The replay: its books balance, it reproduces the first-order ETTR model on Poisson faults, and each
policy's machinery (timeouts, warm spares, lemons, the breaker, scale-out) does what it says."""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest

from sentinel.simulate.cluster import Scenario, covered, within_slo
from sentinel.simulate.costs import Costs
from sentinel.simulate.engine import Simulation
from sentinel.simulate.policies import Heuristic, NoSentinel
from sentinel.simulate.run import ettr_model, simulate
from sentinel.simulate.trace import DAY, Trace, parse_trace, synthetic_trace
from tests.simulate.conftest import event


def test_every_second_of_every_job_is_productive_or_lost_to_a_named_cause(real_trace: Trace, costs: Costs) -> None:
    out = simulate(real_trace, costs, Scenario(), policies=["none", "heuristic"], first_day=121, last_day=174)
    wall_hours = 53 * 24
    for summary in out["policies"].values():
        for job in summary["training_jobs"]:
            assert job["ettr"] * wall_hours + sum(job["lost_hours"].values()) == pytest.approx(wall_hours, rel=1e-9)
        lost = summary["accelerator_hours_lost"]
        assert lost["total"] == pytest.approx(sum(v for k, v in lost.items() if k != "total"))
    none, heuristic = out["policies"]["none"], out["policies"]["heuristic"]
    assert none["faults"] == heuristic["faults"] == 111  # the same faults for both
    assert heuristic["ettr"] > none["ettr"]
    assert heuristic["serving_slo_attainment"] >= none["serving_slo_attainment"]
    assert none["accelerator_hours_lost"]["detection_restart"] > 10 * heuristic["accelerator_hours_lost"][
        "detection_restart"]


@pytest.mark.parametrize(("rate", "interval", "nodes"), [(20.0, 1800.0, 128), (5.0, 1800.0, 256),
                                                          (100.0, 900.0, 64)])
def test_poisson_faults_reproduce_the_ettr_model_within_two_percent(costs: Costs, rate: float, interval: float,
                                                                    nodes: int) -> None:
    scenario = Scenario(training_nodes=(nodes,), serving_replicas=(), baseline_interval_seconds=interval)
    trace = synthetic_trace(nodes=400, days=1500, per_1000_node_days=rate, repair_hours=24, seed=3)
    got = simulate(trace, costs, scenario, policies=["none"], first_day=0, last_day=1500)["policies"]["none"]
    restart = scenario.baseline_timeout_seconds + costs.cold_restart + \
        scenario.state_gib_per_node * costs.baseline_restore_per_gib
    expected = ettr_model(nodes=nodes, rate_per_node_second=rate / 1000 / DAY, restart_seconds=restart,
                          interval_seconds=interval, stall_seconds=scenario.state_gib_per_node *
                          costs.baseline_stall_per_gib)
    assert got["ettr"] == pytest.approx(expected, rel=0.02)
    assert got["training_jobs"][0]["interruptions"] > 500  # enough faults for the comparison to mean something


def one_job(trace: Trace, costs: Costs, policy: object, **kw: object) -> Simulation:
    scenario = Scenario(training_nodes=(2,), serving_replicas=(), seed=1, **kw)  # type: ignore[arg-type]
    return Simulation(trace, policy, costs, scenario, first_day=0, last_day=10)  # type: ignore[arg-type]


def test_the_baseline_waits_for_its_timeout_and_sentinel_for_its_measured_recovery(costs: Costs) -> None:
    trace = parse_trace([event("a", 1.0), event("a", 2.0, "fault_end")], nodes=3)
    for policy, expected in ((NoSentinel(), 600 + costs.cold_restart), (Heuristic(), costs.recover_gpu)):
        sim = one_job(trace, costs, policy)
        sim.position = {n: k for k, n in enumerate(trace.nodes)}  # the job starts on a and the next node
        job = sim.run()["training_jobs"][0]
        assert job["interruptions"] == 1
        assert job["lost_hours"]["detection_restart"] * 3600 == pytest.approx(expected)


def test_without_a_node_the_job_waits_and_the_wait_is_booked(costs: Costs) -> None:
    trace = parse_trace([event("a", 1.0), event("a", 3.0, "fault_end")], nodes=2)  # no third node
    sim = one_job(trace, costs, Heuristic())
    job = sim.run()["training_jobs"][0]
    assert job["lost_hours"]["waiting_for_node"] == pytest.approx(48.0)
    assert job["ettr"] == pytest.approx(1 - 48 / 240 - sum(v for k, v in job["lost_hours"].items()
                                                          if k != "waiting_for_node") / 240)


def test_a_lemon_is_kept_out_and_the_breaker_holds_a_storm(costs: Costs) -> None:
    events = []
    for k in range(5):  # five faults in five days on node a: the lemon detector's threshold
        events += [event("a", 0.5 + k), event("a", 0.6 + k, "fault_end")]
    trace = parse_trace(events, nodes=4)
    sim = Simulation(trace, Heuristic(), costs, Scenario(training_nodes=(1,), serving_replicas=()),
                     first_day=0, last_day=10)
    sim.now = 5.0 * DAY
    for f in trace.faults:
        sim._learn_start(f)
    assert not sim.policy.usable(sim, "a") and sim.policy.usable(sim, "b")
    storm = parse_trace([event(f"n{k}", 1.0) for k in range(20)], nodes=100)
    scenario = Scenario(training_nodes=(40,), serving_replicas=(), breaker_share=0.1)
    sim = Simulation(storm, Heuristic(), costs, scenario, first_day=0, last_day=3)
    sim.position = {n: k for k, n in enumerate(storm.nodes)}  # the job holds n0…n39: all 20 faults hit it
    job = sim.run()["training_jobs"][0]
    assert job["interruptions"] == 20
    assert job["lost_hours"]["waiting_for_node"] == pytest.approx(1.0, abs=0.01)  # the breaker's hour


def test_sentinel_scales_serving_out_for_a_spike_and_the_baseline_rides_it(costs: Costs) -> None:
    trace = parse_trace([], nodes=60)
    scenario = Scenario(training_nodes=(), serving_replicas=(8,), spikes_per_week=7.0, seed=4)
    out = simulate(trace, costs, scenario, policies=["none", "heuristic"], first_day=0, last_day=7)
    none, heuristic = (out["policies"][p]["serving_slo_attainment"] for p in ("none", "heuristic"))
    assert out["policies"]["none"]["serving_jobs"][0]["spikes"] > 0
    assert none < 0.999 and heuristic > none
    assert heuristic == pytest.approx(1.0, abs=1e-4)


def test_shedding_keeps_the_slo_for_what_fits_and_a_queue_misses_it_until_the_backlog_drains() -> None:
    rate = np.array([1.0, 3.0, 1.0, 1.0, 1.0, 1.0])  # a spike in minute 1; capacity 2 a minute
    capacity = np.full(6, 2.0)
    assert within_slo(rate, capacity, "shed", 10.0).tolist() == [1.0, 2.0, 1.0, 1.0, 1.0, 1.0]
    # backlog 1 after minute 1: minute 2 serves it plus its own 1 (≤ 2), so the queue is empty again
    assert within_slo(rate, capacity, "queue", 10.0).tolist() == [1.0, 0.0, 1.0, 1.0, 1.0, 1.0]
    # two minutes of 5: the backlog would be 6, clients give up past 2 minutes of capacity (4); it drains by
    # 0.5 a minute at 1.5, by 1 at 1.0, and the SLO is met again once it is gone
    long = np.array([1.0, 5.0, 5.0, 1.5, 1.5, 1.5, 1.5, 1.0, 1.0])
    assert within_slo(long, np.full(9, 2.0), "queue", 2.0).tolist() == [1.0, 0, 0, 0, 0, 0, 0, 0, 1.0]
    assert within_slo(long, np.full(9, 2.0), "queue", 100.0)[8] == 0, "without the clients' timeout it drains later"
    with pytest.raises(ValueError, match="unknown serving degradation"):
        within_slo(rate, capacity, "pray", 10.0)


def test_coverage_counts_shares_of_minutes() -> None:
    got = covered([(30.0, 150.0, 1.0), (0.0, 600.0, 0.5)], 0.0, 5)
    assert got.tolist() == pytest.approx([1.0, 1.5, 1.0, 0.5, 0.5])


def test_a_scenario_bigger_than_the_cluster_is_refused(costs: Costs) -> None:
    trace = parse_trace([], nodes=10)
    with pytest.raises(ValueError, match="needs 11 nodes, the cluster has 10"):
        simulate(trace, costs, replace(Scenario(), training_nodes=(8,), serving_replicas=(3,)),
                 policies=["none"], first_day=0, last_day=1)
    with pytest.raises(ValueError, match="need 0 ≤ A < B"):
        simulate(trace, costs, Scenario(training_nodes=(1,)), policies=["none"], first_day=3, last_day=1)
