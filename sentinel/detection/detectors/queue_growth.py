"""Queue growth: a serving replica whose queue of waiting requests keeps growing. It is still answering, so
no latency detector has fired yet; but arrivals outrun what it finishes, and every request that joins the
queue waits longer than the one before. Caught while the queue grows, not after its time-to-first-token
has blown the SLO.

The detector keeps each replica's `waiting` gauge (vLLM `num_requests_waiting`, SGLang `num_queue_reqs`, or
the SDK's `set_state`) per report over `span_seconds`, and fits a least-squares line through it.
"""

from __future__ import annotations

from collections import deque
from typing import TYPE_CHECKING

from sentinel.detection.base import DetectionContext, Detector, Evaluation, register
from sentinel.detection.detectors._common import Onsets, evidence_window, prune
from sentinel.incidents.findings import Finding, Subject

if TYPE_CHECKING:
    from sentinel.config import Settings
    from sentinel.serving.signals import ReplicaStats


def slope(points: list[tuple[float, float, int]]) -> float:
    """Least-squares requests per second through (at, waiting)."""
    n = len(points)
    mean_t = sum(p[0] for p in points) / n
    mean_w = sum(p[1] for p in points) / n
    var = sum((p[0] - mean_t) ** 2 for p in points)
    return sum((p[0] - mean_t) * (p[1] - mean_w) for p in points) / var if var else 0.0


@register
class QueueGrowth(Detector):
    """A serving replica whose waiting requests grew over `span_seconds` at `min_slope` requests/s or more
    (least squares over its reports), reaching `min_waiting`, with at least twice as many waiting at the end
    as at the start. Needs `min_points` reports in the span; a replica whose latest report is older than
    `fresh_seconds` is not judged. One incident per replica; it clears when the queue stops growing.

    Options (defaults): span_seconds 120, min_slope 0.1, min_waiting 16, min_points 6, fresh_seconds 30.
    Layer: software (capacity); action: record (the batching controller and the operator act on it).
    """

    name = "queue_growth"
    periodic = True

    def __init__(self, settings: Settings):
        super().__init__(settings)
        self.onsets = Onsets()
        self.points: dict[tuple[int, str], deque[tuple[float, float, int]]] = {}  # (at, waiting, requests)

    def evaluate(self, ctx: DetectionContext, now: float) -> Evaluation:
        view = ctx.serving
        if view is None:
            return Evaluation([], 0)
        span = self.option("span_seconds", 120.0)
        findings: list[Finding] = []
        subjects = 0
        seen: set[tuple[int, str]] = set()
        for job_id, r in view.fresh(now, self.option("fresh_seconds", 30.0)):
            if r.waiting is None:
                continue
            subjects += 1
            key = (job_id, r.replica)
            seen.add(key)
            points = self.points.setdefault(key, deque())
            if not points or points[-1][0] != r.last_seen:
                points.append((r.last_seen, float(r.waiting), r.requests_total))
            while points and points[0][0] < now - span:
                points.popleft()
            rate = slope(list(points)) if len(points) >= self.option("min_points", 6) else 0.0
            first, last = points[0], points[-1]
            if not (rate >= self.option("min_slope", 0.1) and last[1] >= self.option("min_waiting", 16)
                    and last[1] >= 2 * first[1]):
                continue
            fingerprint_key = f"job={job_id}|replica={r.replica}"
            onset = self.onsets.hold(fingerprint_key, now)
            findings.append(self._finding(job_id, r, list(points), rate, now, onset, fingerprint_key))
        self.onsets.sweep()
        prune(self.points, seen)
        self.active = {f.fingerprint for f in findings}
        return Evaluation(findings, subjects)

    def _finding(self, job_id: int, r: ReplicaStats, points: list[tuple[float, float, int]], rate: float,
                 now: float, onset: float, key: str) -> Finding:
        first, last = points[0], points[-1]
        seconds = max(last[0] - first[0], 1e-9)
        finished = (last[2] - first[2]) / seconds
        limit = f"its batch limit {r.batch_limit}" if r.batch_limit else "its batch limit not reported"
        return Finding(
            detector=self.name, key=key, severity="warning", layer="software",
            subject=Subject(node=r.node or None, job_id=job_id, rank=r.rank),
            title=f"serving job {job_id}: {r.label}: queue growing "
                  f"({first[1]:.0f} → {last[1]:.0f} waiting in {seconds:.0f} s)",
            seen=f"{r.label} (rank {r.rank}, node {r.node}): waiting requests grew "
                 f"{rate:.2f}/s over {seconds:.0f} s to {last[1]:.0f}; {r.running if r.running is not None else '?'} "
                 f"running, {limit}",
            comparison=f"it finished {finished:.1f} requests/s over the same span: arrivals outrun it",
            evidence={"replica": r.replica, "stage": r.stage, "slope_per_second": round(rate, 4),
                      "waiting": last[1], "running": r.running, "batch_limit": r.batch_limit,
                      "finished_per_second": round(finished, 3),
                      "window": evidence_window("waiting", [p[0] - now for p in points], [p[1] for p in points])},
            next_steps=["Check the job's traffic (a spike, a retry storm from a client) against its replicas' "
                        "capacity: `sentinel jobs` shows each replica's queue and latency",
                        "Add a replica, or let the batching controller raise the batch limit if latency allows",
                        f"If only this replica queues, compare it with its peers: a slow accelerator on "
                        f"{r.node or 'its node'} serves fewer per step"],
            action="record", observed_at=onset)
