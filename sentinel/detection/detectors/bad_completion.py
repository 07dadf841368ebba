"""Bad completions: a serving replica that answers, but not with an answer. A failed decode returns HTTP 200 with
an empty body (vllm-ascend PR #13165); a worker frozen mid-stream passes a health check that reads only the
first chunk (Dynamo PR #13675). Neither shows in latency metrics, and an engine's /metrics page counts the
request as a success.

Two sources say it. The agent's canary (collectors/engines/canary.py) asks the replica for a few real tokens
and reads the stream to its end: a 200 with no token (`empty`), a stream that ends before its `[DONE]`
(`truncated`) or stops sending (`timeout`) is a bad answer at once; a canary that got no answer at all
(`error`: refused, 5xx) counts only when `confirm` in a row say so, since a lone connection blip is not a
broken engine. And the SDK of a replica counts its own requests that ended empty or truncated: `min_count`
of them making `min_share` of the window's requests.
"""

from __future__ import annotations

from collections import deque
from typing import TYPE_CHECKING

from sentinel.detection.base import DetectionContext, Detector, Evaluation, register
from sentinel.detection.detectors._common import Onsets, prune
from sentinel.incidents.findings import Finding, Subject

if TYPE_CHECKING:
    from sentinel.config import Settings
    from sentinel.serving.signals import ReplicaStats
    from sentinel.telemetry.serving import CanaryResult, ServingStats

WINDOW_POINTS = 60
CONTENT = ("empty", "truncated", "timeout")  # the replica answered, and the answer was wrong
WHAT = {"empty": "answers HTTP 200 with no token", "truncated": "ends its streams before their end",
        "timeout": "stops streaming mid-answer", "error": "does not answer the canary"}


@register
class BadCompletion(Detector):
    """A serving replica whose latest canary came back empty, truncated or stalled mid-stream, or whose last
    `confirm` canaries got no answer; or whose own requests ended empty or truncated, `min_count` of them and
    `min_share` of the window's requests. A replica whose latest report is older than `fresh_seconds` is not
    judged (the heartbeat detector's). Clears when the latest canary is good and the window's bad answers are
    under the limits. One incident per replica.

    Options (defaults): confirm 2, min_count 3, min_share 0.05, fresh_seconds 30. Layer: software; action:
    restart_task, which for a serving job replaces the replica.
    """

    name = "bad_completion"
    periodic = True

    def __init__(self, settings: Settings):
        super().__init__(settings)
        self.onsets = Onsets()
        self.points: dict[tuple[int, str], deque[tuple[float, float]]] = {}  # (at, 1 for a good canary, else 0)

    def evaluate(self, ctx: DetectionContext, now: float) -> Evaluation:
        view = ctx.serving
        if view is None:
            return Evaluation([], 0)
        fresh = self.option("fresh_seconds", 30.0)
        findings: list[Finding] = []
        subjects = 0
        seen: set[tuple[int, str]] = set()
        for job_id, r in view.fresh(now, fresh):
            subjects += 1
            key = (job_id, r.replica)
            seen.add(key)
            canaries = list(r.canaries)
            if canaries:
                points = self.points.setdefault(key, deque(maxlen=WINDOW_POINTS))
                if not points or points[-1][0] != canaries[-1].at:
                    points.append((canaries[-1].at, 1.0 if canaries[-1].ok else 0.0))
            window = view.window(job_id, r.replica, now)
            bad_canary = self._bad_canary(canaries)
            bad_requests = self._bad_requests(window)
            if bad_canary is None and not bad_requests:
                continue
            fingerprint_key = f"job={job_id}|replica={r.replica}"
            onset = self.onsets.hold(fingerprint_key, now)
            findings.append(self._finding(job_id, r, now, onset, bad_canary, window, bad_requests,
                                          view.window_seconds, fingerprint_key))
        self.onsets.sweep()
        prune(self.points, seen)
        self.active = {f.fingerprint for f in findings}
        return Evaluation(findings, subjects)

    def _bad_canary(self, canaries: list[CanaryResult]) -> CanaryResult | None:
        """The latest canary, when it says the replica is broken."""
        if not canaries or canaries[-1].ok:
            return None
        latest = canaries[-1]
        if latest.reason in CONTENT:
            return latest
        confirm = max(1, int(self.option("confirm", 2)))
        return latest if len(canaries) >= confirm and not any(c.ok for c in canaries[-confirm:]) else None

    def _bad_requests(self, window: ServingStats) -> dict[str, int]:
        bad = {reason: window.failed.get(reason, 0) for reason in ("empty", "truncated")}
        total = sum(bad.values())
        if total < self.option("min_count", 3) or total < self.option("min_share", 0.05) * max(window.requests, 1):
            return {}
        return {k: v for k, v in bad.items() if v}

    def _finding(self, job_id: int, r: ReplicaStats, now: float, onset: float, canary: CanaryResult | None,
                 window: ServingStats, bad: dict[str, int], window_seconds: float, key: str) -> Finding:
        parts = []
        if canary is not None:
            parts.append(f"canary: {canary.detail or canary.reason}" + (f" (HTTP {canary.status})"
                                                                       if canary.status not in (None, 200) else ""))
        if bad:
            counts = ", ".join(f"{n} {reason}" for reason, n in bad.items())
            parts.append(f"{counts} of its {window.requests} requests in the last {window_seconds:.0f} s")
        reason = canary.reason if canary is not None and canary.reason else next(iter(bad), "empty")
        what = WHAT.get(reason, "answers badly")
        good = [c for c in r.canaries if c.ok]
        usual = (f"its last good canary {now - good[-1].at:.0f} s ago: {good[-1].tokens} tokens in "
                 f"{good[-1].seconds:.2f} s" if good else "no good canary of this replica seen yet")
        points = list(self.points.get((job_id, r.replica), ()))
        return Finding(
            detector=self.name, key=key, severity="critical", layer="software",
            subject=Subject(node=r.node or None, job_id=job_id, rank=r.rank),
            title=f"serving job {job_id}: {r.label} {what}",
            seen=f"{r.label} (rank {r.rank}, node {r.node}): {'; '.join(parts)}",
            comparison=usual,
            evidence={"replica": r.replica, "stage": r.stage, "source": r.source, "reason": reason,
                      "canary": canary.model_dump() if canary is not None else None,
                      "bad_requests": bad, "window_requests": window.requests,
                      "window": {"metric": "canary_ok", "times": [round(t - now, 3) for t, _ in points],
                                 "values": [v for _, v in points]}},
            next_steps=[f"Read the engine's log on {r.node or 'its node'} around the first bad answer (a decode "
                        "error swallowed into an empty 200, a worker waiting on a peer or a KV transfer)",
                        "Send one streamed completion straight to the replica and read it to its [DONE]",
                        "Sentinel replaces the replica (drain, start the replacement, stop the old one); check "
                        "the answers of the replacement"],
            action="restart_task", observed_at=min(onset, canary.at if canary is not None else onset))
