"""All-reduce spike: a job suddenly spends much more of each step in collectives than it used to."""

from __future__ import annotations

import math
from typing import TYPE_CHECKING

from sentinel.detection.base import DetectionContext, Detector, Evaluation, register
from sentinel.detection.detectors._common import JobBaseline, Onsets, Placements, minutes
from sentinel.incidents.findings import Finding, Subject
from sentinel.live.jobs import WindowRates
from sentinel.network.collective import CollectiveVerdict, verdict
from sentinel.network.nics import port_alerts

if TYPE_CHECKING:
    from sentinel.config import Settings


@register
class AllreduceSpikeDetector(Detector):
    """A job's all-reduce share over the last `recent_seconds` rose against its own baseline by at least
    `min_rise` (absolute) and by at least `min_ratio` times, for `persist_seconds` (a blip stays in the
    window for up to `recent_seconds`, so keep persist_seconds at least that long).

    The baseline is the median of points taken every `sample_seconds` over the previous
    `baseline_seconds` (past warm-up, needing `min_history_seconds` of steady points: their MAD at most
    half of `min_rise`); points taken while a spike holds stay out of it. Each rank also keeps its own
    slow-moving usual share (an average over about `baseline_seconds`), so the finding names the
    `top_ranks` whose share rose most, and those whose share rose least: a rank that computes slower
    makes the others wait inside all-reduce.

    Options (defaults): recent_seconds 60, baseline_seconds 1800, min_history_seconds 300,
    sample_seconds 30, min_rise 0.10, min_ratio 1.5, persist_seconds 60, top_ranks 5. Layer: interconnect.
    """

    name = "allreduce_spike"
    periodic = True
    every = 10.0  # seconds between evaluations: its persist time is longer, and its cost grows with the fleet

    def __init__(self, settings: Settings):
        super().__init__(settings)
        self.onsets = Onsets()
        self.series: dict[int, JobBaseline] = {}
        self.rank_baseline: dict[int, dict[int, float]] = {}  # job → rank → its usual share

    def evaluate(self, ctx: DetectionContext, now: float) -> Evaluation:
        recent, baseline_seconds = self.option("recent_seconds", 60.0), self.option("baseline_seconds", 1800.0)
        sample = self.option("sample_seconds", 30.0)
        min_points = max(1, math.ceil(self.option("min_history_seconds", 300.0) / sample))
        min_rise, min_ratio = self.option("min_rise", 0.10), self.option("min_ratio", 1.5)
        persist = self.option("persist_seconds", 60.0)
        findings: list[Finding] = []
        subjects = 0
        places: Placements | None = None
        jobs = ctx.jobs.snapshot()
        for stats in jobs:
            rates = ctx.jobs.rates(stats.job_id, now - recent, now)
            if rates is None:
                continue
            subjects += 1
            share = rates.allreduce_share
            series = self.series.setdefault(stats.job_id, JobBaseline(sample, baseline_seconds + recent + sample))
            base = series.baseline("allreduce_share", now - recent - baseline_seconds, now - recent)
            spiking = (base is not None and base.steady(min_points, min_rise / 2)
                       and share - base.median >= min_rise and share >= min_ratio * base.median)
            if series.record(now, {"allreduce_share": share, "step_seconds": rates.step_seconds}, held=spiking):
                self._learn_ranks(stats.job_id, rates, sample / baseline_seconds, frozen=spiking)
            if not spiking or base is None:
                continue
            onset = self.onsets.hold(f"job={stats.job_id}", now)
            if now - onset >= persist:
                places = places or Placements.of(ctx)
                health = self._collective(ctx, places, stats.job_id, rates, now)
                findings.append(self._finding(places, now, onset, stats.job_id, rates, base.median, base.points, series,
                                              (now - recent - baseline_seconds, now - recent), health))
        self.onsets.sweep()
        live = {stats.job_id for stats in jobs}
        for table in (self.series, self.rank_baseline):
            for job_id in [j for j in table if j not in live]:
                del table[job_id]
        return Evaluation(findings, subjects)

    def _learn_ranks(self, job_id: int, rates: WindowRates, weight: float, *, frozen: bool) -> None:
        """Move each rank's usual share a little toward what it is now; frozen while a spike holds."""
        usual = self.rank_baseline.setdefault(job_id, {})
        for rank, share in rates.rank_shares.items():
            if rank not in usual:
                usual[rank] = share
            elif not frozen:
                usual[rank] += min(1.0, weight) * (share - usual[rank])

    @staticmethod
    def _collective(ctx: DetectionContext, places: Placements, job_id: int, rates: WindowRates,
                    now: float) -> CollectiveVerdict:
        """Slow link or slow rank (sentinel/network/collective.py), with what the network tier sees on the job's
        nodes."""
        rank_nodes = {r: n for r, (n, _) in places.ranks_of.get(job_id, {}).items() if n}
        net = ctx.network
        if net is None:
            return verdict(rates.rank_shares, rank_nodes, rates.steps)
        alerts = port_alerts(net.nics, net.rules, sorted(set(rank_nodes.values())))
        return verdict(rates.rank_shares, rank_nodes, rates.steps, localisation=net.localisation(now),
                       port_alerts=alerts)

    def _finding(self, places: Placements, now: float, onset: float, job_id: int, rates: WindowRates,
                 base: float, points: int, series: JobBaseline, span: tuple[float, float],
                 health: CollectiveVerdict) -> Finding:
        share = rates.allreduce_share
        usual = self.rank_baseline.get(job_id, {})
        rises = sorted(((now_share - usual.get(rank, base), rank, now_share)
                        for rank, now_share in rates.rank_shares.items()), reverse=True)
        top = rises[: max(1, min(int(self.option("top_ranks", 5)), len(rises) // 2))]
        least = [r for r in rises[::-1][:3] if r not in top]

        def describe(entries: list[tuple[float, int, float]]) -> str:
            return ", ".join(f"rank {rank} {usual.get(rank, base):.0%} → {now_share:.0%}"
                             + (f" ({places.rank(job_id, rank)[0]})" if places.rank(job_id, rank)[0] else "")
                             for _, rank, now_share in entries)

        nodes = sorted({n for _, rank, _ in top if (n := places.rank(job_id, rank)[0])})
        step_base = series.baseline("step_seconds", *span)
        step_was = step_base.median if step_base else None
        return Finding(
            detector=self.name, key=f"job={job_id}", severity="warning",
            title=f"job {job_id}: all-reduce share {share:.0%} vs {base:.0%} usually",
            layer="compute" if health.kind == "compute_straggler" else "interconnect", subject=Subject(job_id=job_id),
            seen=f"all-reduce takes {share:.0%} of step time over the last "
                 f"{minutes(self.option('recent_seconds', 60.0))} vs {base:.0%} before (+{(share - base) * 100:.0f} "
                 f"points, {share / base if base else float('inf'):.1f}×), for {now - onset:.0f} s; step time "
                 f"{rates.step_seconds:.3f} s" + (f" (usually {step_was:.3f} s)" if step_was else "")
                 + f". Rose most: {describe(top)}. Collective health: {health.summary}.",
            comparison=f"the job's own baseline: median share of {points} points over the previous "
                       f"{minutes(self.option('baseline_seconds', 1800.0))}, and each rank's usual share; rose "
                       f"least: {describe(least) or 'none'} (a rank whose share did not rise may be the one the "
                       "others wait for: see any straggler incident)",
            evidence={"window": series.window("allreduce_share", now),
                      "ranks": [{"rank": rank, "node": places.rank(job_id, rank)[0], "share": round(s, 4),
                                 "usual": round(usual.get(rank, base), 4)} for _, rank, s in top],
                      "baseline_share": round(base, 4), "recent_share": round(share, 4),
                      "collective_health": health.as_evidence()},
            next_steps=[
                "Measure the fabric between the named ranks' nodes with nccl-tests: `all_reduce_perf -b 8M -e 1G "
                f"-f 2 -g 1` across {', '.join(nodes) or 'the job nodes'} and compare with a healthy pair",
                "Read the link counters on those nodes: `ibstat` (link up, rate), `perfquery -x` (SymbolErrors, "
                "LinkDowned, PortXmitWait), `nvidia-smi nvlink -e`",
                "Rerun a rank with `NCCL_DEBUG=INFO` to confirm the transport (IB/RoCE, not a socket fallback)",
                "Look for another job sharing the fabric (noisy neighbour) or a switch change at the onset time"],
            observed_at=onset)
