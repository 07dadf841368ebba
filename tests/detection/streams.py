"""Crafted telemetry streams for detector tests: a real DetectionContext over a real Fleet, SampleStore,
JobTelemetry and FaultHistory, fed with wire objects (TaskTelemetry, AcceleratorSample) on a fake clock."""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

from sentinel.config import Settings
from sentinel.detection.base import DetectionContext, Detector, Evaluation
from sentinel.detection.catalog import FaultCatalog
from sentinel.diagnosis.components import ComponentStore
from sentinel.diagnosis.engine import Diagnoser
from sentinel.incidents.findings import Finding
from sentinel.live.checkpoints import CheckpointLedger
from sentinel.live.faults import Fault, FaultHistory
from sentinel.live.fleet import Fleet
from sentinel.live.jobs import JobTelemetry
from sentinel.live.samples import SampleStore
from sentinel.nodes.models import Node
from sentinel.sdk.buckets import bucket
from sentinel.serving.signals import ServingView
from sentinel.telemetry.schemas import AcceleratorSample, Assignment, TaskModel, TaskTelemetry
from sentinel.telemetry.serving import CanaryResult, ServingStats
from tests.conftest import FakeClock

GiB = 2**30
START = 1_800_000_000.0
LAYERS = {"hardware", "interconnect", "compute", "input_pipeline", "checkpoint_io", "host", "software"}


class World:
    """One small fleet and its telemetry; the test moves the clock and says what each node reports."""

    def __init__(self, options: dict[str, dict[str, float]] | None = None, window_samples: int = 60):
        self.clock = FakeClock(START)
        self.settings = Settings(detector_options=options or {})
        self.fleet = Fleet()
        self.samples = SampleStore(window_samples)
        self.jobs = JobTelemetry()
        self.history = FaultHistory()
        self.assignments: dict[int, list[Assignment]] = {}
        self.checkpoints = CheckpointLedger()
        self.components = ComponentStore()
        self.serving = ServingView()
        self.ctx = DetectionContext(settings=self.settings, clock=self.clock, fleet=self.fleet, samples=self.samples,
                                    jobs=self.jobs, catalog=FaultCatalog.load(),
                                    history=self.history, assignments=lambda: self.assignments,
                                    checkpoints=self.checkpoints, diagnosis=Diagnoser(self.components),
                                    serving=self.serving)
        self._last_step: dict[tuple[int, int], int] = {}
        self._last_token: dict[tuple[int, str], float] = {}
        self._frozen_since: dict[tuple[int, str], float] = {}

    @property
    def now(self) -> float:
        return self.clock.time()

    def advance(self, seconds: float) -> None:
        self.clock.advance(seconds)

    def add_node(self, name: str, accelerators: int = 8) -> list[str]:
        uuids = [f"GPU-{name}-{i}" for i in range(accelerators)]
        row = Node(id=len(self.fleet.all()) + 1, name=name, state="active", admin_state="active",
                   interval_seconds=10.0, last_seq=0, sources=["test"])
        self.fleet.apply(row, set(uuids), last_seen=self.now)
        return uuids

    def serve(self, node: str, job_id: int, rank: int, replica: str, *, frozen: bool = False,
              running: int = 4, failed: int = 0, reason: str = "error", canary: str | None = None,
              kv_seconds: float | None = None, kv_failures: int = 0, waiting: int | None = None,
              streaming: int | None = None) -> None:
        """One agent interval of a decode replica: 20 requests with 30 ms between tokens, or, frozen, its
        requests in flight and no token since it froze (a decode stuck mid-stream). `failed` of them end as
        `reason`; `canary`: the agent's canary finished this interval, "ok" or how it failed. With `kv_seconds`
        each request's first token (100 ms) includes a KV transfer that long (8 MiB); `kv_failures` failed.
        `streaming`: how many of those in flight are past their first token, where the source says."""
        key = (job_id, replica)
        if frozen:
            self._frozen_since.setdefault(key, self.now)
        else:
            self._frozen_since.pop(key, None)
            self._last_token[key] = self.now
        since = self._frozen_since.get(key)
        self.serving.add(node, job_id, rank, ServingStats(
            replica=replica, stage="decode", requests=0 if frozen else 20, running=running, waiting=waiting,
            failed={reason: failed} if failed else {},  # type: ignore[dict-item]
            canary=None if canary is None else CanaryResult(
                at=self.now - 0.5, ok=canary == "ok", reason=None if canary == "ok" else canary,  # type: ignore[arg-type]
                status=None if canary == "error" else 200, tokens=8 if canary == "ok" else 0, seconds=0.3,
                detail="finish_reason length" if canary == "ok" else f"canary {canary}"),
            histograms={} if frozen else {"itl": {bucket(0.03): 380}, **({} if kv_seconds is None else {
                "ttft": {bucket(0.1): 20}, "kv_transfer": {bucket(kv_seconds): 20}})},
            sums={} if frozen or kv_seconds is None else {"ttft": 2.0, "kv_transfer": 20 * kv_seconds},
            kv_transfer_bytes=0 if frozen or kv_seconds is None else 20 * 8 * 2**20, kv_transfer_failures=kv_failures,
            last_token_at=self._last_token.get(key), streaming=streaming,
            oldest_inflight_seconds=None if running == 0 else
            0.4 if since is None else self.now - since + 0.4), self.now)

    def place(self, job_id: int, rank: int, node: str, accelerators: list[str]) -> None:
        live = self.fleet.get(node)
        assert live is not None
        self.assignments.setdefault(live.id, []).append(
            Assignment(job_id=job_id, rank=rank, pid=1000 + rank, accelerators=accelerators))

    def sample(self, uuid: str, *, used_bytes: float = 20 * GiB, total_bytes: int = 80 * GiB,
               temperature: float = 60.0, power: float = 500.0, utilization: float = 0.9,
               throttle: tuple[str, ...] = (), clock_hz: float = 1.98e9) -> None:
        self.samples.add(self.now, [AcceleratorSample(
            uuid=uuid, utilization_ratio=utilization, memory_used_bytes=int(used_bytes),
            memory_total_bytes=total_bytes, power_watts=power, temperature_celsius=temperature,
            sm_clock_hz=clock_hz, throttle_reasons=list(throttle))])

    def steps(self, node: str, job_id: int, rank: int, step_seconds: list[float], *, tokens_per_step: int = 4096,
              collective_share: float = 0.2, attempt: int = 0, flops_per_token: float = 6e9,
              peak_flops: float | None = 1e14) -> None:
        """One agent interval of one rank: these steps, their tokens and their time in collectives."""
        last = self._last_step.get((job_id, rank), 0) + len(step_seconds)
        self._last_step[(job_id, rank)] = last
        busy = sum(step_seconds)
        self.jobs.add(node, [TaskTelemetry(
            job_id=job_id, rank=rank, attempt=attempt, pid=1000 + rank + 100 * attempt, steps=len(step_seconds),
            last_step=last, step_seconds=step_seconds, tokens=tokens_per_step * len(step_seconds),
            busy_seconds=busy, collective_seconds=collective_share * busy,
            model=TaskModel(flops_per_token=flops_per_token, peak_flops_per_accelerator=peak_flops))], self.now)

    def decomposed(self, node: str, job_id: int, rank: int, steps: int, *, compute: float, communication: float = 0.0,
                   data_wait: float = 0.0, checkpoint: float = 0.0, host: float = 0.0, idle: float = 0.0,
                   cpu_wait: float | None = None, tokens_per_step: int = 4096, attempt: int = 0) -> None:
        """One agent interval of one rank whose steps split as given (seconds per step): the SDK's decomposition
        (sentinel/diagnosis/components.py) as the agent relays it."""
        last = self._last_step.get((job_id, rank), 0) + steps
        self._last_step[(job_id, rank)] = last
        busy = compute + communication
        iteration = busy + data_wait + checkpoint + host + idle
        phases = {k: v * steps for k, v in (("data_wait", data_wait), ("checkpoint", checkpoint), ("host", host)) if v}
        task = TaskTelemetry(
            job_id=job_id, rank=rank, attempt=attempt, pid=1000 + rank + 100 * attempt, steps=steps, last_step=last,
            step_seconds=[busy] * steps, tokens=tokens_per_step * steps, busy_seconds=busy * steps,
            collective_seconds=communication * steps, exposed_collective_seconds=communication * steps,
            iterations=steps, iteration_seconds=iteration * steps, phases=phases, cpu_wait_ratio=cpu_wait)
        self.jobs.add(node, [task], self.now)
        self.components.add(node, [task], self.now)

    def fault(self, node: str, accelerator: str | None, *, days_ago: float = 0.0, kind: str = "xid",
              xid: int | None = 48, severity: str = "critical") -> None:
        self.history.add(Fault(self.now - days_ago * 86400, node, accelerator, kind, xid, severity))

    def evaluate(self, detector: Detector) -> Evaluation:
        """As the engine does: evaluate, then remember which conditions hold."""
        evaluation = detector.evaluate(self.ctx, self.now)
        detector.active = {f.fingerprint for f in evaluation.findings}
        return evaluation


def run(world: World, detector: Detector, seconds: float, tick: Callable[[float], None],
        interval: float = 10.0) -> list[tuple[float, Evaluation]]:
    """Every `interval`: advance the clock, let `tick(elapsed)` report, evaluate. Returns each evaluation."""
    out = []
    elapsed = 0.0
    while elapsed < seconds - 1e-9:
        world.advance(interval)
        elapsed += interval
        tick(elapsed)
        out.append((elapsed, world.evaluate(detector)))
    return out


def fired(evaluations: list[tuple[float, Evaluation]]) -> list[tuple[float, Finding]]:
    return [(at, f) for at, ev in evaluations for f in ev.findings]


def assert_dense(finding: Finding) -> None:
    """DESIGN §5: what was seen (with numbers), compared with what, which layer, what to check next."""
    assert finding.seen and any(ch.isdigit() for ch in finding.seen)
    assert finding.comparison
    assert finding.layer in LAYERS
    assert finding.next_steps and all(isinstance(s, str) and s for s in finding.next_steps)
    assert finding.observed_at is not None
    window: dict[str, Any] = finding.evidence["window"]
    assert window["metric"] and 0 < len(window["times"]) == len(window["values"]) <= 60
    assert all(t <= 0 for t in window["times"])
    assert len(json.dumps(finding.evidence)) < 20_000  # serialisable and compact
