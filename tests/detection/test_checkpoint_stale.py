"""checkpoint_stale: a job that keeps stepping but stopped committing checkpoints, named with the ranks
whose shards are missing; not a job that stopped, nor one whose commits resumed."""

from __future__ import annotations

from tests.detection import scenarios
from tests.detection.streams import fired


def test_stopped_commits_while_stepping_open_one_finding_naming_the_missing_rank():
    _, _, stream = scenarios.checkpoint_stale(stop_at=300.0)
    found = fired(stream)
    assert found, "commits stopped at 240 s (usual every 60 s, limit 3× = 180 s, floor 120 s)"
    first_at, finding = found[0]
    assert 240 + 180 < first_at <= 240 + 180 + 10
    assert finding.layer == "checkpoint_io" and finding.subject.job_id == 1
    assert "missing: rank(s) 1" in finding.seen and "last committed step 240" in finding.seen
    assert "every 60 s" in finding.comparison
    assert any("recomputed" in step for step in finding.next_steps)


def test_commits_on_time_or_a_job_that_stopped_stepping_are_quiet():
    assert not fired(scenarios.checkpoint_stale(stop_at=10_000.0)[2])
    stopped = scenarios.checkpoint_stale(stop_at=300.0, stepping=lambda t: t < 300)[2]
    assert not fired(stopped), "a job that stopped is the hang or heartbeat detector's"


def test_the_condition_clears_when_commits_resume():
    _, detector, stream = scenarios.checkpoint_stale(stop_at=300.0, resume_at=600.0)
    found = fired(stream)
    assert found and max(at for at, _ in found) < 600
    assert detector.active == set(), "the incident auto-resolves after its hysteresis"
