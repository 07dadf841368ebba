"""The modelled cluster a fault trace is replayed onto: what runs on it, and the scenario's knobs that are
not Sentinel's measurements (the baseline's timeout and interval, job sizes, state size, serving load)."""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np

CAUSES = ("detection_restart", "waiting_for_node", "restore", "recompute", "checkpoint_stall", "planned_migration")


@dataclass(frozen=True)
class Scenario:
    training_nodes: tuple[int, ...] = (128, 64, 64, 32)  # one job per entry; 128 nodes × 8 = 1,024 accelerators
    serving_replicas: tuple[int, ...] = (16, 8)  # one serving job per entry, a replica per node
    accelerators_per_node: int = 8
    state_gib_per_node: float = 8.0  # checkpointed state per node (a 70B model with Adam on 128 nodes ≈ 7.7)
    weights_gib_per_node: float = 4.0  # what a serving replica loads
    baseline_timeout_seconds: float = 600.0  # no Sentinel: the collective (NCCL watchdog) timeout notices
    baseline_interval_seconds: float = 1800.0  # no Sentinel: a fixed checkpoint interval
    serving_health_timeout_seconds: float = 30.0  # no Sentinel: the load balancer's health check notices
    serving_peak_utilization: float = 0.7  # the diurnal peak as a share of the replicas' capacity at SLO
    spikes_per_week: float = 2.0
    spike_factor: float = 3.0
    spike_minutes: float = 20.0
    client_timeout_minutes: float = 10.0  # a queued request its client has not abandoned yet (overload, no shedding)
    breaker_share: float = 0.10  # Sentinel's breaker: take-outs per hour as a share of the nodes
    lemon_faults: int = 5  # Sentinel's lemon detector: node faults within the window retire a node
    lemon_window_days: float = 7.0
    seed: int = 1

    def validate(self, nodes: int) -> None:
        need = sum(self.training_nodes) + sum(self.serving_replicas)
        if not self.training_nodes and not self.serving_replicas:
            raise ValueError("the scenario runs nothing: give training jobs or serving replicas")
        if any(n < 1 for n in self.training_nodes + self.serving_replicas):
            raise ValueError("every training job and serving job needs at least one node")
        if need > nodes:
            raise ValueError(f"the scenario needs {need} nodes, the cluster has {nodes}")


@dataclass
class Load:
    """A serving job's request rate per minute (1.0 = the diurnal mean) with its spikes."""

    rate: np.ndarray
    spikes: list[tuple[float, float]] = field(default_factory=list)  # (start, end) seconds


def serving_load(start: float, minutes: int, scenario: Scenario, rng: np.random.Generator) -> Load:
    t = start + 60.0 * np.arange(minutes)
    rate = 1.0 + 0.3 * np.sin(2 * math.pi * (t / 86400.0 - 0.25))
    spikes = []
    n = rng.poisson(scenario.spikes_per_week * minutes / (7 * 1440))
    for at in np.sort(rng.uniform(0, minutes, size=n)):
        a, b = int(at), int(min(minutes, at + scenario.spike_minutes))
        rate[a:b] *= scenario.spike_factor
        spikes.append((start + 60.0 * a, start + 60.0 * b))
    return Load(rate=rate, spikes=spikes)


def within_slo(rate: np.ndarray, capacity: np.ndarray, degradation: str, timeout_minutes: float) -> np.ndarray:
    """Per minute, the requests served within SLO, given the demand and the capacity at SLO (both per minute).

    `shed` (admission control): what is over capacity is refused at once and counts as missed; the rest meet the
    SLO. `queue` (no admission control, an engine's default): what is over capacity waits, first in first out;
    while a backlog is left at the end of a minute nothing that minute met its TTFT target, and the backlog
    drains only as fast as capacity exceeds demand. Clients give up after `timeout_minutes` (the backlog is
    capped at that many minutes of capacity)."""
    capacity = np.maximum(capacity, 0.0)
    if degradation == "shed":
        return np.minimum(rate, capacity)
    if degradation != "queue":
        raise ValueError(f"unknown serving degradation {degradation!r}: shed or queue")
    out = np.zeros_like(rate)
    backlog = 0.0
    for t, (demand, cap) in enumerate(zip(rate.tolist(), capacity.tolist(), strict=True)):
        if backlog + demand <= cap:
            out[t], backlog = demand, 0.0
        else:
            backlog = min(backlog + demand - cap, cap * timeout_minutes)
    return out


def covered(intervals: list[tuple[float, float, float]], start: float, minutes: int) -> np.ndarray:
    """Per minute from `start`, the sum of weight × the share of the minute each (a, b, weight) covers."""
    out = np.zeros(minutes + 1)
    edge = np.zeros(minutes + 2)
    for a, b, w in intervals:
        a, b = max(a, start), min(b, start + 60.0 * minutes)
        if b <= a:
            continue
        i, j = (a - start) / 60.0, (b - start) / 60.0
        ia, ib = int(i), int(j)
        if ia == ib:
            out[ia] += w * (j - i)
            continue
        out[ia] += w * (ia + 1 - i)
        out[ib] += w * (j - ib)
        edge[ia + 1] += w
        edge[ib] -= w
    return (out + np.cumsum(edge)[: minutes + 1])[:minutes]


@dataclass
class TrainingJob:
    index: int
    size: int
    nodes: set[str] = field(default_factory=set)
    running: bool = False
    run_start: float = 0.0
    ready_at: float | None = None
    waiting_since: float | None = None
    plan: list[tuple[str, float]] = field(default_factory=list)  # recovery steps (cause, seconds)
    plan_start: float = 0.0
    interval: float = 1800.0
    stall: float = 0.0
    productive: float = 0.0
    lost: dict[str, float] = field(default_factory=lambda: dict.fromkeys(CAUSES, 0.0))
    interruptions: int = 0  # by faults
    attempt: int = 0  # every restart, planned or not: a ready event for an older one is stale
    kind: str = "other"
    warm: bool = True


@dataclass
class ServingJob:
    index: int
    replicas: int
    nodes: list[str | None] = field(default_factory=list)
    down: list[tuple[float, float, float]] = field(default_factory=list)  # (from, to, replicas)
    extra: list[tuple[float, float, float]] = field(default_factory=list)  # scale-out replicas
    pending: list[float] = field(default_factory=list)  # replicas waiting for a node, since when
    failed_over: int = 0
