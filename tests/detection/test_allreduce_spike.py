"""All-reduce share against the job's own baseline: the interconnect, and which ranks."""

from __future__ import annotations

import pytest

from tests.detection import scenarios
from tests.detection.streams import assert_dense, fired

SPIKE_AT = 35 * 60


def test_a_spike_fires_naming_the_ranks_whose_share_rose_most():
    _, detector, stream = scenarios.allreduce_spike()
    found = fired(stream)
    assert found
    first_at, finding = found[0]
    assert SPIKE_AT + 60 < first_at <= SPIKE_AT + 80  # persist 60 s
    assert finding.layer == "interconnect" and finding.subject.job_id == 3 and finding.key == "job=3"
    assert [r["rank"] for r in finding.evidence["ranks"]] == [1, 3]
    assert finding.evidence["baseline_share"] == pytest.approx(0.15)
    assert finding.evidence["recent_share"] > 0.25
    assert "vs 15% before" in finding.seen and "Rose most: rank 1 15% →" in finding.seen
    assert "rose least: rank 0" in finding.comparison or "rose least: rank 2" in finding.comparison
    assert any("all_reduce_perf" in step and "node-a" in step for step in finding.next_steps)
    _, last = found[-1]
    assert last.evidence["recent_share"] == pytest.approx((0.40 + 0.60 + 0.40 + 0.55) / 4)
    assert_dense(finding)
    assert detector.active == {"allreduce_spike|job=3"}


@pytest.mark.parametrize(("before", "after"), [
    (0.15, 0.22),  # +0.07: under the 0.10 absolute rise
    (0.40, 0.52),  # +0.12 but 1.3×: under the 1.5× ratio
])
def test_a_small_rise_is_nothing(before: float, after: float):
    _, _, stream = scenarios.allreduce_spike(before=before, after=dict.fromkeys(range(4), after))
    assert fired(stream) == []
    assert stream[-1][1].subjects == 1


def test_a_spike_shorter_than_persist_is_nothing():
    # one slow report stays in the 60 s window for a minute: that is still shorter than persist
    blip = dict.fromkeys(range(4), 0.7)
    _, _, stream = scenarios.allreduce_spike(after=blip, spike_for=10)
    assert fired(stream) == []
    _, _, stream = scenarios.allreduce_spike(after=blip, spike_for=10, options={"persist_seconds": 10})
    assert fired(stream), "control: the blip is seen, it is just too short"
