"""Slowdown attribution as incidents: a job slower than its own baseline, with the layer and component it comes
from, the evidence, what was ruled out and the experiment that would confirm it (sentinel/diagnosis/)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from sentinel.detection.base import DetectionContext, Detector, Evaluation, register
from sentinel.detection.detectors._common import evidence_window
from sentinel.diagnosis.attribution import Thresholds
from sentinel.diagnosis.engine import Options
from sentinel.diagnosis.schemas import Diagnosis
from sentinel.incidents.findings import Finding, Subject

if TYPE_CHECKING:
    from sentinel.config import Settings


@register
class SlowdownDetector(Detector):
    """A job whose iteration (wall time per step) is `margin` above its baseline for `persist_seconds`, named by
    the step component that grew (compute, communication, all-to-all, data wait, checkpoint, host, idle) and
    the layer it points at, refined by node signals (throttling, CPU wait, memory pressure, NIC and mesh).

    The baseline is learnt per rank and component from `baseline_seconds` of telemetry once `warmup_seconds`
    have passed, and compared with the last `recent_seconds`; a component must explain `explain` of the rise.
    Options (defaults): warmup_seconds 10, baseline_seconds 20, recent_seconds 10, persist_seconds 4,
    margin 0.2, explain 0.4, cpu_wait_rise 0.15, clock_drop 0.15, imbalance_rise 1.3.
    """

    name = "slowdown"
    periodic = True
    every = 2.0

    def __init__(self, settings: Settings):
        super().__init__(settings)
        self.history: dict[int, list[tuple[float, float]]] = {}  # job → (at, iteration seconds), for the window

    def options(self) -> Options:
        t = Thresholds(margin=self.option("margin", 0.2), explain=self.option("explain", 0.4),
                       cpu_wait_rise=self.option("cpu_wait_rise", 0.15), clock_drop=self.option("clock_drop", 0.15),
                       imbalance_rise=self.option("imbalance_rise", 1.3))
        return Options(warmup_seconds=self.option("warmup_seconds", 10.0),
                       baseline_seconds=self.option("baseline_seconds", 20.0),
                       recent_seconds=self.option("recent_seconds", 10.0),
                       persist_seconds=self.option("persist_seconds", 4.0), thresholds=t)

    def evaluate(self, ctx: DetectionContext, now: float) -> Evaluation:
        if ctx.diagnosis is None:
            return Evaluation([], 0)
        diagnoses = ctx.diagnosis.evaluate(ctx, now, self.options())
        for job_id in ctx.diagnosis.store.job_ids():
            status = ctx.diagnosis.report(job_id)
            if status is not None and status.current_iteration_seconds is not None:
                points = self.history.setdefault(job_id, [])
                points.append((now, status.current_iteration_seconds))
                del points[:-60]
        for job_id in [j for j in self.history if j not in ctx.diagnosis.store.job_ids()]:
            del self.history[job_id]
        return Evaluation([self._finding(d, now) for d in diagnoses], len(ctx.diagnosis.store.job_ids()))

    def _finding(self, d: Diagnosis, now: float) -> Finding:
        points = self.history.get(d.job_id, [])
        top = d.changes[0] if d.changes else None
        grew = (f"; {top.component} {top.before_seconds * 1000:.1f} → {top.after_seconds * 1000:.1f} ms per step "
                f"({top.share_before:.0%} → {top.share_after:.0%} of it)") if top else ""
        return Finding(
            detector=self.name, key=f"job={d.job_id}", severity="warning",
            title=f"job {d.job_id} slower by {d.slowdown:.0%}: {d.layer} ({d.component})"[:200],
            layer=d.layer, subject=Subject(job_id=d.job_id, rank=d.ranks[0] if len(d.ranks) == 1 else None,
                                           node=d.nodes[0] if len(d.nodes) == 1 else None),
            seen=f"{d.title}{grew}",
            comparison=f"the job's own baseline per rank and step component (learnt after "
                       f"{self.option('warmup_seconds', 10.0):.0f} s of warm-up over "
                       f"{self.option('baseline_seconds', 20.0):.0f} s), the last "
                       f"{self.option('recent_seconds', 10.0):.0f} s against it, and the job's other ranks",
            evidence={"window": evidence_window("iteration_seconds", [at - now for at, _ in points],
                                                [v for _, v in points]),
                      "attribution": _compact(d)},
            next_steps=d.next_steps or ["GET /api/v1/jobs/{id}/diagnosis"],
            observed_at=d.onset_at)


def _compact(d: Diagnosis) -> dict[str, object]:
    """The diagnosis as the incident keeps it: everything but the experiment list (the API has it, current)."""
    out = d.model_dump(mode="json", exclude={"experiments", "next_steps"})
    out["changes"] = out["changes"][:4]
    return out
