"""Lemon accelerators and nodes from the fault history."""

from __future__ import annotations

from tests.detection import scenarios
from tests.detection.streams import World, assert_dense


def test_three_fault_episodes_in_a_week_make_a_lemon_to_quarantine():
    world, _, stream = scenarios.lemon()
    findings = stream[0][1].findings
    assert [f.key for f in findings] == ["accelerator=GPU-node-1-3"]
    finding = findings[0]
    assert finding.subject.accelerator == "GPU-node-1-3" and finding.subject.node == "node-1"
    assert finding.action == "quarantine" and finding.layer == "hardware" and finding.severity == "warning"
    assert "3 separate hardware fault episodes in 7 days" in finding.seen
    assert "XID 48 ×2" in finding.seen and "ecc ×1" in finding.seen
    # the fleet: 4 episodes over 32 accelerators
    assert "4 episodes over 32 accelerators, 0.125 per accelerator" in finding.comparison
    assert "(24× the fleet rate)" in finding.comparison
    assert any("dcgmi diag -r 3" in step for step in finding.next_steps)
    assert any("RMA" in step for step in finding.next_steps)
    assert finding.observed_at == world.now - 86400
    assert_dense(finding)
    assert stream[0][1].subjects == 32 + 4


def test_a_burst_of_repeats_is_one_episode_and_application_xids_do_not_count():
    world = World()
    world.add_node("node-0")
    for minute in range(6):
        world.fault("node-0", "GPU-node-0-1", days_ago=2 + minute / 1440, xid=79)
    for day in range(5):
        world.fault("node-0", "GPU-node-0-2", days_ago=day, xid=13, severity="warning")
        world.fault("node-0", "GPU-node-0-4", days_ago=day, kind="thermal", xid=None, severity="info")
    assert world.evaluate(scenarios.LemonDetector(world.settings)).findings == []


def test_faults_older_than_the_window_are_forgotten():
    world = World()
    world.add_node("node-0")
    for days in (9, 8, 1):
        world.fault("node-0", "GPU-node-0-1", days_ago=days)
    assert world.evaluate(scenarios.LemonDetector(world.settings)).findings == []


def test_faults_spread_over_a_node_make_the_node_a_lemon():
    world = World()
    world.add_node("node-0")
    world.add_node("node-1")
    for i in range(4):
        world.fault("node-0", f"GPU-node-0-{i}", days_ago=i + 0.5)
    world.fault("node-0", None, days_ago=6, kind="offline", xid=None)
    findings = world.evaluate(scenarios.LemonDetector(world.settings)).findings
    assert [f.key for f in findings] == ["node=node-0"]
    assert findings[0].subject.node == "node-0" and findings[0].subject.accelerator is None
    assert "5 episodes over 2 nodes, 2.50 per node" in findings[0].comparison
    assert any("/nodes/node-0/cordon" in step for step in findings[0].next_steps)


def test_the_count_is_refreshed_at_most_every_check_seconds():
    world = World()
    world.add_node("node-0")
    detector = scenarios.LemonDetector(world.settings)
    assert world.evaluate(detector).findings == []
    for days in (3, 2, 1):
        world.fault("node-0", "GPU-node-0-1", days_ago=days)
    world.advance(30)
    assert world.evaluate(detector).findings == []
    world.advance(30)
    assert len(world.evaluate(detector).findings) == 1
