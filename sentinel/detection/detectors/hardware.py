"""Fatal and notable hardware events, classified by the fault catalog, handled as they arrive."""

from __future__ import annotations

from datetime import UTC, datetime

from sentinel.detection.base import DetectionContext, Detector, register
from sentinel.incidents.findings import Finding, Subject
from sentinel.jobs.service import ClosedTask
from sentinel.live.fleet import NodeLive
from sentinel.telemetry.schemas import NodeReport


def _when(ts: float) -> str:
    return datetime.fromtimestamp(ts, UTC).strftime("%H:%M:%S.%f")[:-3] + "Z"


@register
class HardwareEvents(Detector):
    """One incident per (node, accelerator, fault); critical ones stay open until a person or remediation
    closes them. Informational records (catalog severity info, action record) open nothing."""

    name = "hardware"

    def on_report(self, ctx: DetectionContext, live: NodeLive, report: NodeReport,
                  exits: list[ClosedTask]) -> list[Finding]:
        findings = []
        for event in report.events:
            entry = ctx.catalog.lookup(event)
            if not entry.opens_incident:
                continue
            uuid = event.accelerator_uuid
            values = {"node": live.name, "accelerator": uuid or "(node)", "xid": event.xid}
            what = f"XID {event.xid} {entry.headline(**values)}" if event.kind == "xid" else entry.headline(**values)
            where = f"{uuid} on {live.name}" if uuid else live.name
            earlier = [f for f in ctx.history.recent(event.observed_at, accelerator=uuid, node=live.name)
                       if f.at < event.observed_at] if uuid else []
            node_faults = [f for f in ctx.history.recent(event.observed_at, node=live.name) if f.at < event.observed_at]
            tasks = [t for t in ctx.assignments().get(live.id, []) if uuid is None or uuid in t.accelerators]
            latest = ctx.samples.latest(uuid) if uuid else None
            seen = (f"{what} on accelerator {where} at {_when(event.observed_at)}"
                    f" (agent report seq {report.seq}). {entry.explanation}")
            if event.message:
                seen += f" Agent said: {event.message}"
            if tasks:
                seen += " Running there: " + ", ".join(f"job {t.job_id} rank {t.rank}" for t in tasks) + "."
            history = (f"This accelerator had {len(earlier)} earlier fault(s) and node {live.name} "
                       f"{len(node_faults)} in the last {ctx.history.window_seconds / 86400:g} days")
            if earlier:
                history += "; the latest: " + ", ".join(
                    f"{f.kind}{' ' + str(f.xid) if f.xid is not None else ''} at {_when(f.at)}" for f in earlier[-3:])
            findings.append(Finding(
                detector=self.name,
                key=f"node={live.name}|accelerator={uuid or '-'}|{event.kind}={'' if event.xid is None else event.xid}",
                severity=entry.severity, title=f"{what} on {where}", layer=entry.layer,
                subject=Subject(node=live.name, accelerator=uuid,
                                job_id=tasks[0].job_id if len(tasks) == 1 else None,
                                rank=tasks[0].rank if len(tasks) == 1 else None),
                seen=seen, comparison=history + ".",
                evidence={"event": {"kind": event.kind, "xid": event.xid, "message": event.message,
                                    "observed_at": event.observed_at, "seq": report.seq},
                          "latest_sample": latest[1].model_dump(exclude={"processes"}) if latest else None,
                          "tasks": [{"job": t.job_id, "rank": t.rank, "pid": t.pid} for t in tasks],
                          "earlier_faults": [{"kind": f.kind, "xid": f.xid, "at": f.at} for f in earlier[-10:]]},
                next_steps=entry.steps(**values), action=entry.action, observed_at=event.observed_at,
                latched=entry.severity == "critical"))
        return findings
