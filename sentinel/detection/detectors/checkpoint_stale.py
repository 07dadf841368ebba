"""Checkpoints stopped while the job goes on: a restart now would redo everything since the last one."""

from __future__ import annotations

import itertools
import statistics

from sentinel.detection.base import DetectionContext, Detector, Evaluation, register
from sentinel.detection.detectors._common import evidence_window, minutes
from sentinel.incidents.findings import Finding, Subject


@register
class CheckpointStaleDetector(Detector):
    """A job that commits checkpoints regularly has committed none for `factor` × its usual interval
    (at least `min_seconds`) while it keeps stepping. Usually a full or failing disk, a rank whose saves
    fail, or ranks that cannot reach the catalog. Names the ranks missing from the newest uncommitted
    step. Jobs with fewer than `min_commits` commits have no usual interval and are not judged.

    Options (defaults): factor 3, min_seconds 120, min_commits 3. Layer: checkpoint_io.
    """

    name = "checkpoint_stale"
    periodic = True
    every = 30.0

    def evaluate(self, ctx: DetectionContext, now: float) -> Evaluation:
        if ctx.checkpoints is None:
            return Evaluation([], 0)
        jobs = {job.job_id: job for job in ctx.jobs.snapshot()}
        findings: list[Finding] = []
        subjects = 0
        for job_id in ctx.checkpoints.job_ids():
            ledger, job = ctx.checkpoints.view(job_id), jobs.get(job_id)
            if ledger is None or job is None or len(ledger.commits) < self.option("min_commits", 3):
                continue
            subjects += 1
            times = [at for at, _ in ledger.commits]
            usual = statistics.median(b - a for a, b in itertools.pairwise(times))
            last_at = ledger.commits[-1][0]
            limit = max(self.option("factor", 3.0) * usual, self.option("min_seconds", 120.0))
            progress = [r.last_progress_at for r in job.ranks.values() if not r.ended and r.last_progress_at]
            # it stepped past the time the next commit was due, and still does
            stepping = bool(progress) and max(progress) > last_at + limit and now - max(progress) < limit
            if now - last_at <= limit or not stepping:
                continue  # on time, or the job stopped (the hang and heartbeat detectors own that)
            current = max((r.last_step or 0) for r in job.ranks.values())
            findings.append(self._finding(job_id, now, list(ledger.commits), usual, limit, current,
                                          ledger.pending_step, ledger.pending_ranks, ledger.world_size))
        return Evaluation(findings, subjects)

    def _finding(self, job_id: int, now: float, history: list[tuple[float, int]], usual: float,
                 limit: float, current: int, pending: int | None, ranks_in: set[int], world: int) -> Finding:
        last_at, last_step = history[-1]
        if pending is not None:
            missing = sorted(set(range(world)) - ranks_in)
            save = (f"Its newest save, step {pending}, has shards from {len(ranks_in)} of {world} rank(s); "
                    f"missing: rank(s) {', '.join(map(str, missing[:16]))}.")
        else:
            save = "No rank has registered a shard of a newer step since."
        return Finding(
            detector=self.name, key=f"job={job_id}", severity="warning", layer="checkpoint_io",
            title=f"job {job_id}: no checkpoint committed for {minutes(now - last_at)} (usually every "
                  f"{minutes(usual)})",
            subject=Subject(job_id=job_id),
            seen=f"Job {job_id} last committed step {last_step} {minutes(now - last_at)} ago and kept stepping "
                 f"(now at step {current}). {save}",
            comparison=f"Its last {len(history)} commits came every {minutes(usual)} (median); the limit is "
                       f"{minutes(limit)}",
            evidence={"window": evidence_window("checkpoint_step", [at - now for at, _ in history],
                                                [float(step) for _, step in history]),
                      "pending_step": pending, "pending_ranks": sorted(ranks_in)},
            next_steps=[
                "On the missing ranks' nodes, look for `checkpoint save failed` or `checkpoint not registered` "
                "in the job's log",
                "Check free space and errors on the local tier (`df -h` on SENTINEL_CHECKPOINT_LOCAL_DIR) and on "
                "the shared tier",
                f"`GET /api/v1/jobs/{job_id}/checkpoints` lists the pending steps and their shards",
                f"A restart now resumes from step {last_step}: about {max(0, current - last_step)} steps would be "
                "recomputed"],
            observed_at=last_at + limit)
