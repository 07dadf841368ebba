"""Accelerator memory: near capacity now (an OOM is close), or growing steadily (likely a leak)."""

from __future__ import annotations

import statistics

from sentinel.detection.base import DetectionContext, Detector, Evaluation, register
from sentinel.detection.detectors._common import Placements, evidence_window, gib, minutes
from sentinel.incidents.findings import Finding, Subject
from sentinel.live.samples import RingWindow
from sentinel.telemetry.schemas import AcceleratorSample


@register
class MemoryDetector(Detector):
    """(a) Near capacity: memory used ≥ `capacity_ratio` of the total in each of the last
    `capacity_samples` samples: OOM risk. (b) Likely leak: over the accelerator's window (at least
    `min_samples` samples), a least-squares line of memory used rises with R² ≥ `r2`, by at least
    `min_growth_ratio` of capacity, and reaches capacity within `horizon_seconds` at that slope. A
    sawtooth (allocate, free, allocate) fits no line, so it is no leak. The rank placed on the
    accelerator, if any, is named. Accelerators whose newest sample is older than `stale_seconds` are
    not judged.

    Options (defaults): capacity_ratio 0.95, capacity_samples 6, min_samples 20, r2 0.8,
    min_growth_ratio 0.02, horizon_seconds 1800, stale_seconds 120. Layer: compute (capacity),
    software (leak).
    """

    name = "memory"
    periodic = True
    every = 10.0  # seconds between evaluations: its persist time is longer, and its cost grows with the fleet

    def evaluate(self, ctx: DetectionContext, now: float) -> Evaluation:
        stale = self.option("stale_seconds", 120.0)
        findings: list[Finding] = []
        subjects = 0
        places: Placements | None = None
        peers: dict[int, str] = {}  # job → its accelerators' memory, once per evaluation
        for uuid in ctx.samples.uuids():
            latest, ring = ctx.samples.latest(uuid), ctx.samples.window(uuid)
            if latest is None or ring is None or not ring.count or not latest[1].memory_total_bytes \
                    or now - latest[0] > stale:
                continue
            subjects += 1
            total = float(latest[1].memory_total_bytes)
            if not self._worth_a_look(ring, total):
                continue  # O(1) for most accelerators: neither full nor climbing
            window = ctx.samples.tail(uuid, ("time", "memory_used_bytes")) or {"time": [], "memory_used_bytes": []}
            times, used = window["time"], window["memory_used_bytes"]
            full = self._near_capacity(used, total)
            leak = self._leak(times, used, total)
            if full is None and leak is None:
                continue
            places = places or Placements.of(ctx)
            if full is not None:
                findings.append(self._capacity_finding(now, uuid, latest[1], times, used, full,
                                                       _subject(places, uuid), _job_peers(ctx, places, uuid, peers)))
            if leak is not None:
                findings.append(self._leak_finding(now, uuid, latest[1], times, used, leak,
                                                   _subject(places, uuid), _job_peers(ctx, places, uuid, peers)))
        return Evaluation(findings, subjects)

    def _worth_a_look(self, ring: RingWindow, total: float) -> bool:
        """Near capacity now, or up from the window's start by enough to fill it within twice the horizon."""
        newest = ring.at("memory_used_bytes", -1)
        if newest >= self.option("capacity_ratio", 0.95) * total:
            return True
        if ring.count < max(3, int(self.option("min_samples", 20))):
            return False
        growth = newest - ring.at("memory_used_bytes", 0)
        elapsed = ring.at("time", -1) - ring.at("time", 0)
        if growth < self.option("min_growth_ratio", 0.02) * total or elapsed <= 0:
            return False
        return (total - newest) / (growth / elapsed) < 2 * self.option("horizon_seconds", 1800.0)

    def _near_capacity(self, used: list[float], total: float) -> int | None:
        """How many newest samples in a row are at or above the threshold, if enough are."""
        threshold, needed = self.option("capacity_ratio", 0.95) * total, int(self.option("capacity_samples", 6))
        run = 0
        for value in reversed(used):
            if value < threshold:
                break
            run += 1
        return run if run >= max(1, needed) else None

    def _leak(self, times: list[float], used: list[float], total: float) -> tuple[float, float, float] | None:
        """(slope bytes/s, R², seconds to capacity) when memory climbs a straight line toward the top."""
        if len(used) < max(3, int(self.option("min_samples", 20))):
            return None
        if used[-1] - used[0] < self.option("min_growth_ratio", 0.02) * total:
            return None  # cheap pre-check: most accelerators stop here
        slope, r2 = _fit(times, used)
        if slope <= 0 or r2 < self.option("r2", 0.8):
            return None
        to_full = max(0.0, total - used[-1]) / slope
        return (slope, r2, to_full) if to_full < self.option("horizon_seconds", 1800.0) else None

    def _capacity_finding(self, now: float, uuid: str, sample: AcceleratorSample, times: list[float],
                          used: list[float], run: int, subject: tuple[Subject, str], peers: str) -> Finding:
        total = float(sample.memory_total_bytes)
        subject_, job_text = subject
        return Finding(
            detector=self.name, key=f"capacity|accelerator={uuid}", severity="warning",
            title=f"accelerator {uuid}: memory at {used[-1] / total:.0%} of capacity{job_text}",
            layer="compute", subject=subject_,
            seen=f"memory used {gib(used[-1])} of {gib(total)} ({used[-1] / total:.0%}); at or above "
                 f"{self.option('capacity_ratio', 0.95):.0%} in each of the last {run} samples "
                 f"({minutes(times[-1] - times[-run])}){job_text}",
            comparison=f"its own window: min {gib(min(used))}, max {gib(max(used))} over "
                       f"{minutes(times[-1] - times[0])}; {peers}",
            evidence={"window": evidence_window("memory_used_bytes", [t - now for t in times], used, 0),
                      "capacity_bytes": total, "peak_bytes": sample.memory_peak_bytes},
            next_steps=[
                f"See who holds it: `nvidia-smi --query-compute-apps=pid,used_memory --format=csv -i {uuid}`; "
                "in the job, `torch.cuda.memory_summary()` at the peak",
                "Make room: a smaller micro-batch, activation checkpointing, or "
                "`PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True` against fragmentation",
                "If the framework reserves memory up front by design (JAX preallocation, TensorFlow without "
                "allow_growth), full memory is expected: silence this for that job"],
            observed_at=times[-run])

    def _leak_finding(self, now: float, uuid: str, sample: AcceleratorSample, times: list[float],
                      used: list[float], leak: tuple[float, float, float], subject: tuple[Subject, str],
                      peers: str) -> Finding:
        slope, r2, to_full = leak
        total = float(sample.memory_total_bytes)
        subject_, job_text = subject
        return Finding(
            detector=self.name, key=f"leak|accelerator={uuid}", severity="warning",
            title=f"accelerator {uuid}: memory grows {gib(slope * 60)}/min, likely a leak{job_text}",
            layer="software", subject=subject_,
            seen=f"memory used rose {gib(used[0])} → {gib(used[-1])} over {minutes(times[-1] - times[0])} "
                 f"({gib(slope * 60)}/min, straight-line fit R² {r2:.2f}); at this rate it reaches "
                 f"{gib(total)} in {minutes(to_full)}{job_text}",
            comparison=f"a least-squares line over its own window of {len(used)} samples; {peers}",
            evidence={"window": evidence_window("memory_used_bytes", [t - now for t in times], used, 0),
                      "fit": {"slope_bytes_per_second": round(slope, 1), "r2": round(r2, 4),
                              "seconds_to_capacity": round(to_full, 1)},
                      "capacity_bytes": total},
            next_steps=[
                "Record the allocations in the job: `torch.cuda.memory._record_memory_history()` then "
                "`torch.cuda.memory._dump_snapshot()` a few minutes apart, and compare",
                "Usual causes: tensors kept across steps (a loss summed without `.item()`, metrics lists holding "
                "graphs), growing caches, a changing input shape recompiling kernels",
                f"See who holds it: `nvidia-smi --query-compute-apps=pid,used_memory --format=csv -i {uuid}`",
                f"Checkpoint before it fills (~{minutes(to_full)} at this rate): an OOM loses the work since the "
                "last checkpoint"],
            observed_at=times[0])


def _fit(times: list[float], values: list[float]) -> tuple[float, float]:
    """Least-squares slope and R² of values over times."""
    t0, v0 = times[0], values[0]
    ts = [t - t0 for t in times]
    vs = [v - v0 for v in values]  # shifted: the sums stay small and exact enough
    mean_t, mean_v = statistics.fmean(ts), statistics.fmean(vs)
    sxx = sum((t - mean_t) ** 2 for t in ts)
    syy = sum((v - mean_v) ** 2 for v in vs)
    sxy = sum((t - mean_t) * (v - mean_v) for t, v in zip(ts, vs, strict=True))
    if sxx <= 0 or syy <= 0:
        return 0.0, 0.0
    return sxy / sxx, sxy * sxy / (sxx * syy)


def _subject(places: Placements, uuid: str) -> tuple[Subject, str]:
    task = places.task_on.get(uuid)
    node = places.node_of.get(uuid)
    if task is None:
        return Subject(node=node, accelerator=uuid), ""
    return Subject(node=node, accelerator=uuid, job_id=task[0], rank=task[1]), f" (job {task[0]} rank {task[1]})"


def _job_peers(ctx: DetectionContext, places: Placements, uuid: str, cache: dict[int, str]) -> str:
    """The same job's accelerators now: one rank growing alone differs from all ranks growing. Once per
    job per evaluation, so many findings on one job stay linear."""
    task = places.task_on.get(uuid)
    if task is None:
        return "no job placed on it to compare with"
    if task[0] not in cache:
        used: list[int] = []
        for _, uuids in places.ranks_of.get(task[0], {}).values():
            used += [latest[1].memory_used_bytes for u in uuids if (latest := ctx.samples.latest(u)) is not None]
        cache[task[0]] = (f"job {task[0]}'s {len(used)} accelerators now: median {gib(statistics.median(used))}, "
                          f"max {gib(max(used))}" if used else f"job {task[0]} has no accelerators reporting")
    return cache[task[0]]
