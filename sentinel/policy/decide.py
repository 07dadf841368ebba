"""The decisions the learned policy makes, as plain functions of the hazard model's risks and its tuned
knobs, shared by the simulator (`sentinel.simulate.policies`) and the server (`sentinel.policy.placement`,
`sentinel.policy.interval`), so what was tuned offline is what runs live.

Knobs (`HazardModel.params`): `avoid_risk` (a node above it is not given new work while another fits),
`interval_factor` (× Young/Daly), `spare_factor` (× the expected nodes out at once), `migrate_risk` (a
node in use above it is swapped for a safer free one at the next checkpoint: a planned restart for a
training job, a replica moved before the old one stops for a serving job).

The state each decision reads: every candidate node's risk (the hazard model over its 17 fault-history
features, `features.py`, network faults among them); placement, the free nodes that fit (cluster load);
the spare pool, the fleet's predicted fault rate (its nodes' risks), the mean repair time and the free nodes
it may hold back; the interval, the job's own nodes (its size) and its measured save stall; migration, the
free nodes safe enough to move to. No NIC or link counter feeds it yet (the network tier, issue 18).
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence

DEFAULT_PARAMS = {"avoid_risk": 0.2, "interval_factor": 1.0, "spare_factor": 1.0, "migrate_risk": 0.5}


def knob(params: Mapping[str, float], name: str) -> float:
    return float(params.get(name, DEFAULT_PARAMS[name]))


def order_by_risk(nodes: Sequence[str], risk: Mapping[str, float], params: Mapping[str, float]) -> list[str]:
    """Nodes to give work to, safest first; nodes above `avoid_risk` go last (used only if nothing else fits).
    Equal risks keep the order given (the caller's own preference, e.g. best fit)."""
    limit = knob(params, "avoid_risk")
    return sorted(nodes, key=lambda n: (risk.get(n, 0.0) > limit, round(risk.get(n, 0.0), 6)))


def to_migrate(nodes: Sequence[str], risk: Mapping[str, float], params: Mapping[str, float]) -> list[str]:
    """Nodes in use whose risk is above `migrate_risk`, riskiest first."""
    limit = knob(params, "migrate_risk")
    return sorted((n for n in nodes if risk.get(n, 0.0) > limit), key=lambda n: -risk.get(n, 0.0))


def rate_per_second(risks: Sequence[float], horizon_days: float) -> float:
    """Faults per second of a set of nodes from each one's P(fault within the horizon) (Poisson per node)."""
    horizon = max(horizon_days, 1e-9) * 86400.0
    return sum(-math.log(max(1e-12, 1.0 - min(r, 1 - 1e-12))) for r in risks) / horizon


def young_daly_seconds(stall_seconds: float, mtbf_seconds: float) -> float:
    return math.sqrt(2.0 * max(stall_seconds, 1e-6) * mtbf_seconds)


def learned_interval_seconds(stall_seconds: float, risks: Sequence[float], horizon_days: float,
                             params: Mapping[str, float], *, floor_seconds: float = 60.0,
                             ceiling_seconds: float = 86400.0) -> float:
    """Young/Daly on the job's own nodes' predicted fault rate, times the tuned `interval_factor`."""
    rate = rate_per_second(risks, horizon_days)
    mtbf = 1.0 / rate if rate > 0 else ceiling_seconds * 10
    interval = young_daly_seconds(stall_seconds, mtbf) * knob(params, "interval_factor")
    return min(ceiling_seconds, max(floor_seconds, interval))


def spare_pool_size(fleet_risks: Sequence[float], horizon_days: float, repair_seconds: float,
                    params: Mapping[str, float], *, limit: int) -> int:
    """Spares to hold: the nodes expected out at once (rate × repair time, Little's law) × `spare_factor`."""
    out_at_once = rate_per_second(fleet_risks, horizon_days) * max(0.0, repair_seconds)
    return max(0, min(limit, math.ceil(out_at_once * knob(params, "spare_factor"))))
