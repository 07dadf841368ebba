"""The bad-completion detector on a live ServingView: a replica whose canary comes back empty, truncated or
stalled is found at the first such canary; one the canary cannot reach only when two in a row say so; one whose
own requests end empty is found from the SDK's counts; a healthy replica is never named; the incident clears."""

from __future__ import annotations

import pytest

from sentinel.detection.detectors.bad_completion import BadCompletion
from tests.detection import scenarios
from tests.detection.streams import World, assert_dense, fired, run


@pytest.mark.parametrize("reason, words", [("empty", "answers HTTP 200 with no token"),
                                           ("truncated", "ends its streams before their end"),
                                           ("timeout", "stops streaming mid-answer")])
def test_a_bad_answer_to_the_canary_is_found_at_the_first_one(reason: str, words: str) -> None:
    _, _, stream = scenarios.bad_completion(canary=reason)
    found = fired(stream)
    assert found and found[0][0] == 60.0, "the first bad canary came with the report of 60 s"
    assert {f.key for _, f in found} == {"job=9|replica=d1"}, "the healthy replica d0 is never named"
    first = found[0][1]
    assert (first.subject.job_id, first.subject.rank) == (9, 1)
    assert first.title == f"serving job 9: decode replica d1 {words}"
    assert f"canary {reason}" in first.seen and "last good canary" in first.comparison
    assert first.evidence["reason"] == reason and first.evidence["canary"]["ok"] is False
    assert first.action == "restart_task" and first.layer == "software"
    assert_dense(first)
    assert first.evidence["window"]["values"][-1] == 0.0 and 1.0 in first.evidence["window"]["values"]


def test_a_canary_that_gets_no_answer_counts_only_when_confirmed() -> None:
    _, _, stream = scenarios.bad_completion(canary="error")
    found = fired(stream)
    assert found and found[0][0] == 70.0, "one unanswered canary is a blip; the second in a row is a finding"
    assert "does not answer the canary" in found[0][1].title


def test_requests_that_end_empty_are_found_from_the_sdks_counts() -> None:
    world = World()
    world.add_node("node-s", accelerators=1)
    detector = BadCompletion(world.settings)

    def tick(t: float) -> None:
        world.serve("node-s", 9, 0, "d0", running=1, failed=2 if t >= 40 else 0, reason="empty")

    found = fired(run(world, detector, 80.0, tick))
    # 2 empty at 40 s: under min_count 3; 4 of 100 at 50 s: under min_share 5%; 6 of 120 at 60 s: found
    assert found and found[0][0] == 60.0
    assert "6 empty of its 120 requests in the last 60 s" in found[0][1].seen
    assert found[0][1].evidence["canary"] is None


def test_a_few_bad_answers_among_many_are_under_the_share() -> None:
    world = World({"bad_completion": {"min_share": 0.5}})
    world.add_node("node-s", accelerators=1)
    detector = BadCompletion(world.settings)
    found = fired(run(world, detector, 60.0, lambda t: world.serve("node-s", 9, 0, "d0", failed=3, reason="empty")))
    assert found == [], "3 of 20 per interval is under a share of 0.5"


def test_the_condition_clears_when_the_canary_is_good_again() -> None:
    _, detector, stream = scenarios.bad_completion(fixed_at=100.0, seconds=150.0)
    assert fired(stream) and stream[-1][1].findings == [] and detector.active == set()
