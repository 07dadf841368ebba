"""A hung task: its process lives (no exit seen, its node reports) but its step count stopped moving.

The limit is the rank's own cadence, not a fixed time: the largest of
- hang_min_seconds (1 s), the floor;
- hang_step_factor (10) × its usual step: the median step, or its wall time per step where that is longer
  (time between steps, e.g. loading data, counts);
- 1.5 × its slowest step in the window (a rank that took a slow step lately may take another);
- the freshness of the data: 1.25 report intervals + the SDK's 1 s flush. A step is known here only once its
  batch has ridden a report, so a healthy rank can look that silent; no hang can be judged sooner.
Before its first step, and while it warms up (the first 5 steps of an attempt: compilation, caches, the data
loader starting), the limit is hang_startup_seconds: loading a model is not a hang, and a cadence needs steps.

Slow on purpose: a rank inside the SDK's `pause()` (CheckpointManager marks its saves; a job marks its
evaluation) is not judged by its cadence, nor are its peers, which wait for it in the next collective; only a
pause longer than hang_pause_seconds is a hang. Once the pause ends, the job's silence counts from its end.

Exits that lie (SkyPilot #4421, vLLM #48966): when a rank of the running attempt has exited 0 (or with a status
not known here) and its peers still run without stepping, they may be finishing (a normal end: every rank
exits within seconds; rank 0 may still save). hang_exit_grace_seconds after the exit, those still waiting make
it a failure: "exited 0 while its peers still waited: counted as a failure", naming the rank that left.

When one rank hangs, its peers block in the next collective and stop too: that is one incident per job,
naming the rank that stopped first as the likely culprit.
"""

from __future__ import annotations

from typing import Any

from sentinel.detection.base import DetectionContext, Detector, Evaluation, register
from sentinel.incidents.findings import Finding, Subject
from sentinel.live.jobs import JobStats, RankStats
from sentinel.sdk.telemetry import FLUSH_INTERVAL_SECONDS

SLOW_STEP_MARGIN = 1.5
JITTER_INTERVALS = 0.25  # reports arrive on the agent's grid, give or take collection and transport
Stalled = tuple[RankStats, float, float]  # (rank, silent since, its limit)


def freshness_seconds(interval: float) -> float:
    """How stale a healthy rank's progress can look: a batch that just missed a report rides the next one."""
    return (1 + JITTER_INTERVALS) * interval + FLUSH_INTERVAL_SECONDS


def _since(rank: RankStats, resumed: float | None) -> float:
    since = rank.last_progress_at if rank.last_progress_at is not None else rank.first_seen
    return max(since, resumed) if resumed is not None else since


@register
class HungTask(Detector):
    """A rank whose process lives but whose step count stopped moving for longer than its own cadence allows
    (see the module for the rule); one incident per job, naming the rank that stopped first (its peers block in
    the next collective behind it), or the rank that exited 0 while its peers still waited.

    Options (defaults): none of its own beyond `every` (each round); its limits are server settings,
    hang_min_seconds (1), hang_step_factor (10) × the rank's usual step, hang_startup_seconds (600) before the
    first step, hang_pause_seconds (1800) for a declared pause, hang_exit_grace_seconds (60) after a rank exits.
    Layer: software, or compute when the stalled rank's accelerator is pinned at 100 %.
    """

    name = "hang"
    periodic = True

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._lying: dict[int, tuple[int, int]] = {}  # job → (attempt, rank) found exiting 0 early, last round

    def limit(self, ctx: DetectionContext, job_id: int, rank: RankStats, interval: float) -> float:
        """How long this rank may go without a step before it is hung."""
        s = self.settings
        profile = ctx.jobs.step_profile(job_id, rank.rank)
        if rank.last_progress_at is None or profile is None or profile.warming_up:
            return s.hang_startup_seconds  # its first steps have no cadence yet: compiling, loading, caching
        usual = max(profile.median or 0.0, profile.wall_per_step or 0.0)
        return max(s.hang_min_seconds, freshness_seconds(interval), s.hang_step_factor * usual,
                   SLOW_STEP_MARGIN * (profile.slowest or 0.0))

    def evaluate(self, ctx: DetectionContext, now: float) -> Evaluation:
        jobs = ctx.jobs.snapshot()
        findings = [finding for job in jobs if (finding := self._judge(ctx, job, now)) is not None]
        self._lying = {f.evidence["exit"]["job_id"]: (f.evidence["exit"]["attempt"], f.evidence["exit"]["rank"])
                       for f in findings if "exit" in f.evidence}
        return Evaluation(findings, len(jobs))

    def _judge(self, ctx: DetectionContext, job: JobStats, now: float) -> Finding | None:
        s = self.settings
        live = [r for r in job.ranks.values() if not r.ended]
        if not live:
            return None
        paused = [r for r in live if r.pause is not None]
        if paused:  # the job waits on a declared pause (its peers in the next collective): only its length counts
            over = [(r, r.paused_at, s.hang_pause_seconds) for r in paused
                    if r.paused_at is not None and now - r.paused_at > s.hang_pause_seconds]
            return self._finding(ctx, job.job_id, over, len(live), now) if over else None
        left = self._left(ctx, job, live)
        if left is not None and left.ended_at is not None:
            waiting = [r for r in live if self._waiting(ctx, r, left.ended_at, now)]
            if now - left.ended_at > s.hang_exit_grace_seconds and waiting:
                return self._exit_finding(ctx, job.job_id, left, waiting, now)
            finishing = {id(r) for r in waiting}  # perhaps: not judged until the grace is over
            live = [r for r in live if id(r) not in finishing]
        resumed = max((r.pause_ended_at for r in job.ranks.values() if r.pause_ended_at is not None), default=None)
        stalled = self._stalled(ctx, job.job_id, live, resumed, now)
        if not stalled:
            return None
        self._add_candidates(ctx, job, live, stalled, resumed, now)
        return self._finding(ctx, job.job_id, stalled, len(live), now)

    def _interval(self, ctx: DetectionContext, rank: RankStats, now: float) -> float | None:
        """The report interval of the rank's node; None while the node is silent (the heartbeat detector's)."""
        node = ctx.fleet.get(rank.node)
        if node is None or node.state == "down" or now - node.last_seen > 2 * node.interval_seconds:
            return None
        return node.interval_seconds

    def _stalled(self, ctx: DetectionContext, job_id: int, ranks: list[RankStats], resumed: float | None,
                 now: float) -> list[Stalled]:
        stalled: list[Stalled] = []
        for rank in ranks:
            interval = self._interval(ctx, rank, now)
            if interval is None:
                continue
            since = _since(rank, resumed)
            if now - since <= max(self.settings.hang_min_seconds, freshness_seconds(interval)):
                continue  # below the floor of every limit: no profile read (the common, healthy case)
            limit = self.limit(ctx, job_id, rank, interval)
            if now - since > limit:
                stalled.append((rank, since, limit))
        return stalled

    def _add_candidates(self, ctx: DetectionContext, job: JobStats, live: list[RankStats], stalled: list[Stalled],
                        resumed: float | None, now: float) -> None:
        """The first rank past its limit need not be the culprit (progress arrives per agent interval): every rank
        silent for half the floor of its limit is a candidate, and so is one placed that never reported; the
        pinned accelerator decides."""
        placed = {t.rank: node_id for node_id, tasks in ctx.assignments().items() for t in tasks
                  if t.job_id == job.job_id}
        candidates = list(live)
        for missing in sorted(set(placed) - set(job.ranks)):
            node = ctx.fleet.by_id(placed[missing])
            if node is not None:
                candidates.append(RankStats(missing, node=node.name, first_seen=job.first_seen))
        for rank in candidates:
            node = ctx.fleet.get(rank.node)
            if node is None or any(r is rank for r, _, _ in stalled):
                continue
            since = _since(rank, resumed)
            floor = max(self.settings.hang_min_seconds, freshness_seconds(node.interval_seconds))
            if now - since > floor / 2:
                stalled.append((rank, since, self.limit(ctx, job.job_id, rank, node.interval_seconds)))

    def _left(self, ctx: DetectionContext, job: JobStats, live: list[RankStats]) -> RankStats | None:
        """The first rank of the running attempt that exited 0 (or with a status not known here) while others
        still run. An exit that failed is the task_exit detector's; one after Sentinel ordered the attempt replaced
        is expected (its launcher stops the ranks), unless it was found lying before the order."""
        attempts = {r.attempt for r in live}
        left = [r for r in job.ranks.values() if r.ended and r.ended_at is not None and r.attempt in attempts
                and r.exit_reason in ("", None) and (not ctx.restarting(job.job_id, r.attempt)
                                                      or self._lying.get(job.job_id) == (r.attempt, r.rank))]
        return min(left, key=lambda r: r.ended_at or 0.0) if left else None

    def _waiting(self, ctx: DetectionContext, rank: RankStats, exited_at: float, now: float) -> bool:
        """No step seen since the exit (steps made before it may still arrive one flush and report later)."""
        interval = self._interval(ctx, rank, now)
        return interval is not None and (rank.last_progress_at is None
                                         or rank.last_progress_at <= exited_at + freshness_seconds(interval))

    def _exit_finding(self, ctx: DetectionContext, job_id: int, left: RankStats, waiting: list[RankStats],
                      now: float) -> Finding:
        assert left.ended_at is not None
        grace = self.settings.hang_exit_grace_seconds
        how = "exited 0" if left.exit_reason == "" else "ended (exit status not known)"
        peers = ", ".join(str(r.rank) for r in sorted(waiting, key=lambda r: r.rank)[:16])
        node = left.node or "its node"
        return Finding(
            detector=self.name, key=f"job={job_id}", severity="critical", layer="software",
            title=f"job {job_id} rank {left.rank} {how} on {node} while its peers still waited: counted as a failure",
            subject=Subject(node=left.node or None, job_id=job_id, rank=left.rank),
            seen=(f"Rank {left.rank} of job {job_id} (pid {left.pid}) {how} on {node} at step {left.last_step}; "
                  f"{now - left.ended_at:.0f}s later {len(waiting)} peer rank(s) ({peers}) still run and have not "
                  f"stepped since. {how.capitalize()} while its peers still waited: counted as a failure."),
            comparison=(f"A job that ends normally has every rank exit within {grace:.0f}s of the first "
                        "(hang_exit_grace_seconds); its peers' last steps are "
                        + ", ".join(f"rank {r.rank} at {r.last_step}" for r in waiting[:8]) + "."),
            evidence={"exit": {"job_id": job_id, "attempt": left.attempt, "rank": left.rank, "pid": left.pid,
                               "node": left.node, "last_step": left.last_step, "reason": "exit:0+peers-waiting",
                               "exit_reason": left.exit_reason, "ended_at": left.ended_at},
                      "waiting_ranks": [{"rank": r.rank, "node": r.node, "last_step": r.last_step,
                                         "last_progress_at": r.last_progress_at} for r in waiting[:64]]},
            next_steps=[f"The log of rank {left.rank} on {node} just before it exited: a caught NCCL/gloo error or a "
                        "dead engine turned into exit 0 (SkyPilot #4421, vLLM #48966)",
                        f"`py-spy dump --pid <pid>` on a waiting peer (rank {waiting[0].rank}): blocked in a "
                        "collective for the rank that left",
                        "Make the script or launcher exit non-zero after a collective error"],
            action="restart_task", observed_at=left.ended_at + grace)

    def _seen(self, job_id: int, first: RankStats, limit: float, silent: float, usual: float | None) -> str:
        if first.pause is not None:
            return (f"Rank {first.rank} of job {job_id} has been in a {first.pause.reason} pause for {silent:.0f}s "
                    f"(limit {limit:.0f}s, hang_pause_seconds) at step {first.last_step}")
        if first.last_progress_at is None:
            return f"Rank {first.rank} of job {job_id} has not finished a first step {silent:.0f}s after it started"
        return (f"Rank {first.rank} of job {job_id} has made no step progress for {silent:.1f}s "
                f"(last step {first.last_step}; limit {limit:.1f}s"
                + (f", its usual step is {usual:.3f}s" if usual is not None else "") + ")")

    def _finding(self, ctx: DetectionContext, job_id: int, stalled: list[Stalled], ranks: int,
                 now: float) -> Finding:
        def suspicion(item: Stalled) -> tuple[int, float]:
            rank, since, _ = item
            _, uuids = ctx.placement(job_id, rank.rank)
            pinned = 0
            for uuid in uuids:
                latest = ctx.samples.latest(uuid)
                if latest is not None and latest[1].utilization_ratio >= 0.99:
                    pinned = 1
            return (-pinned, since)  # a frozen rank on a pinned accelerator is the culprit; its peers just wait

        stalled.sort(key=suspicion)
        first, since, limit = stalled[0]
        node, uuids = ctx.placement(job_id, first.rank)
        node = node or first.node
        samples = [ctx.samples.latest(u) for u in uuids]
        utils = [s[1].utilization_ratio for s in samples if s is not None]
        pinned = bool(utils) and min(utils) >= 0.99
        profile = ctx.jobs.step_profile(job_id, first.rank)
        usual = (profile.wall_per_step or profile.median) if profile is not None else None
        silent = now - since
        seen = self._seen(job_id, first, limit, silent, usual) + f" while its process is alive on {node}."
        if len(stalled) > 1:
            seen += (f" {len(stalled)} of {ranks} ranks stalled; rank {first.rank} stopped first, the others "
                     "are most likely blocked in a collective waiting for it.")
        if utils:
            seen += f" Its accelerator utilization is {max(utils):.0%}."
        return Finding(
            detector=self.name, key=f"job={job_id}", severity="critical",
            title=f"job {job_id} hung: rank {first.rank} on {node} stopped stepping {silent:.0f}s ago",
            layer="compute" if pinned else "software",
            subject=Subject(node=node, accelerator=uuids[0] if len(uuids) == 1 else None, job_id=job_id,
                            rank=first.rank),
            seen=seen,
            comparison=(f"Its usual step takes {usual:.3f}s, so {silent / usual:.0f} steps' worth of time passed "
                        "without one" if usual else "No completed step to compare with yet"),
            evidence={"stalled_ranks": [{"rank": r.rank, "node": r.node, "last_step": r.last_step,
                                         "since": s, "limit_seconds": lim} for r, s, lim in stalled[:64]],
                      "accelerators": uuids, "utilization": utils},
            next_steps=[f"`py-spy dump --pid <pid>` on {node} for rank {first.rank}: where is it stuck?",
                        "Accelerator busy at 100% with no progress: a hung kernel or NCCL/gloo wait; idle: a "
                        "deadlock, a stuck data loader or a filesystem read",
                        "Peers blocked in all-reduce point at the rank that never arrived"],
            # an accelerator stuck at 100% with its task frozen is suspect: take it out and move the job
            action="reset_accelerator" if pinned and len(uuids) == 1 else "restart_task", observed_at=since + limit)
