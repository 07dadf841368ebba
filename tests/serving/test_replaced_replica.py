"""A replica replaced on its rank stops speaking for it: its window is dropped when the replacement first
reports, and a report of the old one still on its way (its agent sent it before the stop, it arrived after)
does not take the rank back. CI once saw that late frozen report open a second stall incident and replace the
healthy replacement."""

from __future__ import annotations

from sentinel.serving.signals import ServingView
from sentinel.telemetry.serving import ServingStats


def frozen(replica: str, now: float) -> ServingStats:
    return ServingStats(replica=replica, stage="decode", running=8, last_token_at=now - 6.0,
                        oldest_inflight_seconds=6.0)


def test_a_late_report_of_a_replaced_replica_is_not_the_rank_s() -> None:
    view = ServingView()
    view.add("node-1", 1, 1, frozen("r1", 100.0), now=100.0)
    view.add("node-1", 1, 1, ServingStats(replica="r1.a1", stage="decode", running=2, last_token_at=100.9),
             now=101.0)
    assert [r.replica for r in view.replicas(1, 101.0)] == ["r1.a1"], "the replacement speaks for rank 1"
    view.add("node-1", 1, 1, frozen("r1", 101.5), now=101.5)  # the old one's last report, arriving late
    assert [(r.replica, r.running) for r in view.replicas(1, 101.5)] == [("r1.a1", 2)]
    view.add("node-1", 1, 0, ServingStats(replica="r0", stage="decode", running=1), now=102.0)
    assert [r.replica for r in view.replicas(1, 102.0)] == ["r0", "r1.a1"], "other ranks are untouched"
