"""SLO burn: a serving job spends its error budget too fast, by the multi-window burn rates of the Google SRE
workbook (chapter 5, "Alerting on SLOs")."""

from __future__ import annotations

from collections import deque
from typing import TYPE_CHECKING

from sentinel.detection.base import DetectionContext, Detector, Evaluation, register
from sentinel.detection.detectors._common import Onsets
from sentinel.incidents.findings import Finding, Subject
from sentinel.serving.signals import BURN_WINDOWS, burn_rates, summary

if TYPE_CHECKING:
    from sentinel.config import Settings
    from sentinel.serving.signals import ServingView

WINDOW_POINTS = 60


@register
class SloBurn(Detector):
    """A serving job's error budget (1 − the objective its SLO registered; 1% of requests failed where none
    was) burns `fast_burn` times too fast over both 1 h and 5 m (critical: at 14.4× a 30-day budget is gone in
    2 days), or `slow_burn` times over both 6 h and 30 m (warning). The short window makes it clear soon after
    the burn stops. A job with fewer than `min_requests` requests in the last 5 m is not judged.

    Options (defaults): fast_burn 14.4, slow_burn 6, min_requests 20. Layer: software; action: record (the
    page is the action; the incident names the replica that misses most).
    """

    name = "slo_burn"
    periodic = True
    every = 10.0

    def __init__(self, settings: Settings):
        super().__init__(settings)
        self.onsets = Onsets()
        self.points: dict[int, deque[tuple[float, float]]] = {}  # job → (at, 5 m burn rate)

    def evaluate(self, ctx: DetectionContext, now: float) -> Evaluation:
        view = ctx.serving
        if view is None:
            return Evaluation([], 0)
        fast, slow = self.option("fast_burn", 14.4), self.option("slow_burn", 6.0)
        least = self.option("min_requests", 20)
        findings: list[Finding] = []
        subjects = 0
        for job_id in view.job_ids():
            requests, _ = view.error_ratio(job_id, now, 300.0)
            if requests < least:
                continue
            subjects += 1
            rates = dict(zip(BURN_WINDOWS, burn_rates(view, job_id, now), strict=True))
            points = self.points.setdefault(job_id, deque(maxlen=WINDOW_POINTS))
            points.append((now, rates["5m"] or 0.0))
            if (rates["1h"] or 0) >= fast and (rates["5m"] or 0) >= fast:
                severity, pair, limit = "critical", ("1h", "5m"), fast
            elif (rates["6h"] or 0) >= slow and (rates["30m"] or 0) >= slow:
                severity, pair, limit = "warning", ("6h", "30m"), slow
            else:
                continue
            key = f"job={job_id}"
            onset = self.onsets.hold(key, now)
            findings.append(self._finding(view, job_id, now, onset, rates, severity, pair, limit, requests, key))
        self.onsets.sweep()
        for job_id in [j for j in self.points if j not in view.job_ids()]:
            del self.points[job_id]
        self.active = {f.fingerprint for f in findings}
        return Evaluation(findings, subjects)

    def _finding(self, view: ServingView, job_id: int, now: float, onset: float, rates: dict[str, float | None],
                 severity: str, pair: tuple[str, str], limit: float, requests: int, key: str) -> Finding:
        slo = view.slo(job_id)
        objective = slo.objective if slo is not None else 0.99
        target = (f"TTFT ≤ {slo.ttft_seconds * 1000:.0f} ms and TPOT ≤ {slo.tpot_seconds * 1000:.0f} ms for "
                  f"{objective:.1%} of requests" if slo is not None else "no failed request for 99% of them")
        worst, worst_share = None, None
        for r in view.replicas(job_id, now):
            s = summary(view.window(job_id, r.replica, now), seconds=view.window_seconds, slo=slo)
            share = s["slo_attainment_ratio"] if slo is not None else (
                None if s["failed_ratio"] is None else 1.0 - s["failed_ratio"])
            if share is not None and (worst_share is None or share < worst_share):
                worst, worst_share = r, share
        where = (f"; the replica that misses most over the last {view.window_seconds:.0f} s is {worst.stage} "
                 f"replica {worst.replica} on {worst.node} ({worst_share:.1%} within)" if worst is not None
                 and worst_share is not None else "")
        points = list(self.points.get(job_id, ()))
        burn = ", ".join(f"{w} {rates[w]:.1f}×" for w in BURN_WINDOWS if rates[w] is not None)
        return Finding(
            detector=self.name, key=key, severity=severity, layer="software",
            subject=Subject(job_id=job_id, node=worst.node if worst is not None else None),
            title=f"serving job {job_id}: error budget burning {rates[pair[1]]:.0f}× too fast ({pair[0]} and "
                  f"{pair[1]} over {limit:g}×)",
            seen=f"error-budget burn rates {burn}; {requests} requests in the last 5 m{where}",
            comparison=f"the SLO: {target}; a burn rate of 1 spends the budget exactly over the SLO period",
            evidence={"burn_rates": rates, "windows": list(pair), "limit": limit, "objective": objective,
                      "worst_replica": None if worst is None else worst.replica,
                      "window": {"metric": "slo_burn_rate_5m", "times": [round(t - now, 3) for t, _ in points],
                                 "values": [round(v, 3) for _, v in points]}},
            next_steps=["`sentinel jobs`: which replica's TTFT or TPOT p99 is over target, and its KV-transfer share",
                        "GET /api/v1/jobs/{id}/serving for the stage shares, the queue and the failures by reason"
                        .replace("{id}", str(job_id)),
                        "A traffic spike shows as queue time; a sick replica as one replica's latency alone"],
            action="record", observed_at=onset)
