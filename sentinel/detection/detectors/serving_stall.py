"""Serving stall: a serving replica with requests in flight that has produced no token for `stall_seconds` (a decode
frozen mid-stream passes health checks that read only the first chunk: Dynamo PR #13675), or whose oldest
request in flight is older than `deadline_seconds` (requests that hang silently: Dynamo #13088).

It reads the request sums the replica's SDK or engine adapter sends (sentinel/serving/signals.py): requests in
flight, the age of the oldest, and when a token last came out. A replica that stopped reporting altogether
is the heartbeat detector's; one whose report is older than `fresh_seconds` is not judged.

Options (defaults): stall_seconds 10, deadline_seconds 120, fresh_seconds 30. Layer: software (the engine);
action: restart_task, which for a serving job replaces the replica (drain, start the replacement, stop it).
"""

from __future__ import annotations

from collections import deque
from typing import TYPE_CHECKING

from sentinel.detection.base import DetectionContext, Detector, Evaluation, register
from sentinel.detection.detectors._common import Onsets, prune
from sentinel.incidents.findings import Finding, Subject
from sentinel.sdk import buckets

if TYPE_CHECKING:
    from sentinel.config import Settings
    from sentinel.serving.signals import ReplicaStats

WINDOW_POINTS = 60


@register
class ServingStall(Detector):
    """A serving replica with requests in flight and no token for `stall_seconds`, as of its latest report, or
    whose oldest request in flight is older than `deadline_seconds`. A replica whose latest report is older than
    `fresh_seconds` is not judged (the heartbeat detector's). One incident per replica.

    Options (defaults): stall_seconds 10, deadline_seconds 120, fresh_seconds 30. Layer: software.
    """

    name = "serving_stall"
    periodic = True

    def __init__(self, settings: Settings):
        super().__init__(settings)
        self.onsets = Onsets()
        self.points: dict[tuple[int, str], deque[tuple[float, float]]] = {}  # seconds since the last token

    def evaluate(self, ctx: DetectionContext, now: float) -> Evaluation:
        view = ctx.serving
        if view is None:
            return Evaluation([], 0)
        stall, deadline = self.option("stall_seconds", 10.0), self.option("deadline_seconds", 120.0)
        fresh = self.option("fresh_seconds", 30.0)
        findings: list[Finding] = []
        subjects = 0
        seen: set[tuple[int, str]] = set()
        for job_id, r in view.fresh(now, fresh):
            subjects += 1
            key = (job_id, r.replica)
            seen.add(key)
            quiet = self._quiet(r, now)
            points = self.points.setdefault(key, deque(maxlen=WINDOW_POINTS))
            points.append((now, quiet if quiet is not None else 0.0))
            in_flight = (r.running or 0) > 0 or (r.oldest_inflight_seconds or 0.0) > 0
            oldest = r.oldest_inflight_seconds or 0.0
            stalled = in_flight and quiet is not None and quiet >= stall
            overdue = in_flight and oldest >= deadline
            if not (stalled or overdue):
                continue
            fingerprint_key = f"job={job_id}|replica={r.replica}"
            onset = self.onsets.hold(fingerprint_key, now)
            findings.append(self._finding(ctx, job_id, r, now, onset, quiet, oldest, stall, deadline, stalled,
                                          fingerprint_key))
        self.onsets.sweep()
        prune(self.points, seen)
        self.active = {f.fingerprint for f in findings}
        return Evaluation(findings, subjects)

    @staticmethod
    def _quiet(r: ReplicaStats, now: float) -> float | None:
        """Seconds without a token as of the replica's latest report (its sums say when a token last came out,
        on the replica's wall clock); with none seen yet, the age of the oldest request in flight. Measured at
        the report, not now: between two reports a healthy replica's last token only looks older."""
        if r.last_token_at is not None:
            return max(0.0, r.last_seen - r.last_token_at)
        return r.oldest_inflight_seconds

    def _finding(self, ctx: DetectionContext, job_id: int, r: ReplicaStats, now: float, onset: float,
                 quiet: float | None, oldest: float, stall: float, deadline: float, stalled: bool,
                 key: str) -> Finding:
        view = ctx.serving
        assert view is not None
        window = view.window(job_id, r.replica, now)
        itl = buckets.quantile(window.histograms.get("itl", {}), 0.99)
        running = r.running if r.running is not None else "some"
        what = (f"{running} requests in flight, no token for {quiet:.0f} s" if stalled and quiet is not None
                else f"its oldest request in flight is {oldest:.0f} s old")
        usual = (f"its inter-token latency p99 over the last {view.window_seconds:.0f} s was {itl * 1000:.0f} ms"
                 if itl is not None else "no token timing of this replica in the window")
        points = list(self.points.get((job_id, r.replica), ()))
        return Finding(
            detector=self.name, key=key, severity="critical", layer="software",
            subject=Subject(node=r.node or None, job_id=job_id, rank=r.rank),
            title=f"serving job {job_id}: {r.label} stalled ({what})",
            seen=f"{r.label} (rank {r.rank}, node {r.node}): {what}; "
                 f"limits {stall:.0f} s without a token, {deadline:.0f} s for a request",
            comparison=usual,
            evidence={"replica": r.replica, "stage": r.stage, "source": r.source, "running": r.running,
                      "waiting": r.waiting, "oldest_inflight_seconds": oldest, "seconds_since_token": quiet,
                      "itl_p99_seconds": itl,
                      "window": {"metric": "seconds_since_last_token",
                                 "times": [round(t - now, 3) for t, _ in points],
                                 "values": [round(v, 3) for _, v in points]}},
            next_steps=[f"Read the engine's log on {r.node or 'its node'} for the stuck step (a CUDA error, "
                        "a collective waiting for a peer, a KV transfer that never completed)",
                        "Send one request straight to the replica and read the stream to its end",
                        "Sentinel replaces the replica (drain, start the replacement, stop the old one); check "
                        "its in-flight requests were retried"],
            action="restart_task", observed_at=min(onset, r.last_seen - (quiet or 0.0) + stall if stalled
                                                   else r.last_seen - oldest + deadline))
