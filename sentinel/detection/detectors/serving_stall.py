"""Serving stall: a serving replica with requests in flight that has produced no token for `stall_seconds` (a decode
frozen mid-stream passes health checks that read only the first chunk: Dynamo PR #13675), or whose oldest
request in flight is older than `deadline_seconds` (requests that hang silently: Dynamo #13088).

It reads the request sums the replica's SDK or engine adapter sends (sentinel/serving/signals.py): requests in
flight, the age of the oldest, and when a token last came out. A replica that stopped reporting altogether
is the heartbeat detector's; one whose report is older than `fresh_seconds` is not judged.

How long a silence may last depends on what is in flight:
- some requests are mid-stream (past their first token: the SDK says so, a scraped /metrics page cannot):
  `mid_stream_seconds`, since no token from any of them for that long is a decode frozen;
- none is (or the source cannot say): the silence may be a long prefill, so `ttft_factor` × the replica's own
  TTFT p99 over the window, at least `mid_stream_seconds` and at most `stall_seconds`; `stall_seconds` where the
  window has no first token to go by. A replica that froze between answers (nothing was streaming) is so
  found in seconds where its first tokens usually take milliseconds, and one that serves long prompts is not
  paged for them.
An engine whose prefill blocks its decodes for longer than 3 s (no chunked prefill, very long prompts) needs a
larger `mid_stream_seconds`.

Options (defaults): stall_seconds 10, mid_stream_seconds 3, ttft_factor 10, deadline_seconds 120, fresh_seconds
30. Layer: software (the engine); action: restart_task, which for a serving job replaces the replica (drain,
start the replacement, stop it).
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
    from sentinel.live.fleet import NodeLive
    from sentinel.serving.signals import ReplicaStats, ServingView
    from sentinel.telemetry.schemas import NodeReport

WINDOW_POINTS = 60


@register
class ServingStall(Detector):
    """A serving replica with requests in flight and no token for `stall_seconds` (`mid_stream_seconds` where some
    are mid-stream), as of its latest report, or whose oldest request in flight is older than `deadline_seconds`.
    A replica whose latest report is older than `fresh_seconds` is not judged (the heartbeat detector's). One
    incident per replica.

    Options (defaults): stall_seconds 10, mid_stream_seconds 3, ttft_factor 10, deadline_seconds 120,
    fresh_seconds 30. Layer: software.
    """

    name = "serving_stall"
    periodic = True

    def __init__(self, settings: Settings):
        super().__init__(settings)
        self.onsets = Onsets()
        self.points: dict[tuple[int, str], deque[tuple[float, float]]] = {}  # seconds since the last token
        self.active_keys: set[str] = set()  # the replicas found at the last evaluation (job=…|replica=…)

    def evaluate(self, ctx: DetectionContext, now: float) -> Evaluation:
        view = ctx.serving
        if view is None:
            return Evaluation([], 0)
        stall, deadline = self.option("stall_seconds", 10.0), self.option("deadline_seconds", 120.0)
        mid_stream = self.option("mid_stream_seconds", 3.0)
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
            limit, basis = stall, ""
            if in_flight and quiet is not None and quiet >= min(mid_stream, stall):
                limit, basis = self._limit(view, job_id, r, now, stall, mid_stream)
            stalled = in_flight and quiet is not None and quiet >= limit
            overdue = in_flight and oldest >= deadline
            if not (stalled or overdue):
                continue
            fingerprint_key = f"job={job_id}|replica={r.replica}"
            onset = self.onsets.hold(fingerprint_key, now)
            findings.append(self._finding(ctx, job_id, r, now, onset, quiet, oldest, (limit, basis), deadline,
                                          stalled, fingerprint_key))
        self.onsets.sweep()
        prune(self.points, seen)
        self.active = {f.fingerprint for f in findings}
        self.active_keys = {f.key for f in findings}
        return Evaluation(findings, subjects)

    def _limit(self, view: ServingView, job_id: int, r: ReplicaStats, now: float, stall: float,
               mid_stream: float) -> tuple[float, str]:
        """The silence this replica may keep, and what it rests on (for the incident)."""
        if (r.streaming or 0) > 0:
            return min(mid_stream, stall), f"{r.streaming} mid-stream"
        ttft = buckets.quantile(view.window(job_id, r.replica, now).histograms.get("ttft", {}), 0.99)
        if ttft is None:
            return stall, ""
        factor = self.option("ttft_factor", 10.0)
        limit = min(stall, max(mid_stream, factor * ttft))
        return limit, f"none mid-stream: {factor:g} × its TTFT p99 of {ttft * 1000:.0f} ms, {mid_stream:g}–{stall:g} s"

    def wants_evaluation(self, ctx: DetectionContext, live: NodeLive, report: NodeReport) -> bool:
        """A replica in this report with requests in flight and no token for `mid_stream_seconds`, not yet
        found: judged now rather than at the next turn (a frozen decode's clients are waiting)."""
        limit = min(self.option("mid_stream_seconds", 3.0), self.option("stall_seconds", 10.0))
        now = ctx.clock.time()
        for task in report.tasks:
            s = task.serving
            if s is None or not (s.running or s.streaming) or s.last_token_at is None or now - s.last_token_at < limit:
                continue
            if f"job={task.job_id}|replica={s.replica or f'r{task.rank}'}" not in self.active_keys:
                return True
        return False

    @staticmethod
    def _quiet(r: ReplicaStats, now: float) -> float | None:
        """Seconds without a token as of the replica's latest report (its sums say when a token last came out,
        on the replica's wall clock); with none seen yet, the age of the oldest request in flight. Measured at
        the report, not now: between two reports a healthy replica's last token only looks older."""
        if r.last_token_at is not None:
            return max(0.0, r.last_seen - r.last_token_at)
        return r.oldest_inflight_seconds

    def _finding(self, ctx: DetectionContext, job_id: int, r: ReplicaStats, now: float, onset: float,
                 quiet: float | None, oldest: float, limit: tuple[float, str], deadline: float, stalled: bool,
                 key: str) -> Finding:
        view = ctx.serving
        assert view is not None
        window = view.window(job_id, r.replica, now)
        itl = buckets.quantile(window.histograms.get("itl", {}), 0.99)
        running = r.running if r.running is not None else "some"
        stall, basis = limit
        mid = f", {r.streaming} of them mid-stream" if r.streaming else (", none past its first token"
                                                                       if r.streaming == 0 else "")
        what = (f"{running} requests in flight{mid}, no token for {quiet:.1f} s" if stalled and quiet is not None
                else f"its oldest request in flight is {oldest:.0f} s old")
        usual = (f"its inter-token latency p99 over the last {view.window_seconds:.0f} s was {itl * 1000:.0f} ms"
                 if itl is not None else "no token timing of this replica in the window")
        points = list(self.points.get((job_id, r.replica), ()))
        return Finding(
            detector=self.name, key=key, severity="critical", layer="software",
            subject=Subject(node=r.node or None, job_id=job_id, rank=r.rank),
            title=f"serving job {job_id}: {r.label} stalled ({what})",
            seen=f"{r.label} (rank {r.rank}, node {r.node}): {what}; "
                 f"limits {stall:.1f} s without a token{f' ({basis})' if basis else ''}, {deadline:.0f} s "
                 "for a request",
            comparison=usual,
            evidence={"replica": r.replica, "stage": r.stage, "source": r.source, "running": r.running,
                      "waiting": r.waiting, "streaming": r.streaming, "oldest_inflight_seconds": oldest,
                      "seconds_since_token": quiet, "stall_limit_seconds": stall,
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
