"""The interconnect detectors' streams for the Detector contract (tests/contracts/test_detector_contract.py):
a probe mesh with one (or two) slow links, and RDMA ports whose symbol errors grow. Each can clear."""

from __future__ import annotations

from collections.abc import Callable

from sentinel.detection.detectors.interconnect import NicRulesDetector, ProbeMeshDetector
from sentinel.network.view import NetworkView
from sentinel.telemetry.schemas import NicPort, ProbeResult
from tests.detection.scenarios import Outcome
from tests.detection.streams import World, run

FAST, SLOW = 0.0003, 0.03


def _mesh_world(nodes: int) -> tuple[World, NetworkView, list[str]]:
    world = World()
    net = world.ctx.network = NetworkView.from_settings(world.settings)
    names = [f"node-{i}" for i in range(nodes)]
    for i, name in enumerate(names):
        net.registered(name, {"probe_addr": f"10.0.0.{i + 1}:9482"})
    return world, net, names


def slow_links(links: tuple[tuple[int, int], ...] = ((1, 2),), nodes: int = 6, seconds: float = 60.0,
               until: Callable[[float], bool] = lambda t: True) -> Outcome:
    """Every node probes every other each 10 s (10 probes, no loss); the pairs in `links` answer in 30 ms
    instead of 0.3 ms while `until(t)`."""
    world, net, names = _mesh_world(nodes)
    slow = {frozenset((names[a], names[b])) for a, b in links}

    def tick(t: float) -> None:
        for src in names:
            results = [ProbeResult(target=dst, sent=10, received=10,
                                   rtt_p50_seconds=SLOW if frozenset((src, dst)) in slow and until(t) else FAST,
                                   rtt_p99_seconds=0.04, rtt_max_seconds=0.05, started_at=world.now - 10,
                                   ended_at=world.now) for dst in names if dst != src]
            net.reported(src, results, [], world.now)

    return _run(world, ProbeMeshDetector(world.settings), seconds, tick)


def _run(world: World, detector: ProbeMeshDetector | NicRulesDetector, seconds: float,
         tick: Callable[[float], None]) -> Outcome:
    return world, detector, run(world, detector, seconds, tick)


def symbol_errors(nodes: tuple[str, ...] = ("node-x",), seconds: float = 120.0,
                  growing: Callable[[float], bool] = lambda t: True) -> Outcome:
    """One EDR port per node; its symbol_error counter grows by 50 every 10 s while `growing(t)`."""
    world = World()
    net = world.ctx.network = NetworkView.from_settings(world.settings)
    errors = dict.fromkeys(nodes, 0)

    def tick(t: float) -> None:
        for node in nodes:
            if growing(t):
                errors[node] += 50
            port = NicPort(device="mlx5_0", port=1, state="ACTIVE", state_id=4, phys_state="LinkUp", phys_state_id=5,
                           rate_bytes_per_second=12.5e9, link_layer="InfiniBand",
                           counters={"symbol_error": errors[node], "port_xmit_data": int(t) * 10**9})
            net.reported(node, [], [port], world.now)

    return _run(world, NicRulesDetector(world.settings), seconds, tick)
