"""Fatal and notable hardware events, classified by the fault catalog, handled as they arrive.

Two kinds of finding:
* **per accelerator** (`node=…|accelerator=…|xid=…`): a hardware-class fault, acted on as the catalog says
  (a fatal XID takes the accelerator or node out of service);
* **per job** (`job=…|application`): an application-class XID (catalog `origin = "application"`: 13, 31,
  43, 45 and NVIDIA's RESTART_APP family) on an accelerator running a task. A job's bug hits every
  accelerator it runs on at once; that storm is one incident that restarts the task and drains nothing
  (NVSentinel #1710, PR #1629). It needs corroboration to become the accelerator's problem: the same
  accelerator raising an application XID under a *different* job within the lemon window opens a
  per-accelerator `probe` finding (a failed probe quarantines it); a hardware-class event on it opens its
  own incident as usual.

Repeats fold: the agent sends a repeated event once with a `count`, and a report's identical events are
one finding here; the incident's `occurrences` add up the counts.
"""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

from sentinel.detection.base import DetectionContext, Detector, register
from sentinel.detection.catalog import CatalogEntry
from sentinel.detection.detectors._common import is_application
from sentinel.incidents.findings import Finding, OpenIncident, Subject
from sentinel.jobs.service import ClosedTask
from sentinel.live.faults import Fault
from sentinel.live.fleet import NodeLive
from sentinel.telemetry.schemas import Assignment, HardwareEvent, NodeReport

STORM_SECONDS = 300.0  # an application storm's accelerators: those with an application XID this recently
CORROBORATION_SECONDS = 7 * 86400.0  # an application XID under another job this recently makes a suspect


def _when(ts: float) -> str:
    return datetime.fromtimestamp(ts, UTC).strftime("%H:%M:%S.%f")[:-3] + "Z"


def _xid(fault: Fault | HardwareEvent) -> str:
    return f"{fault.kind}{' ' + str(fault.xid) if fault.xid is not None else ''}"


@register
class HardwareEvents(Detector):
    """One incident per (node, accelerator, fault); critical ones stay open until a person or remediation
    closes them. An application-class XID on a running task is one incident per job instead, which clears
    once the job steps again. Informational records (catalog severity info, action record) open nothing."""

    name = "hardware"

    def on_report(self, ctx: DetectionContext, live: NodeLive, report: NodeReport,
                  exits: list[ClosedTask]) -> list[Finding]:
        found: dict[str, Finding] = {}
        placed = ctx.assignments().get(live.id, [])
        for event in report.events:
            entry = ctx.catalog.lookup(event)
            if not entry.opens_incident:
                continue
            uuid = event.accelerator_uuid
            tasks = [t for t in placed if uuid is None or uuid in t.accelerators]
            if entry.application and uuid and tasks:
                new = [self._job_finding(ctx, live, report, event, entry, job, tasks)
                       for job in sorted({t.job_id for t in tasks})]
                suspect = self._suspect(ctx, live, event, entry, tasks)
                new += [suspect] if suspect is not None else []
            else:
                new = [self._accelerator_finding(ctx, live, report, event, entry, tasks)]
            for finding in new:
                finding.occurrences = event.count
                earlier = found.get(finding.fingerprint)
                if earlier is not None:  # the same fault twice in one report: one finding, counted
                    finding.occurrences += earlier.occurrences
                    finding.observed_at = min(earlier.observed_at or event.observed_at, event.observed_at)
                found[finding.fingerprint] = finding
        return list(found.values())

    def _accelerator_finding(self, ctx: DetectionContext, live: NodeLive, report: NodeReport, event: HardwareEvent,
                             entry: CatalogEntry, tasks: list[Assignment]) -> Finding:
        uuid = event.accelerator_uuid
        values = {"node": live.name, "accelerator": uuid or "(node)", "xid": event.xid, "nic": event.nic or "?"}
        what = f"XID {event.xid} {entry.headline(**values)}" if event.kind == "xid" else entry.headline(**values)
        where = f"{uuid} on {live.name}" if uuid else live.name
        earlier = [f for f in ctx.history.recent(event.observed_at, accelerator=uuid, node=live.name)
                   if f.at < event.observed_at] if uuid else []
        node_faults = [f for f in ctx.history.recent(event.observed_at, node=live.name) if f.at < event.observed_at]
        latest = ctx.samples.latest(uuid) if uuid else None
        seen = f"{what} on {'accelerator ' if uuid else 'node '}{where} at {_when(event.observed_at)}{_times(event)}" \
               f" (agent report seq {report.seq}). {entry.explanation}"
        if event.message:
            seen += f" Agent said: {event.message}"
        if tasks:
            seen += " Running there: " + ", ".join(f"job {t.job_id} rank {t.rank}" for t in tasks) + "."
        history = (f"This accelerator had {len(earlier)} earlier fault(s) and node {live.name} "
                   f"{len(node_faults)} in the last {ctx.history.window_seconds / 86400:g} days")
        if earlier:
            history += "; the latest: " + ", ".join(f"{_xid(f)} at {_when(f.at)}" for f in earlier[-3:])
        return Finding(
            detector=self.name,
            key=f"node={live.name}|accelerator={uuid or '-'}|{event.kind}={'' if event.xid is None else event.xid}"
                + (f"|nic={event.nic}" if event.nic else ""),
            severity=entry.severity, title=f"{what} on {where}", layer=entry.layer,
            subject=Subject(node=live.name, accelerator=uuid,
                            job_id=tasks[0].job_id if len(tasks) == 1 else None,
                            rank=tasks[0].rank if len(tasks) == 1 else None),
            seen=seen, comparison=history + ".",
            evidence={"event": _event(event, report.seq),
                      "latest_sample": latest[1].model_dump(exclude={"processes"}) if latest else None,
                      "tasks": [{"job": t.job_id, "rank": t.rank, "pid": t.pid} for t in tasks],
                      "earlier_faults": [{"kind": f.kind, "xid": f.xid, "at": f.at} for f in earlier[-10:]]},
            next_steps=entry.steps(**values), action=entry.action, observed_at=event.observed_at,
            latched=entry.severity == "critical")

    def _job_finding(self, ctx: DetectionContext, live: NodeLive, report: NodeReport, event: HardwareEvent,
                     entry: CatalogEntry, job_id: int, tasks: list[Assignment]) -> Finding:
        """An application XID on one of the job's accelerators: the job's incident, counting every accelerator
        of the job that raised one in the last minutes (the storm)."""
        mine = {u for ts in ctx.assignments().values() for t in ts if t.job_id == job_id for u in t.accelerators}
        storm = [f for f in ctx.history.recent(event.observed_at, window_seconds=STORM_SECONDS)
                 if f.accelerator in mine and is_application(ctx, f.kind, f.xid)]
        hit = sorted({f.accelerator for f in storm if f.accelerator} | {event.accelerator_uuid or ""} - {""})
        nodes = sorted({f.node for f in storm} | {live.name})
        codes = sorted({f.xid for f in storm if f.xid is not None} | {event.xid or 0} - {0})
        hardware = [f for f in ctx.history.recent(event.observed_at, window_seconds=STORM_SECONDS)
                    if f.accelerator in hit and not is_application(ctx, f.kind, f.xid) and f.severity != "info"]
        values = {"node": live.name, "accelerator": event.accelerator_uuid or "", "xid": event.xid}
        ranks = sorted({t.rank for t in tasks if t.job_id == job_id})
        seen = (f"XID {event.xid} ({entry.headline(**values)}) on {event.accelerator_uuid} on {live.name} at "
                f"{_when(event.observed_at)}{_times(event)}, rank(s) {', '.join(map(str, ranks))} of job {job_id}. "
                f"{entry.explanation} Application XIDs on {len(hit)} of the job's {len(mine)} accelerator(s) "
                f"on {len(nodes)} node(s) in the last {STORM_SECONDS / 60:g} min: one fault of the job, not of "
                "its hardware, so the task restarts and nothing is drained.")
        if hardware:
            seen += (" Hardware-class events on the same accelerators (" + ", ".join(
                f"{_xid(f)} on {f.accelerator}" for f in hardware[-3:]) + ") have their own incidents.")
        return Finding(
            detector=self.name, key=f"job={job_id}|application", severity="warning",
            title=f"job {job_id}: application XID {'/'.join(map(str, codes))} on {len(hit)} accelerator(s) of "
                  f"{len(nodes)} node(s)", layer="software",
            subject=Subject(job_id=job_id, node=live.name if len(nodes) == 1 else None),
            seen=seen, comparison=f"{len(hit)} of the job's {len(mine)} accelerators; a faulty accelerator "
                                  "raises it alone, a job's bug raises it wherever the job runs.",
            evidence={"event": _event(event, report.seq), "accelerators": hit, "nodes": nodes, "xids": codes,
                      "storm": [{"accelerator": f.accelerator, "node": f.node, "xid": f.xid, "at": f.at}
                                for f in storm[-20:]]},
            next_steps=[f"The job's log near {_when(event.observed_at)}: the CUDA error (illegal address, "
                        "assert, MMU fault) names the kernel; it is usually the job or a library",
                        f"`sentinel jobs` and `GET /api/v1/jobs/{job_id}` for its restarts",
                        "If the same accelerator raises it again under another job, Sentinel probes it"],
            action="restart_task", observed_at=event.observed_at)

    def _suspect(self, ctx: DetectionContext, live: NodeLive, event: HardwareEvent, entry: CatalogEntry,
                 tasks: list[Assignment]) -> Finding | None:
        """Corroboration: the accelerator raised an application XID under another job too. Probe it."""
        uuid = event.accelerator_uuid
        jobs = {t.job_id for t in tasks}
        others = [f for f in ctx.history.recent(event.observed_at, window_seconds=CORROBORATION_SECONDS,
                                                accelerator=uuid)
                  if f.at < event.observed_at and f.job is not None and f.job not in jobs
                  and is_application(ctx, f.kind, f.xid)]
        if not others or uuid is None:
            return None
        before = others[-1]
        return Finding(
            detector=self.name, key=f"node={live.name}|accelerator={uuid}|application", severity="warning",
            title=f"accelerator {uuid} on {live.name}: application XIDs under {len({f.job for f in others}) + 1} "
                  "different jobs", layer="hardware", subject=Subject(node=live.name, accelerator=uuid),
            seen=f"XID {event.xid} under job {', '.join(map(str, sorted(jobs)))} at {_when(event.observed_at)}, "
                 f"after {_xid(before)} under job {before.job} at {_when(before.at)}: the fault follows the "
                 "accelerator, not the job.",
            comparison=f"{len(others)} earlier application XID(s) on it under other jobs in "
                       f"{CORROBORATION_SECONDS / 86400:g} days",
            evidence={"event": _event(event, 0), "other_jobs": [{"job": f.job, "xid": f.xid, "at": f.at}
                                                                for f in others[-10:]]},
            next_steps=["Sentinel probes it; a failed probe takes it out of service",
                        f"`dcgmi diag -r 3 -i {uuid}` on {live.name} before it returns to service"],
            action="probe", observed_at=event.observed_at)

    def holds(self, ctx: DetectionContext, incident: OpenIncident, now: float) -> bool | None:
        """A job's application incident clears once the job steps again after it opened; the others are
        latched (critical) or stay until a person resolves them."""
        if incident.latched or not incident.fingerprint.endswith("|application") or incident.job_id is None:
            return None
        stats = ctx.jobs.find(incident.job_id)
        if stats is None:
            return True
        return not any(r.last_progress_at is not None and r.last_progress_at > incident.opened_at and not r.ended
                       for r in stats.ranks.values())


def _times(event: HardwareEvent) -> str:
    if event.count <= 1:
        return ""
    last = f", the last at {_when(event.last_observed_at)}" if event.last_observed_at else ""
    return f", seen {event.count} times{last}"


def _event(event: HardwareEvent, seq: int) -> dict[str, Any]:
    return {"kind": event.kind, "xid": event.xid, "message": event.message, "observed_at": event.observed_at,
            "seq": seq, "count": event.count, "last_observed_at": event.last_observed_at}
