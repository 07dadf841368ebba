"""Hazard models for the tests, built by hand so the risks are known (the trained one is not in the tree)."""

from __future__ import annotations

from typing import Any

from sentinel.policy.features import NODE_FEATURES
from sentinel.policy.hazard import HazardModel

WEIGHTS = {"faults_7d": 1.0, "faults_30d": 1.0, "returned_within_1d": 1.5, "log_days_since_fault": -0.5}


def hazard_model(**params: Any) -> HazardModel:
    """Risk grows with recent faults: a node that never faulted ≈ 0.02, one with a fault last week ≈ 0.5 (above
    the default avoid_risk 0.2), two faults this week and back since yesterday ≈ 0.98. Unscaled (mean 0, scale 1)."""
    n = len(NODE_FEATURES)
    weights = [WEIGHTS.get(name, 0.0) for name in NODE_FEATURES]
    return HazardModel(weights=weights, bias=-1.0, mean=[0.0] * n, scale=[1.0] * n, horizon_days=7.0,
                       params={"avoid_risk": 0.2, "interval_factor": 1.0, **params}, trained_on="tests")
