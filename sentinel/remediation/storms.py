"""Restart storms: a job whose restarts do not help is left for a person, with one critical incident.

A cause that follows the job (a bug, bad data, a poisoned checkpoint) makes every automatic restart fail
the same way: restarting it again only burns accelerator-hours and pages. Before each automatic restart
(`service.move_job`) the rule in `policy.restart_storm` is applied to the job's orders; when it holds, no
order is issued and one incident opens — critical, latched, fingerprint `remediation|job=<id>|restart_storm`.
While it is not resolved, automatic restarts of that job stay off (acknowledging it does not lift the
hold: resolving it does, once a person has acted).
"""

from __future__ import annotations

from datetime import datetime, timedelta

from sqlalchemy import func, select
from sqlalchemy.orm import Session

from sentinel.checkpoints.service import plan_recovery
from sentinel.config import Settings
from sentinel.incidents.findings import Finding, Subject
from sentinel.incidents.models import Incident
from sentinel.jobs.models import Job
from sentinel.remediation import policy
from sentinel.remediation.models import Order

DETECTOR = "remediation"


def fingerprint(job_id: int) -> str:
    return f"{DETECTOR}|job={job_id}|restart_storm"


def held_by(session: Session, job_id: int) -> int | None:
    """The unresolved restart-storm incident that holds the job's automatic restarts, if any."""
    return session.scalar(select(Incident.id).where(Incident.fingerprint == fingerprint(job_id),
                                                    Incident.state != "resolved").order_by(Incident.id.desc()))


def storm(session: Session, settings: Settings, job: Job, now: datetime) -> tuple[str, list[Order]]:
    """(why the next restart must not happen, the job's latest restarts), or ('', …) when it may."""
    def since(seconds: float) -> int:
        return session.scalar(select(func.count()).select_from(Order).where(
            Order.job_id == job.id, Order.created_at >= now - timedelta(seconds=seconds),
            Order.state != "superseded")) or 0

    latest = list(session.scalars(select(Order).where(Order.job_id == job.id, Order.state != "superseded")
                                  .order_by(Order.attempt.desc()).limit(max(settings.restart_storm_without_progress,
                                                                            10))))
    reason = policy.restart_storm(
        recent=since(settings.restart_storm_seconds), limit=settings.restart_storm_restarts,
        window_seconds=settings.restart_storm_seconds, hourly=since(3600.0),
        hourly_limit=settings.max_migrations_per_hour, steps=[o.checkpoint_step for o in latest],
        next_step=plan_recovery(session, job).step, without_progress=settings.restart_storm_without_progress)
    return reason, latest


def finding(job: Job, reason: str, latest: list[Order], incident_id: int | None, at: float) -> Finding:
    restarts = [{"order": o.id, "attempt": o.attempt, "at": o.created_at.isoformat(), "reason": o.reason,
                 "checkpoint_step": o.checkpoint_step, "recovery_seconds": o.recovery_seconds} for o in latest]
    return Finding(
        detector=DETECTOR, key=f"job={job.id}|restart_storm", severity="critical",
        title=f"job {job.id} ({job.name}): restart storm, automatic restarts stopped", layer="software",
        subject=Subject(job_id=job.id),
        seen=f"Job {job.id} was {reason}. Restarting it again would fail the same way: automatic restarts of "
             f"this job are off until this incident is resolved"
             + (f" (the failure that asked for another: incident #{incident_id})." if incident_id else "."),
        comparison=f"its last {len(latest)} restart(s): " + "; ".join(
            f"attempt {o.attempt} ({o.reason or 'restart'}, from step {o.checkpoint_step})" for o in latest[:5]),
        evidence={"reason": reason, "restarts": restarts, "trigger_incident": incident_id},
        next_steps=[f"Read the job's last failures: `sentinel incidents --job {job.id}` and its ranks' logs; a cause "
                    "that follows the job (a bug, bad data, a checkpoint that fails on load) is likelier than "
                    "hardware",
                    f"If a checkpoint is bad, restart from an older one (`GET /api/v1/jobs/{job.id}/recovery-plan`)",
                    "Resolve this incident (`sentinel incidents resolve <id>`) to turn automatic restarts back "
                    "on for the job; acknowledging it keeps them off"],
        action="record", observed_at=at, latched=True)
