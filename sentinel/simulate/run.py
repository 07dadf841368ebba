"""Run the policies side by side on the same trace and the same scenario, and check the ETTR model."""

from __future__ import annotations

import math
from typing import Any

from sentinel.policy.hazard import HazardModel
from sentinel.simulate.cluster import Scenario
from sentinel.simulate.costs import Costs
from sentinel.simulate.engine import Simulation
from sentinel.simulate.policies import make_policy
from sentinel.simulate.trace import Trace


def simulate(trace: Trace, costs: Costs, scenario: Scenario, *, policies: list[str], first_day: float,
             last_day: float, model: HazardModel | None = None) -> dict[str, Any]:
    if not 0 <= first_day < last_day:
        raise ValueError(f"--days {first_day:g}:{last_day:g}: need 0 ≤ A < B")
    out: dict[str, Any] = {"trace": trace.source, "days": [first_day, last_day], "nodes": len(trace.nodes),
                           "scenario": scenario.__dict__ | {}, "costs": costs.summary(), "policies": {}}
    for name in policies:
        sim = Simulation(trace, make_policy(name, model), costs, scenario, first_day=first_day, last_day=last_day)
        out["policies"][name] = sim.run()
    any_ = next(iter(out["policies"].values()))
    out["faults"], out["faults_per_1000_node_days"] = any_["faults"], any_["faults_per_1000_node_days"]
    return out


def ettr_model(*, nodes: int, rate_per_node_second: float, restart_seconds: float, interval_seconds: float,
               stall_seconds: float) -> float:
    """E[ETTR] ≈ (1 − N·r_f·(u0 + Δt/2)) / (1 + w/Δt): the first-order model the simulator must reproduce."""
    return (1.0 - nodes * rate_per_node_second * (restart_seconds + interval_seconds / 2.0)) / \
        (1.0 + stall_seconds / interval_seconds)


def ci95(values: list[float]) -> tuple[float, float, float]:
    """Mean and a normal 95% interval over seeds."""
    n = len(values)
    mean = sum(values) / n
    if n < 2:
        return mean, mean, mean
    sd = math.sqrt(sum((v - mean) ** 2 for v in values) / (n - 1))
    half = 1.96 * sd / math.sqrt(n)
    return mean, mean - half, mean + half
