"""Straggler ranks: one rank persistently slower than its peers holds the whole job back."""

from __future__ import annotations

import statistics
from typing import TYPE_CHECKING, Any

from sentinel.detection.base import DetectionContext, Detector, Evaluation, register
from sentinel.detection.detectors._common import Onsets, Placements, evidence_window
from sentinel.incidents.findings import Finding, Subject
from sentinel.live.jobs import JobStats
from sentinel.live.samples import throttle_flags

if TYPE_CHECKING:
    from sentinel.config import Settings

MAD_TO_SIGMA = 1.4826  # MAD × this estimates the standard deviation of normal data


@register
class StragglerDetector(Detector):
    """A rank whose step time stays above its job's median by a robust margin.

    Per rank: the median of its newest `steps` post-warm-up step times received in the last
    `window_seconds`; a rank with fewer than `min_steps` is not judged, nor is a job with fewer than two
    judged ranks. Over the ranks' medians: the job median and the MAD (lower medians, so with two ranks
    the faster is the reference). A straggler's median exceeds both job median × (1 + `margin`) and job
    median + `k` × 1.4826 × MAD, for `persist_seconds` without a break. A uniform slowdown moves the
    job median too, so it is not a straggler; one slow step does not move a median.

    Options (defaults): min_steps 20, steps 50, window_seconds 300, margin 0.2, k 3, persist_seconds 30.
    Layer: compute, or hardware when the rank's accelerator reports thermal/power throttling.
    """

    name = "straggler"
    periodic = True
    every = 10.0  # seconds between evaluations: its persist time is longer, and its cost grows with the fleet

    def __init__(self, settings: Settings):
        super().__init__(settings)
        self.onsets = Onsets()

    def evaluate(self, ctx: DetectionContext, now: float) -> Evaluation:
        min_steps = max(1, int(self.option("min_steps", 20)))
        last = max(min_steps, int(self.option("steps", 50)))
        since = now - self.option("window_seconds", 300.0)
        margin, k, persist = self.option("margin", 0.2), self.option("k", 3.0), self.option("persist_seconds", 30.0)
        findings: list[Finding] = []
        subjects = 0
        places: Placements | None = None
        for stats in ctx.jobs.snapshot():
            steps = ctx.jobs.recent_steps(stats.job_id, since, last)
            medians = {rank: statistics.median(s for _, s in xs) for rank, xs in steps.items() if len(xs) >= min_steps}
            if len(medians) < 2:
                continue
            subjects += len(medians)
            job_median = statistics.median_low(medians.values())
            if job_median <= 0:
                continue
            mad = statistics.median_low(abs(m - job_median) for m in medians.values())
            limit = max(job_median * (1 + margin), job_median + k * MAD_TO_SIGMA * mad)
            peers = ""  # described once per job, so many stragglers in one job stay linear
            for rank, median in medians.items():
                if median <= limit:
                    continue
                onset = self.onsets.hold(f"job={stats.job_id}|rank={rank}", now)
                if now - onset < persist:
                    continue
                places = places or Placements.of(ctx)
                peers = peers or _describe_peers(medians, job_median, mad)
                findings.append(self._finding(ctx, places, now, onset, stats, rank, steps[rank], medians[rank],
                                              (job_median, mad, limit), peers))
        self.onsets.sweep()
        return Evaluation(findings, subjects)

    def _finding(self, ctx: DetectionContext, places: Placements, now: float, onset: float, stats: JobStats,
                 rank: int, steps: list[tuple[float, float]], median: float,
                 reference: tuple[float, float, float], peers: str) -> Finding:
        job_median, mad, limit = reference
        node, uuids = places.rank(stats.job_id, rank)
        known = stats.ranks.get(rank)
        node = node or (known.node if known else None) or None
        devices = [_device_state(ctx, uuid) for uuid in uuids]
        throttled = [d for d in devices if d.get("throttled")]
        worst = max(devices, key=lambda d: (bool(d.get("throttled")), d.get("temperature_celsius") or 0.0),
                    default=None)
        accelerator = worst["uuid"] if worst else None
        device_text = "; ".join(_describe(d) for d in devices) or "no placement known for this rank"
        return Finding(
            detector=self.name, key=f"job={stats.job_id}|rank={rank}", severity="warning",
            title=f"job {stats.job_id} rank {rank} is a straggler: median step {median:.3f} s vs job "
                  f"{job_median:.3f} s",
            layer="hardware" if throttled else "compute",
            subject=Subject(node=node, accelerator=accelerator, job_id=stats.job_id, rank=rank),
            seen=f"rank {rank}'s median step time over its last {len(steps)} steps is {median:.3f} s, "
                 f"{median / job_median - 1:.0%} above the job median {job_median:.3f} s (limit {limit:.3f} s), "
                 f"for {now - onset:.0f} s. Accelerator: {device_text}.",
            comparison=peers,
            evidence={"window": evidence_window("step_seconds", [at - now for at, _ in steps],
                                                [s for _, s in steps]),
                      "peers": {"job_median_seconds": round(job_median, 6), "mad_seconds": round(mad, 6),
                                "limit_seconds": round(limit, 6)},
                      "accelerators": devices},
            next_steps=_next_steps(rank, node, uuids, bool(throttled)),
            # statistical evidence: probe the accelerator before acting on it (DESIGN §4)
            action="probe" if accelerator else "record", observed_at=onset)


def _describe_peers(medians: dict[int, float], job_median: float, mad: float) -> str:
    ordered = sorted(medians.items(), key=lambda kv: kv[1])
    slowest = ", ".join(f"rank {r} {m:.3f} s" for r, m in ordered[::-1][:5])
    return (f"peer ranks' median step times over {len(ordered)} ranks: min {ordered[0][1]:.3f} s, median "
            f"{job_median:.3f} s, max {ordered[-1][1]:.3f} s, MAD {mad:.3f} s; slowest: {slowest}")


def _device_state(ctx: DetectionContext, uuid: str) -> dict[str, Any]:
    latest = ctx.samples.latest(uuid)
    if latest is None:
        return {"uuid": uuid}
    at, sample = latest
    return {"uuid": uuid, "sampled_at": at, "utilization_ratio": sample.utilization_ratio,
            "temperature_celsius": sample.temperature_celsius, "power_watts": sample.power_watts,
            "sm_clock_hz": sample.sm_clock_hz, "throttle_reasons": list(sample.throttle_reasons),
            "throttled": throttle_flags(sample.throttle_reasons) > 0}


def _describe(device: dict[str, Any]) -> str:
    parts = [device["uuid"]]
    if "utilization_ratio" in device:
        parts.append(f"utilization {device['utilization_ratio']:.0%}")
    if device.get("temperature_celsius") is not None:
        parts.append(f"{device['temperature_celsius']:.0f} °C")
    if device.get("sm_clock_hz"):
        parts.append(f"SM clock {device['sm_clock_hz'] / 1e9:.2f} GHz")
    if device.get("throttle_reasons"):
        parts.append("throttle: " + ",".join(device["throttle_reasons"]))
    return " ".join(parts[:1]) + (": " + ", ".join(parts[1:]) if len(parts) > 1 else "")


def _next_steps(rank: int, node: str | None, uuids: list[str], throttled: bool) -> list[str]:
    where = f" on {node}" if node else ""
    target = f" -i {uuids[0]}" if uuids else ""
    steps = [f"Compare rank {rank}'s accelerator with its neighbours{where}: "
             f"`nvidia-smi -q -d PERFORMANCE,CLOCK,TEMPERATURE{target}` (clocks, throttle reasons)"]
    if throttled:
        steps.append("It is throttling: check airflow, fans and inlet temperature, and the enforced power limit "
                     "(`nvidia-smi -q -d POWER`); see the throttle incident for its window")
    steps += [f"Look for other work sharing it{where}: `nvidia-smi --query-compute-apps=pid,used_memory "
              "--format=csv`, CPU contention in `top`, the rank's data loader workers",
              f"Check rank {rank}'s input shard and host: a rank waiting on its data loader or a slow local disk "
              "steps slower too",
              "If it persists, probe the accelerator with a short GEMM benchmark and restart the rank on a spare"]
    return steps
