"""A replay's result: per policy ETTR, serving SLO attainment, accelerator-hours lost by cause, spares."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import numpy as np

from sentinel.simulate.cluster import CAUSES, covered, within_slo
from sentinel.simulate.trace import DAY

if TYPE_CHECKING:
    from sentinel.simulate.engine import Simulation


def summarise(sim: Simulation) -> dict[str, Any]:
    acc, wall = sim.scenario.accelerators_per_node, sim.end - sim.start
    jobs = [{"nodes": j.size, "accelerators": j.size * acc, "ettr": j.productive / wall,
             "interruptions": j.interruptions, "interval_seconds": j.interval,
             "lost_hours": {c: v / 3600.0 for c, v in j.lost.items()}} for j in sim.training]
    weight = sum(j.size for j in sim.training)
    ettr = sum(j.productive * j.size for j in sim.training) / (wall * weight) if weight else None
    lost = {c: sum(j.lost[c] * j.size * acc for j in sim.training) / 3600.0 for c in CAUSES}
    served = demanded = down_hours = 0.0
    serving = []
    minutes = len(sim.loads[0].rate) if sim.loads else 0
    for serve, load in zip(sim.serving, sim.loads, strict=True):
        down = covered(serve.down, sim.start, minutes)
        extra = covered(serve.extra, sim.start, minutes)
        capacity = (serve.replicas - down + extra) * 1.3 / (sim.scenario.serving_peak_utilization * serve.replicas)
        within = within_slo(load.rate, capacity, sim.policy.degradation, sim.scenario.client_timeout_minutes)
        served, demanded = served + float(within.sum()), demanded + float(load.rate.sum())
        down_hours += float(down.sum()) / 60.0
        serving.append({"replicas": serve.replicas, "slo_attainment": float(within.sum() / load.rate.sum()),
                        "failovers": serve.failed_over, "spikes": len(load.spikes),
                        "degradation": sim.policy.degradation,
                        "overloaded_minutes": int(np.count_nonzero(load.rate > capacity))})
    lost["serving_replica_down"] = down_hours * acc
    starts = sum(1 for f in sim.trace.faults if sim.start <= f.start < sim.end)
    return {"policy": sim.policy.name, "ettr": ettr, "training_jobs": jobs,
            "serving_slo_attainment": served / demanded if demanded else None, "serving_jobs": serving,
            "accelerator_hours_lost": lost | {"total": sum(lost.values())},
            "spare_accelerator_hours_idle": sim.spare_time * acc / 3600.0, "planned_moves": sim.migrations,
            "faults": starts, "faults_per_1000_node_days": 1000.0 * starts / (len(sim.nodes) * wall / DAY),
            "decisions_explained": sim.decisions}
