"""A hung task: its process lives (no exit seen, its node reports) but its step count stopped moving.

The limit adapts to the job: max(hang_min_seconds, hang_step_factor × the rank's p95 step time,
3 of its node's report intervals); before the first step it is hang_startup_seconds (loading a
model is not a hang). When one rank hangs, its peers block in the next collective and stop too:
that is one incident per job, naming the rank that stopped first as the likely culprit.
"""

from __future__ import annotations

import statistics

from sentinel.detection.base import DetectionContext, Detector, Evaluation, register
from sentinel.incidents.findings import Finding, Subject
from sentinel.live.jobs import RankStats


@register
class HungTask(Detector):
    """A rank whose process lives but whose step count stopped moving; one incident per job, naming the rank
    that stopped first (its peers block in the next collective behind it).

    Options (defaults): none of its own beyond `every` (each round); its limits are server settings,
    hang_min_seconds (5), hang_step_factor (20) × the rank's p95 step, and hang_startup_seconds (600) before
    the first step. Layer: software, or compute when the stalled rank's accelerator is pinned at 100 %.
    """

    name = "hang"
    periodic = True

    def _limit(self, rank: RankStats, interval: float) -> float:
        s = self.settings
        if rank.last_progress_at is None:
            return s.hang_startup_seconds
        steps = sorted(seconds for _, seconds in rank.recent) or sorted(rank.step_seconds)
        p95 = steps[min(len(steps) - 1, int(0.95 * len(steps)))] if steps else 0.0
        return max(s.hang_min_seconds, s.hang_step_factor * p95, 3 * interval)

    def evaluate(self, ctx: DetectionContext, now: float) -> Evaluation:
        findings: list[Finding] = []
        jobs = ctx.jobs.snapshot()
        for job in jobs:
            live_ranks = [r for r in job.ranks.values() if not r.ended]
            stalled: list[tuple[RankStats, float, float]] = []
            for rank in live_ranks:
                node = ctx.fleet.get(rank.node)
                if node is None or node.state == "down" or now - node.last_seen > 2 * node.interval_seconds:
                    continue  # a silent node is the heartbeat detector's, not a hang
                since = rank.last_progress_at if rank.last_progress_at is not None else rank.first_seen
                if now - since <= max(self.settings.hang_min_seconds, 3 * node.interval_seconds):
                    continue  # below the floor of every limit: skip the rank's own (the common, healthy case)
                limit = self._limit(rank, node.interval_seconds)
                if now - since > limit:
                    stalled.append((rank, since, limit))
            if not stalled:
                continue
            # The first rank past its limit need not be the culprit (progress arrives per agent interval):
            # every rank silent for half its limit is a candidate; the pinned accelerator decides.
            placed = {t.rank: node_id for node_id, tasks in ctx.assignments().items() for t in tasks
                      if t.job_id == job.job_id}
            for missing in sorted(set(placed) - set(job.ranks)):  # placed, but never reported a step
                live = ctx.fleet.by_id(placed[missing])
                if live is not None:
                    live_ranks.append(RankStats(missing, node=live.name, first_seen=job.first_seen))
            for rank in live_ranks:
                node = ctx.fleet.get(rank.node)
                since = rank.last_progress_at if rank.last_progress_at is not None else rank.first_seen
                if node is not None and all(r is not rank for r, _, _ in stalled):
                    limit = self._limit(rank, node.interval_seconds)
                    if now - since > min(limit, self.settings.hang_min_seconds) / 2:
                        stalled.append((rank, since, limit))
            findings.append(self._finding(ctx, job.job_id, stalled, len(live_ranks), now))
        return Evaluation(findings, len(jobs))

    def _finding(self, ctx: DetectionContext, job_id: int, stalled: list[tuple[RankStats, float, float]],
                 ranks: int, now: float) -> Finding:
        def suspicion(item: tuple[RankStats, float, float]) -> tuple[int, float]:
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
        steps = [seconds for _, seconds in first.recent] or list(first.step_seconds)
        median = statistics.median(steps) if steps else None
        silent = now - since
        if first.last_progress_at is None:
            seen = f"Rank {first.rank} of job {job_id} has not finished a first step {silent:.0f}s after it started"
        else:
            seen = (f"Rank {first.rank} of job {job_id} has made no step progress for {silent:.1f}s "
                    f"(last step {first.last_step}; limit {limit:.1f}s"
                    + (f", its median step is {median:.3f}s" if median is not None else "") + ")")
        seen += f" while its process is alive on {node}."
        if len(stalled) > 1:
            seen += (f" {len(stalled)} of {ranks} ranks stalled; rank {first.rank} stopped first, the others "
                     "are most likely blocked in a collective waiting for it.")
        if utils:
            seen += f" Its accelerator utilization is {max(utils):.0%}."
        layer = "compute" if pinned else "software"
        return Finding(
            detector=self.name, key=f"job={job_id}", severity="critical",
            title=f"job {job_id} hung: rank {first.rank} on {node} stopped stepping {silent:.0f}s ago",
            layer=layer, subject=Subject(node=node, accelerator=uuids[0] if len(uuids) == 1 else None,
                                         job_id=job_id, rank=first.rank),
            seen=seen,
            comparison=(f"Its usual step takes {median:.3f}s, so {silent / median:.0f} steps' worth of time passed "
                        "without one" if median else "No completed step to compare with yet"),
            evidence={"stalled_ranks": [{"rank": r.rank, "node": r.node, "last_step": r.last_step,
                                         "since": s, "limit_seconds": lim} for r, s, lim in stalled[:64]],
                      "accelerators": uuids, "utilization": utils},
            next_steps=[f"`py-spy dump --pid <pid>` on {node} for rank {first.rank}: where is it stuck?",
                        "Accelerator busy at 100% with no progress: a hung kernel or NCCL/gloo wait; idle: a "
                        "deadlock, a stuck data loader or a filesystem read",
                        "Peers blocked in all-reduce point at the rank that never arrived"],
            # an accelerator stuck at 100% with its task frozen is suspect: take it out and move the job
            action="reset_accelerator" if pinned and len(uuids) == 1 else "restart_task", observed_at=since + limit)
