"""The batching controller: per serving job with an SLO, the batch limit (requests admitted per replica at once)
adjusted by additive increase, multiplicative decrease (Clipper's AIMD) against the SLO's targets.

Each tick reads the job's last `window_seconds` of requests (sentinel/serving/signals.py) and its replicas'
queues:
- TPOT p99 over its target: the batch is too large for the decode to keep pace: the limit × `decrease`;
- otherwise, requests waiting, TPOT p99 under `headroom` × its target: room to admit more: the limit +
  `increase`, or + the queue per replica where that is more, at most doubling (the queue is what makes TTFT
  miss during a spike, and a spike does not wait for steps of 2);
- and, with TPOT p99 under `slack` × its target, the limit kept at `spare` × the most requests one replica ran
  at once in the window (at most doubling per tick): a limit the load already reaches half of queues the next
  burst, and while TPOT is far from its target a larger batch costs it little (a spike that comes finds room,
  where a controller that waits for a queue is seconds late: TTFT misses while it climbs);
- otherwise the limit stays.
Guarded: within [`min_limit`, `max_limit`]; after a change no cut for `cooldown_seconds` (its effect must
reach the window first), and after a cut no raise either (hysteresis); a raise may follow a raise at the next
tick, since a queue still there says at once that it was not enough; a job with fewer than `min_requests`
finished in the window is left alone; `dry_run` says what it would do and issues nothing. A change goes out
as an `adjust` order (`{"batch_limit": N}`) that the job's launcher applies (sentinel/launcher/replicas.py);
the starting limit is the one its replicas report, or, for replicas the router holds to a limit (vLLM takes
none itself), the router's, which the launcher says with its queue (sentinel/launcher/router_queue.py).
"""

from __future__ import annotations

import logging
import math
from collections.abc import Callable
from dataclasses import dataclass

from sentinel.sdk import buckets
from sentinel.serving.signals import ServingView

log = logging.getLogger("sentinel.serving.batching")


@dataclass(frozen=True)
class Decision:
    job_id: int
    before: int
    after: int
    why: str
    applied: bool  # False: a dry run, or the order could not be issued


@dataclass
class Limits:
    min_limit: int = 1
    max_limit: int = 256
    increase: int = 2
    decrease: float = 0.7
    headroom: float = 0.8
    slack: float = 0.5
    spare: float = 2.0
    cooldown_seconds: float = 5.0
    window_seconds: float = 10.0
    min_requests: int = 10


class BatchingController:
    def __init__(self, view: ServingView, apply: Callable[[int, dict[str, int], str], str | None], *,
                 limits: Limits | None = None, dry_run: bool = False) -> None:
        self.view = view
        self.apply = apply  # (job, params, reason) → the order's id, or None where it could not be issued
        self.limits = limits or Limits()
        self.dry_run = dry_run
        self.current: dict[int, int] = {}  # job → the limit last decided
        self.changed_at: dict[int, float] = {}
        self.decreased: dict[int, bool] = {}  # the last change was a cut
        self.decisions: list[Decision] = []  # the latest first, at most 100

    def tick(self, now: float) -> list[Decision]:
        out = []
        for job_id in self.view.job_ids():
            decision = self.decide(job_id, now)
            if decision is not None:
                out.append(decision)
        self.decisions = (out + self.decisions)[:100]
        return out

    def decide(self, job_id: int, now: float) -> Decision | None:
        slo, g = self.view.slo(job_id), self.limits
        if slo is None:
            return None
        cooling = now - self.changed_at.get(job_id, -math.inf) < g.cooldown_seconds
        replicas = [r for r in self.view.replicas(job_id, now) if now - r.last_seen <= 3 * g.window_seconds]
        current = (self.current.get(job_id) or max((r.batch_limit or 0 for r in replicas), default=0)
                   or self.view.router_limit(job_id, now) or 0)  # replicas the router holds (vLLM) say none
        stats = self.view.window(job_id, None, now, seconds=g.window_seconds)
        if not current or stats.requests < g.min_requests:
            return None
        tpot = buckets.quantile(stats.histograms.get("tpot", {}), 0.99)
        ttft = buckets.quantile(stats.histograms.get("ttft", {}), 0.99)
        waiting = self.view.queued(job_id, now, 3 * g.window_seconds)  # the engines' queues and the router's
        peak = self.view.peak_running(job_id, now, g.window_seconds)
        seen = (f"TTFT p99 {_ms(ttft)} (target {_ms(slo.ttft_seconds)}), TPOT p99 {_ms(tpot)} "
                f"(target {_ms(slo.tpot_seconds)}), {waiting} waiting, at most {peak} running on a replica")
        if tpot is not None and tpot > slo.tpot_seconds:
            if cooling:  # the last change has not reached the window yet
                return None
            after, why = max(g.min_limit, math.floor(current * g.decrease)), f"{seen}: TPOT over its target"
        else:
            step, why = self._raise(current, waiting, peak, len(replicas), tpot, slo.tpot_seconds, seen)
            if not step or (cooling and self.decreased.get(job_id)):  # no raise right after a cut: hysteresis
                return None
            after = min(g.max_limit, current + step)
        if after == current:
            return None
        self.current[job_id], self.changed_at[job_id], self.decreased[job_id] = after, now, after < current
        applied = False
        reason = f"batch limit {current} → {after}: {why}"
        if self.dry_run:
            log.info("batching (dry run, nothing issued): job=%d %s", job_id, reason)
        else:
            applied = self.apply(job_id, {"batch_limit": after}, reason) is not None
            log.info("batching: job=%d %s order=%s", job_id, reason, "issued" if applied else "not issued")
        return Decision(job_id, current, after, why, applied)


    def _raise(self, current: int, waiting: int, peak: int, replicas: int, tpot: float | None, target: float,
               seen: str) -> tuple[int, str]:
        """How much to raise the limit by (0: not), and why."""
        g, step, why = self.limits, 0, ""
        if waiting > 0 and (tpot is None or tpot < g.headroom * target):
            step = max(g.increase, min(current, math.ceil(waiting / max(replicas, 1))))
            why = f"{seen}: requests wait and TPOT has headroom"
        if (tpot is None or tpot < g.slack * target) and g.spare * peak > current:
            spare = min(2 * current, math.ceil(g.spare * peak)) - current
            if spare > step:
                step, why = spare, f"{seen}: the load reaches over 1/{g.spare:g} of the limit and TPOT is far " \
                                   "from its target: room for the next burst"
        return step, why


def _ms(seconds: float | None) -> str:
    return "n/a" if seconds is None else f"{seconds * 1000:.0f} ms"
