"""MFU drop: a job doing less useful work per second than it did a little while ago."""

from __future__ import annotations

import math
from typing import TYPE_CHECKING

from sentinel.detection.base import DetectionContext, Detector, Evaluation, register
from sentinel.detection.detectors._common import JobBaseline, Onsets, Placements, minutes
from sentinel.incidents.findings import Finding, Subject
from sentinel.live.jobs import WindowRates
from sentinel.live.samples import throttle_flags

if TYPE_CHECKING:
    from sentinel.config import Settings

THROUGHPUT = "tokens_per_second_per_rank"  # compared instead of MFU while the job's peak is unknown


@register
class MfuDropDetector(Detector):
    """A job's MFU over the last `recent_seconds` below its own baseline by `margin` (relative).

    The baseline is the median of points taken every `sample_seconds` over the previous
    `baseline_seconds`, past warm-up; it needs `min_history_seconds` of them, steady (their MAD at most
    `max_spread` of the median: a job that changed pace inside its baseline has no baseline yet). Points
    taken while a drop holds stay out of it, so a drop lasting longer than the baseline window becomes
    the new normal. Without a known peak the job's tokens/s per rank stands in for MFU (same ratio).
    Trips after `persist_seconds` without a break (a dip stays in the window for up to `recent_seconds`,
    so keep persist_seconds at least that long).

    Options (defaults): recent_seconds 60, baseline_seconds 1800, min_history_seconds 300,
    sample_seconds 30, margin 0.2, max_spread 0.1, persist_seconds 60, share_rise 0.05, tokens_drop 0.1.
    Layer: interconnect when the all-reduce share rose by `share_rise`; input_pipeline when tokens per
    step fell by `tokens_drop`; hardware when the job's accelerators throttle; else compute.
    """

    name = "mfu_drop"
    periodic = True
    every = 10.0  # seconds between evaluations: its persist time is longer, and its cost grows with the fleet

    def __init__(self, settings: Settings):
        super().__init__(settings)
        self.onsets = Onsets()
        self.series: dict[int, JobBaseline] = {}

    def evaluate(self, ctx: DetectionContext, now: float) -> Evaluation:
        recent, baseline_seconds = self.option("recent_seconds", 60.0), self.option("baseline_seconds", 1800.0)
        sample = self.option("sample_seconds", 30.0)
        min_points = max(1, math.ceil(self.option("min_history_seconds", 300.0) / sample))
        margin, persist = self.option("margin", 0.2), self.option("persist_seconds", 60.0)
        spread = self.option("max_spread", 0.1)
        places = Placements.of(ctx)
        findings: list[Finding] = []
        subjects = 0
        jobs = ctx.jobs.snapshot()
        for stats in jobs:
            rates = ctx.jobs.rates(stats.job_id, now - recent, now,
                                   accelerators_by_rank=places.accelerators_by_rank(stats.job_id))
            if rates is None:
                continue
            subjects += 1
            values = _values(rates)
            metric = "mfu" if "mfu" in values else THROUGHPUT
            series = self.series.setdefault(stats.job_id, JobBaseline(sample, baseline_seconds + recent + sample))
            base = series.baseline(metric, now - recent - baseline_seconds, now - recent)
            drop = 0.0
            if base is not None and base.median > 0 and base.steady(min_points, spread * base.median):
                drop = 1 - values[metric] / base.median
            series.record(now, values, held=drop >= margin)
            if drop < margin:
                continue
            key = f"job={stats.job_id}"
            onset = self.onsets.hold(key, now)
            if now - onset >= persist:
                findings.append(self._finding(ctx, places, now, onset, stats.job_id, metric, values, series,
                                              (now - recent - baseline_seconds, now - recent)))
        self.onsets.sweep()
        live = {stats.job_id for stats in jobs}
        for job_id in [j for j in self.series if j not in live]:
            del self.series[job_id]
        return Evaluation(findings, subjects)

    def _finding(self, ctx: DetectionContext, places: Placements, now: float, onset: float, job_id: int,
                 metric: str, values: dict[str, float], series: JobBaseline, span: tuple[float, float]) -> Finding:
        reference = {name: series.baseline(name, *span) for name in values}
        base = {name: b.median if b else None for name, b in reference.items()}
        points = main.points if (main := reference[metric]) else 0
        was, now_value = base[metric] or 0.0, values[metric]
        drop = 1 - now_value / was
        share_was, tokens_was = base.get("allreduce_share"), base.get("tokens_per_step")
        step_was = base.get("step_seconds")
        uuids = [u for us in places.accelerators_by_rank(job_id).values() for u in us]
        throttled = [u for u in uuids
                     if (latest := ctx.samples.latest(u)) and throttle_flags(latest[1].throttle_reasons)]
        if share_was is not None and values["allreduce_share"] - share_was >= self.option("share_rise", 0.05):
            layer = "interconnect"
        elif tokens_was and values["tokens_per_step"] < tokens_was * (1 - self.option("tokens_drop", 0.1)):
            layer = "input_pipeline"
        elif throttled:
            layer = "hardware"
        else:
            layer = "compute"
        label, show = ("MFU", lambda v: f"{v:.1%}") if metric == "mfu" else ("tokens/s per rank", lambda v: f"{v:,.0f}")
        changes = (f"step time {_fmt(step_was, '.3f')} → {values['step_seconds']:.3f} s, tokens/step "
                   f"{_fmt(tokens_was, ',.0f')} → {values['tokens_per_step']:,.0f}, all-reduce share "
                   f"{_fmt(share_was, '.0%')} → {values['allreduce_share']:.0%}")
        if throttled:
            changes += f"; {len(throttled)} of its {len(uuids)} accelerators throttle now"
        return Finding(
            detector=self.name, key=f"job={job_id}", severity="warning",
            title=f"job {job_id}: {label} {show(now_value)} is {drop:.0%} below its baseline {show(was)}",
            layer=layer, subject=Subject(job_id=job_id),
            seen=f"{label} {show(now_value)} over the last {minutes(self.option('recent_seconds', 60.0))} vs "
                 f"{show(was)} before: {drop:.0%} lower, for {now - onset:.0f} s. {changes}.",
            comparison=f"the job's own baseline: median of {points} points over the previous "
                       f"{minutes(span[1] - span[0])} (warm-up and earlier drops excluded); it trips at "
                       f"{self.option('margin', 0.2):.0%} below for {self.option('persist_seconds', 60.0):.0f} s",
            evidence={"window": series.window(metric, now),
                      "recent": {k: round(v, 6) for k, v in values.items()},
                      "baseline": {k: round(v, 6) for k, v in base.items() if v is not None},
                      "throttled_accelerators": throttled[:20]},
            next_steps=_next_steps(job_id, layer, throttled),
            observed_at=onset)


def _values(rates: WindowRates) -> dict[str, float]:
    values = {THROUGHPUT: rates.tokens_per_second / rates.ranks, "allreduce_share": rates.allreduce_share,
              "tokens_per_step": rates.tokens_per_step, "step_seconds": rates.step_seconds}
    if rates.mfu is not None:
        values["mfu"] = rates.mfu
    return values


def _fmt(value: float | None, spec: str) -> str:
    return "?" if value is None else format(value, spec)


def _next_steps(job_id: int, layer: str, throttled: list[str]) -> list[str]:
    first = {
        "interconnect": "The all-reduce share rose with the drop: look at the fabric (see any allreduce_spike "
                        "incident for the ranks whose share rose most): `ibstat`, `perfquery -x`, "
                        "`nvidia-smi nvlink -e`, nccl-tests `all_reduce_perf` across the job's nodes",
        "input_pipeline": "Fewer tokens per step: check the data loader and sequence packing (padding, short "
                          "documents), and whether the batch size or sequence length changed",
        "hardware": f"Accelerators throttle ({', '.join(throttled[:5])}): "
                    "`nvidia-smi -q -d PERFORMANCE,TEMPERATURE,POWER`; see the throttle incidents",
        "compute": "Step time rose with the same tokens: look for a straggler incident on this job, other "
                   "processes on its accelerators, and a recent driver / library / code change",
    }[layer]
    return [first,
            f"Per-rank step times and all-reduce shares: `GET /api/v1/jobs/{job_id}/metrics`; the "
            "sentinel_job_mfu_ratio and sentinel_job_step_seconds panels around the onset",
            "Profile one rank for a few steps (torch.profiler or `py-spy dump --pid <pid>`) and compare with a "
            "profile from before the drop"]
