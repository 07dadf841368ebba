"""Training the learned policy on the simulator, from a trace's early days only.

Two steps, both on days [first, last) of the trace (0–120 for the shipped model; 121–174 are never seen):
1. the hazard model: every day, each node's features against "a fault starts within the horizon", fitted by
   logistic regression (`sentinel.policy.hazard.fit`);
2. the policy's knobs (`sentinel.policy.decide`): tuned by the cross-entropy method on simulated replays of
   the same days over several seeds, maximising ETTR with serving SLO attainment held at the heuristic's.
   CEM because the replay is a black box with discrete events (no gradient) and there are four knobs; a
   gymnasium environment would add a step API no part of this uses.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import replace

import numpy as np

from sentinel.policy.features import Fault, node_features
from sentinel.policy.hazard import HazardModel, fit
from sentinel.simulate.cluster import Scenario
from sentinel.simulate.costs import Costs
from sentinel.simulate.engine import Simulation
from sentinel.simulate.policies import Heuristic, Learned
from sentinel.simulate.trace import DAY, Trace

log = logging.getLogger("sentinel.simulate")

KNOBS = {  # name → (low, high) searched by CEM
    "avoid_risk": (0.02, 0.6),
    "interval_factor": (0.5, 2.0),
    "spare_factor": (0.5, 3.0),
    "migrate_risk": (0.05, 1.0),
}


def hazard_dataset(trace: Trace, first_day: float, last_day: float,
                   horizon_days: float = 7.0) -> tuple[np.ndarray, np.ndarray]:
    """Rows (node features at day d, faulted within the horizon) for every node and whole day in the range
    whose horizon ends inside it; a node that is out at day d is skipped (it takes no work)."""
    by_node: dict[str, list[Fault]] = {}
    for f in trace.faults:
        by_node.setdefault(f.node, []).append(Fault(f.start, f.end, f.kind))
    xs, ys = [], []
    for day in np.arange(first_day + 1, last_day - horizon_days):
        now = float(day) * DAY
        for node in trace.nodes:
            faults = by_node.get(node, [])
            known = [Fault(f.start, f.end if f.end is not None and f.end <= now else None, f.kind)
                     for f in faults if f.start < now]
            if any(f.end is None for f in known):
                continue
            xs.append(node_features(known, now))
            ys.append(1.0 if any(now < f.start <= now + horizon_days * DAY for f in faults) else 0.0)
    return np.array(xs), np.array(ys)


def fit_hazard(trace: Trace, first_day: float, last_day: float, horizon_days: float = 7.0) -> HazardModel:
    x, y = hazard_dataset(trace, first_day, last_day, horizon_days)
    if len(y) == 0 or y.sum() == 0:
        raise ValueError(f"days {first_day:g}–{last_day:g} hold no fault to learn from")
    return fit(x, y, horizon_days=horizon_days)


def score(trace: Trace, costs: Costs, scenario: Scenario, model: HazardModel, *, first_day: float,
          last_day: float, seeds: list[int], floor: dict[int, float] | None = None) -> float:
    """Mean ETTR over seeds; a seed whose serving attainment falls below its heuristic floor costs 10×
    the shortfall."""
    total = 0.0
    for seed in seeds:
        s = replace(scenario, seed=seed)
        out = Simulation(trace, Learned(model), costs, s, first_day=first_day, last_day=last_day).run()
        penalty = 0.0
        if floor is not None and out["serving_slo_attainment"] is not None:
            penalty = 10.0 * max(0.0, floor[seed] - out["serving_slo_attainment"])
        total += (out["ettr"] or 0.0) - penalty
    return total / len(seeds)


def tune(trace: Trace, costs: Costs, scenario: Scenario, model: HazardModel, *, first_day: float,
         last_day: float, seeds: list[int], iterations: int = 12, population: int = 16, elite: int = 4,
         rng_seed: int = 0, progress: Callable[[int, float], None] | None = None) -> HazardModel:
    """The cross-entropy method over KNOBS; returns the model with the best knobs found."""
    floor = {}
    for seed in seeds:
        out = Simulation(trace, Heuristic(), costs, replace(scenario, seed=seed), first_day=first_day,
                         last_day=last_day).run()
        floor[seed] = out["serving_slo_attainment"] if out["serving_slo_attainment"] is not None else 0.0
    rng = np.random.default_rng(rng_seed)
    names = list(KNOBS)
    low = np.array([KNOBS[n][0] for n in names])
    high = np.array([KNOBS[n][1] for n in names])
    mean, sd = (low + high) / 2, (high - low) / 4
    best, best_value = dict(zip(names, mean.tolist(), strict=True)), -np.inf
    for it in range(iterations):
        samples = np.clip(rng.normal(mean, sd, size=(population, len(names))), low, high)
        values = []
        for row in samples:
            params = dict(zip(names, row.tolist(), strict=True))
            values.append(score(trace, costs, scenario, replace(model, params=params), first_day=first_day,
                                last_day=last_day, seeds=seeds, floor=floor))
        order = np.argsort(values)[::-1][:elite]
        if values[order[0]] > best_value:
            best_value, best = values[order[0]], dict(zip(names, samples[order[0]].tolist(), strict=True))
        mean, sd = samples[order].mean(axis=0), samples[order].std(axis=0) + 1e-3 * (high - low)
        if progress:
            progress(it, float(best_value))
    return replace(model, params=best)
