"""The placement and checkpoint-interval policies the server runs, built once from settings (parse → defaults →
validate): the active ones, their shadows, and the learned model they share. A name nobody knows, a shadow
that is the active policy, or a learned policy without a loadable model is a ValueError at startup."""

from __future__ import annotations

from dataclasses import dataclass

from sentinel.checkpoints.interval import CheckpointIntervalPolicy, load_interval_policy
from sentinel.config import Settings
from sentinel.policy.hazard import HazardModel
from sentinel.policy.interval import LearnedInterval
from sentinel.policy.placement import LearnedPlacement
from sentinel.policy.risk import load_model
from sentinel.policy.scheduled import PendingDecisions
from sentinel.policy.shadow import RecordingInterval, RecordingPlacement
from sentinel.remediation.placement import PlacementPolicy, load_policy

POLICY_SETTINGS = ("placement_policy", "placement_shadow", "checkpoint_interval_policy", "checkpoint_interval_shadow")


@dataclass
class LivePolicies:
    placement: PlacementPolicy
    interval: CheckpointIntervalPolicy
    pending: PendingDecisions  # interval decisions waiting for the periodic flush (scheduled.py)


def build_policies(settings: Settings, errors: dict[str, int]) -> LivePolicies:
    """`errors` is the server's plugin error count (`sentinel_plugin_errors_total`): a failing shadow adds to it.
    Without a shadow or a learned policy, the active policies are returned as they are, recording nothing."""
    model = learned_model(settings)
    pending = PendingDecisions()
    return LivePolicies(placement=_placement(settings, model, errors),
                        interval=_interval(settings, model, errors, pending), pending=pending)


def learned_model(settings: Settings) -> HazardModel | None:
    """The model, when a setting names the learned policy; loaded once for all of them."""
    named = [key for key in POLICY_SETTINGS if getattr(settings, key) == "learned"]
    if not named:
        return None
    try:
        return load_model(settings.learned_policy_path)
    except ValueError as exc:
        raise ValueError(f"{' and '.join(named)} = 'learned', but {exc}") from None


def _check_shadow(setting: str, active: str, shadow: str) -> None:
    if shadow and shadow == active:
        raise ValueError(f"{setting} names the active policy {active!r}: a shadow must be another policy")


def _placement(settings: Settings, model: HazardModel | None, errors: dict[str, int]) -> PlacementPolicy:
    _check_shadow("placement_shadow", settings.placement_policy, settings.placement_shadow)
    active = _one_placement("placement_policy", settings.placement_policy, model)
    shadow = _one_placement("placement_shadow", settings.placement_shadow, model) if settings.placement_shadow \
        else None
    if shadow is None and not isinstance(active, LearnedPlacement):
        return active
    return RecordingPlacement(active, shadow, errors)


def _one_placement(setting: str, name: str, model: HazardModel | None) -> PlacementPolicy:
    if name == LearnedPlacement.name:
        return LearnedPlacement(model)
    try:
        return load_policy(name)
    except ValueError as exc:
        raise ValueError(f"{setting}: {exc}") from None


def _interval(settings: Settings, model: HazardModel | None, errors: dict[str, int],
              pending: PendingDecisions) -> CheckpointIntervalPolicy:
    _check_shadow("checkpoint_interval_shadow", settings.checkpoint_interval_policy,
                  settings.checkpoint_interval_shadow)
    active = _one_interval("checkpoint_interval_policy", settings.checkpoint_interval_policy, model)
    shadow = (_one_interval("checkpoint_interval_shadow", settings.checkpoint_interval_shadow, model)
              if settings.checkpoint_interval_shadow else None)
    if shadow is None and not isinstance(active, LearnedInterval):
        return active
    return RecordingInterval(active, shadow, errors, pending)


def _one_interval(setting: str, name: str, model: HazardModel | None) -> CheckpointIntervalPolicy:
    if name == LearnedInterval.name:
        return LearnedInterval(model)
    try:
        return load_interval_policy(name)
    except ValueError as exc:
        raise ValueError(f"{setting}: {exc}") from None
