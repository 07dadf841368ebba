"""The learned part of the learned policy: P(a node faults within the horizon | its features), a logistic
model over NODE_FEATURES, fitted on a fault history (numpy, no framework: 17 weights need none), and the
policy parameters tuned on the simulator. Saved as JSON so the server loads it without numpy pickles.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from sentinel.policy.features import NODE_FEATURES

DEFAULT_PATH = Path(__file__).with_name("learned.json")


@dataclass
class HazardModel:
    weights: list[float]
    bias: float
    mean: list[float]
    scale: list[float]
    horizon_days: float = 7.0
    params: dict[str, float] = field(default_factory=dict)  # policy knobs tuned on the simulator
    trained_on: str = ""  # what it was fitted and tuned on, for the notes and the incident

    def risk(self, x: np.ndarray) -> np.ndarray:
        """P(fault within horizon_days) for one feature row or a matrix of rows."""
        z = (np.asarray(x, dtype=float) - np.asarray(self.mean)) / np.asarray(self.scale)
        return 1.0 / (1.0 + np.exp(-(z @ np.asarray(self.weights) + self.bias)))

    def explain(self, x: np.ndarray, top: int = 3) -> list[tuple[str, float, float]]:
        """The features that moved this node's risk most: (name, value, contribution to the log-odds)."""
        z = (np.asarray(x, dtype=float) - np.asarray(self.mean)) / np.asarray(self.scale)
        parts = z * np.asarray(self.weights)
        order = np.argsort(-np.abs(parts))[:top]
        return [(NODE_FEATURES[i], float(x[i]), float(parts[i])) for i in order]

    def to_json(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> HazardModel:
        model = cls(**data)
        if not (len(model.weights) == len(model.mean) == len(model.scale) == len(NODE_FEATURES)):
            raise ValueError(f"hazard model has {len(model.weights)} weights, the features are {len(NODE_FEATURES)}")
        return model

    def save(self, path: Path) -> None:
        path.write_text(json.dumps(self.to_json(), indent=1) + "\n")

    @classmethod
    def load(cls, path: Path = DEFAULT_PATH) -> HazardModel:
        return cls.from_json(json.loads(path.read_text()))


def fit(x: np.ndarray, y: np.ndarray, *, l2: float = 1e-3, steps: int = 50,
        horizon_days: float = 7.0) -> HazardModel:
    """Logistic regression by Newton's method (IRLS) on standardised features, a small ridge; unweighted, so
    `risk` stays a probability an operator can read."""
    mean = x.mean(axis=0)
    scale = np.where(x.std(axis=0) > 1e-9, x.std(axis=0), 1.0)
    z = np.hstack([(x - mean) / scale, np.ones((len(x), 1))])
    beta = np.zeros(z.shape[1])
    ridge = l2 * len(y) * np.eye(z.shape[1])
    ridge[-1, -1] = 0.0  # the intercept is not shrunk
    for _ in range(steps):
        p = 1.0 / (1.0 + np.exp(-(z @ beta)))
        grad = z.T @ (p - y) + ridge @ beta
        hess = (z * (p * (1 - p))[:, None]).T @ z + ridge
        step = np.linalg.solve(hess, grad)
        beta -= step
        if float(np.abs(step).max()) < 1e-8:
            break
    return HazardModel(weights=beta[:-1].tolist(), bias=float(beta[-1]), mean=mean.tolist(),
                       scale=scale.tolist(), horizon_days=horizon_days)
