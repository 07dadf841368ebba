"""Task exits with a non-zero code or a signal, or exit 0 right after an error the SDK saw (SkyPilot #4421) or
with serving requests in flight (vLLM #48966): exits that lie. Handled as they arrive. One incident per job:
when a collective breaks, every rank exits within a second, and that is one failure, not world-size pages.
Exit 0 while the peers still wait is judged later, by the hang detector."""

from __future__ import annotations

from sentinel.detection.base import DetectionContext, Detector, register
from sentinel.detection.detectors._common import is_application
from sentinel.incidents.findings import Finding, OpenIncident, Subject
from sentinel.jobs.service import ClosedTask, describe_exit
from sentinel.live.faults import Fault
from sentinel.live.fleet import NodeLive
from sentinel.telemetry import schemas
from sentinel.telemetry.schemas import NodeReport, TaskFailure

CORRELATE_SECONDS = 120.0  # a hardware fault on the node this recently is the likelier cause


@register
class TaskExit(Detector):
    """A task that exited with a non-zero code, a signal, an exception, or 0 right after an error the SDK saw, on
    the report that carried the exit; one incident per job. Exits of an attempt Sentinel ordered replaced are
    expected and not judged. A hardware fault on the same node within the last 2 minutes is named as the likelier
    cause."""

    name = "task_exit"

    def on_report(self, ctx: DetectionContext, live: NodeLive, report: NodeReport,
                  exits: list[ClosedTask]) -> list[Finding]:
        findings = []
        # a job being restarted on an order: its old ranks are stopped on purpose, that is no failure
        failed = [c for c in exits if c.failure_reason and not ctx.restarting(c.job_id, c.attempt)]
        by_pid = {e.pid: e for e in report.task_exits}
        exceptions = {t.pid: t.failure for t in report.tasks if t.failure is not None}
        for closed in failed:
            ended = by_pid.get(closed.pid)
            observed = ended.observed_at if ended else ctx.clock.time()
            failure = exceptions.get(closed.pid)
            in_flight = 0
            if closed.failure_reason == "exit:0+in_flight":
                in_flight = max(1, ctx.serving.in_flight(closed.job_id, closed.rank, observed) if ctx.serving else 1)
            _, sentence = describe_exit(ended.exit_code if ended else None, ended.signal if ended else None,
                                        failure.type if failure else None, in_flight,
                                        serving=closed.failure_reason == "exit:0+serving")
            recent = [f for f in ctx.history.recent(observed, window_seconds=CORRELATE_SECONDS, node=live.name)
                      if f.severity != "info"]
            stats = ctx.jobs.job(closed.job_id)
            total_failures = sum(stats.failures.values())
            peers = sorted(r for r in stats.ranks if r != closed.rank)
            nodes = ", ".join(sorted({r.node for r in stats.ranks.values() if r.node})) or "unknown nodes"
            layer, cause = _cause(ctx, recent, ended, failure, observed, in_flight,
                                  serving=closed.failure_reason == "exit:0+serving")
            findings.append(Finding(
                detector=self.name, key=f"job={closed.job_id}", severity="warning",
                title=f"job {closed.job_id} rank {closed.rank} {sentence} on {live.name}", layer=layer,
                subject=Subject(node=live.name, job_id=closed.job_id, rank=closed.rank),
                seen=f"Rank {closed.rank} of job {closed.job_id} (pid {closed.pid}) on node {live.name} {sentence}. "
                     + cause,
                comparison=(f"The job's failure #{total_failures} since Sentinel has watched it; "
                            f"peer ranks {', '.join(map(str, peers[:16])) or 'none'} were running on "
                            f"{nodes}."),
                evidence={"exit": {"pid": closed.pid, "reason": closed.failure_reason,
                                   "exit_code": ended.exit_code if ended else None,
                                   "signal": ended.signal if ended else None, "observed_at": observed},
                          "exception": failure.model_dump() if failure else None,
                          "recent_faults": [{"kind": f.kind, "xid": f.xid, "accelerator": f.accelerator, "at": f.at}
                                            for f in recent[-10:]],
                          "failures_by_reason": dict(stats.failures)},
                next_steps=[f"The rank's log on {live.name} around the exit (pid {closed.pid})",
                            "If the node had a hardware fault, see that incident; otherwise `dmesg -T | grep -i -e "
                            "oom -e killed` for the OOM killer",
                            f"`sentinel jobs` and `GET /api/v1/jobs/{closed.job_id}` for its ranks and restarts"],
                action="restart_task", observed_at=observed))
        return findings

    def holds(self, ctx: DetectionContext, incident: OpenIncident, now: float) -> bool | None:
        """Clears once the job steps again after the incident opened (it was restarted or recovered)."""
        if incident.job_id is None:
            return None
        stats = ctx.jobs.find(incident.job_id)
        if stats is None:
            return True  # no telemetry of the job (yet): nothing shows it stepping again
        stepping = any(r.last_progress_at is not None and r.last_progress_at > incident.opened_at and not r.ended
                       for r in stats.ranks.values())
        return not stepping


def _cause(ctx: DetectionContext, recent: list[Fault], ended: schemas.TaskExit | None, failure: TaskFailure | None,
           observed: float, in_flight: int = 0, serving: bool = False) -> tuple[str, str]:
    """(layer, the likely cause in a sentence): a hardware fault just before, the job's own application XID,
    the OOM killer, an exception the SDK saw (an exit 0 after one lies), requests dropped by an exit 0, or
    nothing known."""
    faults = [f for f in recent if not is_application(ctx, f.kind, f.xid)]
    application = [f for f in recent if is_application(ctx, f.kind, f.xid)]
    if faults:
        return "hardware", ("It followed " + ", ".join(
            f"{f.kind}{' ' + str(f.xid) if f.xid is not None else ''} on {f.accelerator or f.node}"
            f" {observed - f.at:.1f}s earlier" for f in faults[-3:]) + ": the hardware is the likely cause.")
    if application:  # the job's own error reached the driver first (its job incident restarts it)
        return "software", ("It followed application " + ", ".join(
            f"XID {f.xid} on {f.accelerator}" for f in application[-3:]) + " (an illegal access or exception in "
            "the job's kernels): the job, not the hardware, is the likely cause.")
    if ended is not None and ended.signal == 9:
        return "software", "SIGKILL without a hardware fault: the kernel OOM killer or an operator."
    if failure is not None and ended is not None and ended.exit_code == 0:
        return "software", (f"The SDK saw a {failure.type} ({failure.message[:300]}) and the process then exited 0 "
                            "without a good step after it: an exit that lies, counted as a failure.")
    if failure is not None:
        return "software", f"The SDK saw an uncaught {failure.type}: {failure.message[:300]}"
    if in_flight:
        return "software", ("A serving process does not exit 0 with requests in flight unless it died: an engine "
                            "core that crashed and took its front end down cleanly (vLLM #48966). Its requests "
                            "were dropped; counted as a failure.")
    if serving:
        return "software", ("Neither Sentinel nor its launcher stopped it, and a serving replica does not end on its "
                            "own: an engine core that died and took its front end down cleanly (vLLM #48966), or "
                            "an engine that exited after an error it only logged. Read its log.")
    return "software", "No hardware fault was reported on the node around that time."
