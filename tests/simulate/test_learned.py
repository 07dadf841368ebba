"""The learned policy: its hazard model learns what the trace holds (a node back from repair fails again
soon), its decisions read that risk, and the shipped model beats the heuristics on days it never saw."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest

from sentinel.policy import decide
from sentinel.policy.features import NODE_FEATURES, Fault, node_features
from sentinel.policy.hazard import HazardModel, fit
from sentinel.simulate.cluster import Scenario
from sentinel.simulate.costs import Costs
from sentinel.simulate.engine import Simulation
from sentinel.simulate.learn import fit_hazard, hazard_dataset, tune
from sentinel.simulate.policies import Learned
from sentinel.simulate.run import ci95, simulate
from sentinel.simulate.trace import DAY, Trace, parse_trace
from tests.simulate.conftest import event


def test_a_history_reads_as_numbers() -> None:
    now = 100 * DAY
    x = node_features([Fault(90 * DAY, 92 * DAY, "network"), Fault(99.5 * DAY, 99.8 * DAY, "gpu")], now)
    got = dict(zip(NODE_FEATURES, x, strict=True))
    assert got["faults_1d"] == 1 and got["faults_30d"] == 2 and got["faults_all"] == 2
    assert got["returned_within_1d"] == 1 and got["last_kind_gpu"] == 1 and got["kinds_90d"] == 2
    assert got["out_now"] == 0 and got["never_faulted"] == 0
    clean = dict(zip(NODE_FEATURES, node_features([], now), strict=True))
    assert clean["never_faulted"] == 1 and clean["faults_all"] == 0


def test_the_fit_recovers_a_known_relation_and_the_model_round_trips(tmp_path: Path) -> None:
    rng = np.random.default_rng(0)
    x = rng.normal(size=(4000, len(NODE_FEATURES)))
    y = (rng.uniform(size=4000) < 1 / (1 + np.exp(-(2.0 * x[:, 0] - 3.0)))).astype(float)
    model = fit(x, y)
    assert model.weights[0] == pytest.approx(2.0 * x[:, 0].std(), rel=0.2)
    assert max(abs(w) for w in model.weights[1:]) < 0.3
    assert model.explain(np.eye(len(NODE_FEATURES))[0] * 3)[0][0] == NODE_FEATURES[0]
    model.save(tmp_path / "m.json")
    again = HazardModel.load(tmp_path / "m.json")
    assert np.allclose(again.risk(x[:5]), model.risk(x[:5]))
    with pytest.raises(ValueError, match="weights"):
        HazardModel.from_json(model.to_json() | {"weights": [0.0]})


def test_on_the_trace_a_node_back_from_repair_is_riskier_and_the_risk_ranks_held_out_faults(
        real_trace: Trace) -> None:
    model = fit_hazard(real_trace, 0, 120)
    now = 110 * DAY
    fresh = node_features([Fault(108 * DAY, 109.8 * DAY, "gpu")], now)
    assert model.risk(fresh) > 3 * model.risk(node_features([], now))
    x, y = hazard_dataset(real_trace, 121, 174)  # days the model never saw
    risk = model.risk(x)
    top = risk >= np.quantile(risk, 0.99)
    assert y[top].mean() > 2 * y.mean()  # the riskiest 1% fault at more than twice the base rate


def test_decisions_prefer_safe_nodes_and_scale_with_risk() -> None:
    risk = {"a": 0.5, "b": 0.01, "c": 0.02, "d": 0.01}
    assert decide.order_by_risk(["a", "b", "c", "d"], risk, {"avoid_risk": 0.2}) == ["b", "d", "c", "a"]
    assert decide.to_migrate(["a", "b"], risk, {"migrate_risk": 0.3}) == ["a"]
    low = decide.learned_interval_seconds(10.0, [0.01] * 10, 7.0, {})
    high = decide.learned_interval_seconds(10.0, [0.2] * 10, 7.0, {})
    assert high < low and high == pytest.approx(
        decide.young_daly_seconds(10.0, 1 / decide.rate_per_second([0.2] * 10, 7.0)))
    assert decide.spare_pool_size([0.2] * 100, 7.0, 86400.0, {"spare_factor": 2.0}, limit=50) == \
        int(np.ceil(2.0 * decide.rate_per_second([0.2] * 100, 7.0) * 86400.0))


def test_the_learned_policy_gives_work_to_the_node_that_did_not_just_come_back(costs: Costs) -> None:
    trace = parse_trace([event("a", 0.5), event("a", 0.9, "fault_end")], nodes=3)
    model = HazardModel(weights=[0.0] * len(NODE_FEATURES), bias=-4.0, mean=[0.0] * len(NODE_FEATURES),
                        scale=[1.0] * len(NODE_FEATURES), params={"avoid_risk": 0.2, "spare_factor": 0.0})
    model.weights[NODE_FEATURES.index("returned_within_1d")] = 5.0
    sim = Simulation(trace, Learned(model), costs, Scenario(training_nodes=(2,), serving_replicas=()),
                     first_day=1, last_day=2)
    sim.position = {"a": 0, "node-0000": 1, "node-0001": 2}  # the scheduler's own order would start with a
    sim.run()
    assert sim.training[0].nodes == {"node-0000", "node-0001"}
    sim.now = 1.0 * DAY  # the moment it chose: a had come back 0.1 days before
    assert sim.policy.explain(sim, "a").startswith("risk 0.73 (returned_within_1d=1")


def test_tuning_improves_on_its_start_and_the_shipped_model_beats_the_heuristics_on_held_out_days(
        real_trace: Trace, costs: Costs) -> None:
    model = fit_hazard(real_trace, 0, 60)
    scenario = Scenario(training_nodes=(64, 32), serving_replicas=(8,))
    tuned = tune(real_trace, costs, scenario, model, first_day=30, last_day=60, seeds=[1], iterations=2,
                 population=4, elite=2)
    assert set(tuned.params) == set(decide.DEFAULT_PARAMS)
    shipped = HazardModel.load()
    assert "days 0–120" in shipped.trained_on
    margins, slo = [], []
    for seed in (1, 2, 3):
        out = simulate(real_trace, costs, replace(Scenario(), seed=seed), policies=["heuristic", "learned"],
                       first_day=121, last_day=174, model=shipped)["policies"]
        margins.append(out["learned"]["ettr"] - out["heuristic"]["ettr"])
        slo.append(out["learned"]["serving_slo_attainment"] - out["heuristic"]["serving_slo_attainment"])
    assert ci95(margins)[0] > 0 and min(slo) >= -1e-3
