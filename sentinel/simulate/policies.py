"""The three policies the fault-trace simulator compares, side by side on the same faults:

* `none`: no Sentinel. torchrun-style: a fault is noticed when the collective times out, the job restarts
  cold on whatever node the scheduler has (first free by name), a fixed checkpoint interval, no spares,
  torch.save / torch.load costs; a dead serving replica is noticed by the health check and started cold;
  requests over capacity queue (no admission control).
* `heuristic`: Sentinel's heuristics. Measured detection + warm-standby restart, a spare pool sized by
  Little's law from the live fault rate, Young/Daly from the live rate, lemon retirement, the breaker,
  serving failover onto a spare, scale-out onto spares during a spike, and shedding what is over capacity.
* `learned`: the heuristics' machinery with the learned decisions (`sentinel.policy.decide`): nodes ranked
  by the hazard model's risk for placement and replacement, the spare pool from predicted risk, the
  interval from the job's own nodes' predicted rate.
"""

from __future__ import annotations

import math
import statistics
from typing import TYPE_CHECKING

import numpy as np

from sentinel.policy import decide
from sentinel.policy.features import node_features
from sentinel.policy.hazard import HazardModel

if TYPE_CHECKING:
    from sentinel.simulate.engine import Simulation, TrainingJob

DAY = 86400.0


class Policy:
    name = ""
    sentinel = True  # warm spares, measured detection, serving scale-out
    reviews = False  # moves work off risky nodes before they fail
    degradation = "shed"  # a serving job over capacity refuses the excess (cluster.within_slo); "queue": it waits

    def detect_and_restart_seconds(self, sim: Simulation, kind: str, warm: bool) -> float:
        c = sim.costs
        base = c.recover_gpu if kind == "gpu" else c.recover_other
        return base if warm else base + c.cold_restart

    def stall_seconds(self, sim: Simulation) -> float:
        return sim.scenario.state_gib_per_node * sim.costs.stall_per_gib

    def restore_seconds(self, sim: Simulation) -> float:
        return sim.scenario.state_gib_per_node * sim.costs.restore_per_gib

    def serving_restart_seconds(self, sim: Simulation) -> float:
        return sim.costs.serving_failover

    def spare_target(self, sim: Simulation) -> int:
        rate = sim.fleet_rate_per_node_second()
        return min(sim.free_count(), math.ceil(rate * len(sim.nodes) * sim.mean_repair_seconds()) + 1)

    def order(self, sim: Simulation, nodes: list[str]) -> list[str]:
        """Homogeneous nodes: best fit is the scheduler's own order."""
        return sorted(nodes, key=sim.position.__getitem__)

    def usable(self, sim: Simulation, node: str) -> bool:
        """The lemon detector: `lemon_faults` node faults within the window keep the node out."""
        window = sim.scenario.lemon_window_days * DAY
        recent = [f for f in sim.history.get(node, []) if sim.now - f.start <= window]
        return len(recent) < sim.scenario.lemon_faults

    def interval_seconds(self, sim: Simulation, job: TrainingJob) -> float:
        rate = sim.fleet_rate_per_node_second() * job.size
        if rate <= 0:
            return sim.scenario.baseline_interval_seconds
        return decide.young_daly_seconds(self.stall_seconds(sim), 1.0 / rate)

    def explain(self, sim: Simulation, node: str) -> str:
        return ""

    def review(self, sim: Simulation) -> None:
        """Called every REVIEW_SECONDS when `reviews`."""


class NoSentinel(Policy):
    name = "none"
    sentinel = False
    degradation = "queue"  # no admission control: the engine's default queue

    def detect_and_restart_seconds(self, sim: Simulation, kind: str, warm: bool) -> float:
        return sim.scenario.baseline_timeout_seconds + sim.costs.cold_restart

    def stall_seconds(self, sim: Simulation) -> float:
        return sim.scenario.state_gib_per_node * sim.costs.baseline_stall_per_gib

    def restore_seconds(self, sim: Simulation) -> float:
        return sim.scenario.state_gib_per_node * sim.costs.baseline_restore_per_gib

    def serving_restart_seconds(self, sim: Simulation) -> float:
        s = sim.scenario
        return s.serving_health_timeout_seconds + sim.costs.cold_restart + s.weights_gib_per_node * \
            sim.costs.baseline_restore_per_gib

    def spare_target(self, sim: Simulation) -> int:
        return 0

    def usable(self, sim: Simulation, node: str) -> bool:
        return True

    def interval_seconds(self, sim: Simulation, job: TrainingJob) -> float:
        return sim.scenario.baseline_interval_seconds


class Heuristic(Policy):
    name = "heuristic"


class Learned(Policy):
    name = "learned"
    reviews = True

    def __init__(self, model: HazardModel):
        self.model = model
        self._cache: tuple[float, dict[str, float]] = (-1.0, {})

    def risks(self, sim: Simulation) -> dict[str, float]:
        """Every node's risk now (cached per instant: a burst of decisions at one time reads one matrix)."""
        at, cached = self._cache
        if at == sim.now and cached:
            return cached
        seen = [n for n in sim.nodes if sim.history.get(n)]
        clean = float(self.model.risk(node_features([], sim.now)))  # every node with no fault reads the same
        risk = dict.fromkeys(sim.nodes, clean)
        if seen:
            x = np.array([node_features(sim.history[n], sim.now) for n in seen])
            risk.update(zip(seen, (float(r) for r in self.model.risk(x)), strict=True))
        self._cache = (sim.now, risk)
        return risk

    def order(self, sim: Simulation, nodes: list[str]) -> list[str]:
        return decide.order_by_risk(super().order(sim, nodes), self.risks(sim), self.model.params)

    def spare_target(self, sim: Simulation) -> int:
        risks = list(self.risks(sim).values())
        return decide.spare_pool_size(risks, self.model.horizon_days, sim.mean_repair_seconds(),
                                      self.model.params, limit=sim.free_count())

    def interval_seconds(self, sim: Simulation, job: TrainingJob) -> float:
        risk = self.risks(sim)
        return decide.learned_interval_seconds(self.stall_seconds(sim), [risk[n] for n in job.nodes],
                                               self.model.horizon_days, self.model.params)

    def review(self, sim: Simulation) -> None:
        """Swap nodes above `migrate_risk` for safer free ones: a job at its next save, a replica at once."""
        risk = self.risks(sim)
        for job in sim.training:
            leaving = decide.to_migrate(sorted(job.nodes), risk, self.model.params)
            safer = [n for n in sim.free_nodes() if risk[n] <= decide.knob(self.model.params, "avoid_risk")]
            sim.migrate(job, leaving[: len(safer)])
        for serve in sim.serving:
            for node in decide.to_migrate([n for n in serve.nodes if n], risk, self.model.params):
                if not sim.move_replica(serve, node):
                    break

    def explain(self, sim: Simulation, node: str) -> str:
        x = node_features(sim.history.get(node, []), sim.now)
        parts = ", ".join(f"{name}={value:g}" for name, value, _ in self.model.explain(x))
        return f"risk {self.risks(sim)[node]:.2f} ({parts})"


def make_policy(name: str, model: HazardModel | None) -> Policy:
    if name == "none":
        return NoSentinel()
    if name == "heuristic":
        return Heuristic()
    if name == "learned":
        if model is None:
            raise ValueError("the learned policy needs a model (sentinel/policy/learned.json or --model)")
        return Learned(model)
    raise ValueError(f"unknown policy {name!r}; known: none, heuristic, learned")


def median_or(values: list[float], default: float) -> float:
    return statistics.median(values) if values else default
