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


def test_a_replacement_that_keeps_the_name_speaks_for_the_rank_once_the_order_is_done() -> None:
    """A launcher may start the replacement under the old name (the dashboards' test does: "d0" on another
    node). The order done retires the old process's window, not the name: the replacement's reports count, the
    old one's late report does not (CI once saw every later report of the replacement ignored)."""
    view = ServingView()
    view.add("node-a", 2, 0, frozen("d0", 100.0), now=100.0, pid=11)
    view.add("node-b", 2, 0, ServingStats(replica="d0", stage="decode", requests=5, running=1,
                                          last_token_at=100.9), now=101.0, pid=22)
    assert [(r.replica, r.node, r.pid) for r in view.replicas(2, 101.0)] == [("d0", "node-b", 22)]
    assert view.replaced(2, [0], before=100.5) == [], "the replacement was first heard after the order: kept"
    view.add("node-a", 2, 0, frozen("d0", 101.2), now=101.2, pid=11)  # the old process's report, arriving late
    view.add("node-b", 2, 0, ServingStats(replica="d0", stage="decode", requests=7, running=2,
                                          last_token_at=101.9), now=102.0, pid=22)
    [replica] = view.replicas(2, 102.0)
    assert (replica.node, replica.pid, replica.running, replica.requests_total) == ("node-b", 22, 2, 12)


def test_an_order_done_retires_the_replaced_process_even_on_another_node() -> None:
    view = ServingView()
    view.add("node-a", 3, 0, frozen("d0", 100.0), now=100.0, pid=11)
    assert view.replaced(3, [0], before=100.5) == ["d0"]
    view.add("node-a", 3, 0, frozen("d0", 100.8), now=100.8, pid=11)  # late: dropped
    assert view.replicas(3, 100.8) == []
    view.add("node-b", 3, 0, ServingStats(replica="d0", stage="decode", requests=3), now=101.0, pid=33)
    assert [(r.node, r.requests_total) for r in view.replicas(3, 101.0)] == [("node-b", 3)]
