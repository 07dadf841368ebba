"""Which policies the server runs, from settings: the defaults record nothing; a learned policy (active or
shadow) needs a loadable model, or the server does not start, with the path in the message."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from sentinel.app import create_app
from sentinel.checkpoints.interval import YoungDaly
from sentinel.config import Settings
from sentinel.policy import hazard
from sentinel.policy.features import NODE_FEATURES
from sentinel.policy.interval import LearnedInterval
from sentinel.policy.placement import LearnedPlacement
from sentinel.policy.shadow import RecordingInterval, RecordingPlacement
from sentinel.policy.wiring import build_policies
from sentinel.remediation.placement import BestFitSameModel
from tests.policy.hazard_models import hazard_model


@pytest.fixture
def model_path(tmp_path: Path) -> Path:
    """A model fitted by `hazard.fit` on small synthetic data: recent faults predict the next one."""
    rng = np.random.default_rng(7)
    x = rng.poisson(0.5, size=(400, len(NODE_FEATURES))).astype(float)
    y = (x[:, NODE_FEATURES.index("faults_7d")] + rng.normal(0, 0.5, 400) > 1).astype(float)
    path = tmp_path / "learned.json"
    hazard.fit(x, y, steps=300).save(path)
    return path


def settings(tmp_path: Path, **values: object) -> Settings:
    return Settings(data_dir=tmp_path / "data", database_url=f"sqlite:///{tmp_path / 'db.sqlite'}", **values)


def test_the_default_path_is_the_models_and_the_defaults_record_nothing(tmp_path: Path) -> None:
    assert Settings().learned_policy_path == hazard.DEFAULT_PATH
    policies = build_policies(settings(tmp_path, learned_policy_path=tmp_path / "absent.json"), {})
    assert type(policies.placement) is BestFitSameModel and type(policies.interval) is YoungDaly


def test_learned_and_shadows_are_built_with_one_model(tmp_path: Path, model_path: Path) -> None:
    errors: dict[str, int] = {}
    policies = build_policies(settings(tmp_path, placement_policy="learned", placement_shadow="best-fit",
                                       checkpoint_interval_shadow="learned", learned_policy_path=model_path), errors)
    assert isinstance(policies.placement, RecordingPlacement) and isinstance(policies.interval, RecordingInterval)
    assert isinstance(policies.placement.active, LearnedPlacement)
    assert isinstance(policies.placement.shadow, BestFitSameModel) and policies.placement.errors is errors
    assert isinstance(policies.interval.shadow, LearnedInterval) and policies.interval.name == "young-daly"
    assert policies.placement.active.model is policies.interval.shadow.model
    assert policies.placement.active.model.weights == hazard.HazardModel.load(model_path).weights


@pytest.mark.parametrize("key", ["placement_policy", "placement_shadow", "checkpoint_interval_policy",
                                 "checkpoint_interval_shadow"])
def test_a_learned_policy_without_its_model_does_not_start(tmp_path: Path, key: str) -> None:
    missing = tmp_path / "nowhere" / "learned.json"
    with pytest.raises(ValueError, match=rf"{key} = 'learned', but the learned policy's model {missing} cannot be "
                                         r"loaded \(the file does not exist\)"):
        build_policies(settings(tmp_path, learned_policy_path=missing, **{key: "learned"}), {})
    with pytest.raises(ValueError, match="cannot be loaded"):
        create_app(settings(tmp_path, learned_policy_path=missing, **{key: "learned"}), run_scheduler=False)


def test_a_model_that_is_not_one_is_refused(tmp_path: Path) -> None:
    broken = tmp_path / "learned.json"
    broken.write_text('{"weights": [1.0]}')
    with pytest.raises(ValueError, match=r"learned\.json cannot be loaded \(TypeError: "):
        build_policies(settings(tmp_path, placement_policy="learned", learned_policy_path=broken), {})
    short = hazard_model().to_json() | {"weights": [0.0] * 3}
    broken.write_text(json.dumps(short))
    with pytest.raises(ValueError, match=r"cannot be loaded \(ValueError: hazard model has 3 weights"):
        build_policies(settings(tmp_path, placement_policy="learned", learned_policy_path=broken), {})


@pytest.mark.parametrize(("values", "message"), [
    ({"placement_shadow": "nope"}, r"placement_shadow: placement policy 'nope' is unknown; known: best-fit, learned"),
    ({"placement_policy": "nope"}, r"placement_policy: placement policy 'nope' is unknown"),
    ({"checkpoint_interval_shadow": "daly"}, r"checkpoint_interval_shadow: checkpoint interval policy 'daly' is "
                                             r"unknown; known: learned, young-daly"),
    ({"placement_shadow": "best-fit"}, r"placement_shadow names the active policy 'best-fit'"),
])
def test_unknown_names_and_a_shadow_that_is_the_active_policy_are_refused(tmp_path: Path, values: dict[str, str],
                                                                          message: str) -> None:
    with pytest.raises(ValueError, match=message):
        build_policies(settings(tmp_path, **values), {})
