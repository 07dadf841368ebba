"""The agent's event folding (collectors/dedup.py) and recent-fault gauges (collectors/recent.py)."""

from __future__ import annotations

from collectors.dedup import EventFolder
from collectors.recent import RecentFaults
from sentinel.telemetry.schemas import HardwareEvent


def event(at: float, xid: int = 95, uuid: str = "GPU-0", kind: str = "xid") -> HardwareEvent:
    return HardwareEvent(kind=kind, accelerator_uuid=uuid, xid=xid if kind == "xid" else None, observed_at=at)


def test_the_first_event_goes_at_once_and_its_repeats_are_one_counted_event() -> None:
    folder = EventFolder(window_seconds=60)
    assert folder.offer(event(100.0)) is not None
    assert all(folder.offer(event(100.0 + i / 10)) is None for i in range(1, 1000))
    assert folder.offer(event(100.5, xid=48)) is not None, "another XID is another event"
    assert folder.offer(event(100.5, uuid="GPU-1")) is not None, "another accelerator too"
    [folded] = folder.flush(101.0)
    assert folded.count == 999 and folded.xid == 95
    assert folded.observed_at == 100.1 and folded.last_observed_at == 199.9
    assert folder.folded_total == 999 and folder.flush(102.0) == []


def test_a_quiet_window_ends_the_fold_and_clear_starts_afresh() -> None:
    folder = EventFolder(window_seconds=60)
    folder.offer(event(0.0))
    assert folder.offer(event(30.0)) is None
    folder.flush(31.0)
    assert folder.offer(event(100.0)) is not None, "quiet for more than the window: pushed at once again"
    assert folder.offer(event(101.0, kind="clear")) is not None
    assert folder.offer(event(102.0)) is not None, "cleared: the next one is news"
    assert folder.offer(event(102.0, kind="probe")) is not None


def test_fault_gauges_clear_on_release_and_after_a_quiet_window_but_offline_holds() -> None:
    recent = RecentFaults(window_seconds=300)
    recent.seen(event(0.0))
    recent.seen(event(0.0, uuid="GPU-1", kind="offline"))
    assert recent.snapshot(10.0) == {"GPU-0": {("xid", "95"): True}, "GPU-1": {("offline", ""): True}}
    assert recent.health("GPU-0", 10.0) == "degraded" and recent.health("GPU-1", 10.0) == "offline"
    assert recent.snapshot(301.0)["GPU-0"] == {("xid", "95"): False}, "quiet for the window: 0, not gone"
    assert recent.health("GPU-0", 301.0) == "healthy" and recent.health("GPU-1", 10_000.0) == "offline"
    recent.clear("GPU-1")  # the server released it
    assert recent.snapshot(10_001.0)["GPU-1"] == {("offline", ""): False}
    recent.seen(event(20_000.0))
    recent.seen(event(20_001.0, kind="clear"))
    assert recent.health("GPU-0", 20_002.0) == "healthy"
