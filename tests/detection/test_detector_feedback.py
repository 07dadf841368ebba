"""Every statistical detector is registered, periodic, documents its options, and its findings carry
dense feedback (DESIGN §5): the numbers seen, a comparison, a layer, a bounded evidence window, next steps."""

from __future__ import annotations

from collections.abc import Callable

import pytest

from sentinel.detection.base import DETECTORS
from tests.detection import scenarios
from tests.detection.streams import assert_dense, fired

TRUE_POSITIVES: dict[str, Callable[[], scenarios.Outcome]] = {
    "straggler": scenarios.straggler,
    "mfu_drop": scenarios.mfu_drop,
    "allreduce_spike": scenarios.allreduce_spike,
    "throttle": scenarios.throttle,
    "memory": scenarios.leak,
    "lemon": scenarios.lemon,
    "checkpoint_stale": scenarios.checkpoint_stale,
}


@pytest.mark.parametrize("name", sorted(TRUE_POSITIVES))
def test_registered_periodic_and_documented(name: str):
    cls = DETECTORS[name]
    assert cls.periodic and cls.name == name
    assert cls.__doc__ and "Options (defaults)" in cls.__doc__


@pytest.mark.parametrize("name", sorted(TRUE_POSITIVES))
def test_findings_carry_comparison_evidence_and_next_steps(name: str):
    _, detector, stream = TRUE_POSITIVES[name]()
    found = fired(stream)
    assert found, f"{name}: its true-positive stream fires"
    for _, finding in found:
        assert finding.detector == name
        assert_dense(finding)
    # what the engine keys incidents on: stable across evaluations of the same condition
    assert len({f.fingerprint for _, f in found}) == 1
    assert detector.active == {found[-1][1].fingerprint}
    assert stream[-1][1].subjects >= 1
