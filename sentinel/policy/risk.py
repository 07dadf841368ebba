"""The hazard model on the live fleet: loading it from `learned_policy_path`, and each node's risk at one
moment from its fault history, with the features that made it (for the incident and the decision record)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from datetime import datetime
from pathlib import Path
from typing import Any

import numpy as np
from sqlalchemy.orm import Session

from sentinel.policy.features import Fault, node_features
from sentinel.policy.hazard import HazardModel
from sentinel.policy.history import node_fault_history


def load_model(path: Path) -> HazardModel:
    """The learned policy's model; ValueError naming the file when it is missing or not a model."""
    try:
        return HazardModel.load(Path(path))
    except FileNotFoundError:
        why = "the file does not exist"
    except (OSError, ValueError, TypeError, KeyError) as exc:  # json.JSONDecodeError is a ValueError
        why = f"{type(exc).__name__}: {exc}"
    raise ValueError(f"the learned policy's model {path} cannot be loaded ({why}); write it with the training "
                     "(sentinel/simulate) or point learned_policy_path at one")


def short(value: float) -> str:
    return f"{value:.3g}"


class NodeRisks:
    """P(a node faults within the model's horizon | its history at `now`), computed once per node asked."""

    def __init__(self, model: HazardModel, history: Mapping[str, Sequence[Fault]], now: float):
        self.model = model
        self.history = history
        self.now = now
        self._rows: dict[str, np.ndarray] = {}
        self._risk: dict[str, float] = {}

    @classmethod
    def load(cls, session: Session, model: HazardModel, now: datetime) -> NodeRisks:
        return cls(model, node_fault_history(session, now), now.timestamp())

    def features(self, node: str) -> np.ndarray:
        if node not in self._rows:
            self._rows[node] = node_features(self.history.get(node, ()), self.now)
        return self._rows[node]

    def risk(self, node: str) -> float:
        if node not in self._risk:
            self._risk[node] = float(self.model.risk(self.features(node)))
        return self._risk[node]

    def of(self, nodes: Sequence[str]) -> dict[str, float]:
        return {n: self.risk(n) for n in nodes}

    def mattered(self, node: str, top: int) -> list[tuple[str, float, float]]:
        """The features that moved its risk most, (name, value, contribution to the log-odds); none that did not."""
        return [f for f in self.model.explain(self.features(node), top) if abs(f[2]) > 1e-9]

    def note(self, node: str, top: int = 2) -> str:
        """'risk 0.03: log_days_since_fault=5.9, faults_30d=0' — its risk and the features that mattered."""
        parts = ", ".join(f"{name}={short(value)}" for name, value, _ in self.mattered(node, top))
        return f"risk {self.risk(node):.2f}: {parts}" if parts else f"risk {self.risk(node):.2f}"

    def record(self, node: str, top: int = 3) -> dict[str, Any]:
        """The same as JSON, for the decision record."""
        return {"node": node, "risk": round(self.risk(node), 4),
                "features": [{"name": name, "value": round(value, 4), "contribution": round(part, 4)}
                             for name, value, part in self.mattered(node, top)]}
