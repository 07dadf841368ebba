"""The instruct-engine flow: a serving engine waits for an instruction after an engine core failed, and the
engine_fault detector decided which (`retry` or `scale_down`, in the incident's evidence, with its reasons).
The instruction goes out as an `adjust` order, `params` `{"fault_tolerance": "retry", "replicas": ["r1"]}`:
the engine listens on its node's loopback only, so the job's launcher applies it (sentinel/launcher/
fault_tolerance.py) and its ack says what the engine answered. A scale-down takes capacity away: it waits
while the circuit breaker is open; a retry does not. Takes the caller's session, never commits."""

from __future__ import annotations

from sqlalchemy.orm import Session

from sentinel.incidents.models import Incident
from sentinel.jobs.models import Job
from sentinel.remediation import policy
from sentinel.remediation.orders import create_adjust, order_dict
from sentinel.remediation.service import Context, Ordered, Outcome, blocked_by_breaker, job_ref, record

INSTRUCTIONS = ("retry", "scale_down")


def instruct_engine(session: Session, ctx: Context, incident_id: int, job_id: int) -> Outcome:
    out = Outcome()
    incident, job = session.get(Incident, incident_id), session.get(Job, job_id)
    if incident is None or job is None or job.state in policy.FINISHED_JOB_STATES:
        return out
    evidence = incident.evidence if isinstance(incident.evidence, dict) else {}
    instruction, replicas = evidence.get("decision"), [str(r) for r in evidence.get("replicas") or []]
    if instruction not in INSTRUCTIONS or not replicas:
        out.lines.append(f"no instruction to send: the incident names {instruction!r} for {replicas or 'no replica'}")
        return out
    subject = f"job/{job_id}"
    if ctx.settings.remediation_dry_run:
        record(session, ctx, incident_id, "instruct_engine", subject, "dry_run", instruction)
        out.lines.append(f"dry run: would tell the engine of {', '.join(replicas)} to {instruction}")
        return out
    if instruction == "scale_down" and blocked_by_breaker(session, ctx, incident_id, out, "instruct_engine"):
        return out
    because = "; ".join(str(r) for r in evidence.get("reasons") or [])
    order = create_adjust(session, job=job, params={"fault_tolerance": instruction, "replicas": replicas},
                          reason=f"incident #{incident_id}: {instruction} ({because})", now=ctx.now,
                          ack_seconds=ctx.settings.order_ack_seconds, incident_id=incident_id)
    record(session, ctx, incident_id, "instruct_engine", subject, "done", f"order {order.id}: {instruction}")
    out.lines.append(f"order {order.id}: the launcher of job {job_id} ({job.name}) tells the engine of "
                     f"{', '.join(replicas)} to {instruction} (POST /fault_tolerance/apply)")
    out.orders.append(Ordered(job.id, order.attempt, order_dict(order), job_ref(job)))
    return out
