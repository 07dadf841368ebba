"""How the server's runtime plugs the diagnosis engine in: a job's registered attributes (its checkpoint_dir),
and a verdict written onto the job's open slowdown incident ("what Sentinel did")."""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

from sqlalchemy import select
from sqlalchemy.orm import Session, sessionmaker

from sentinel.diagnosis.schemas import Diagnosis, ExperimentOut
from sentinel.incidents.lifecycle import Incidents
from sentinel.incidents.models import Incident
from sentinel.jobs.models import Job

log = logging.getLogger("sentinel.diagnosis")


def job_attributes(factory: sessionmaker[Session]) -> Callable[[int], dict[str, Any]]:
    def read(job_id: int) -> dict[str, Any]:
        with factory() as session:
            found = session.scalar(select(Job.attributes).where(Job.id == job_id))
        return dict(found or {})

    return read


def annotate_incident(factory: sessionmaker[Session], incidents: Incidents) -> Callable[[Diagnosis, ExperimentOut],
                                                                                        None]:
    def write(diagnosis: Diagnosis, experiment: ExperimentOut) -> None:
        with factory() as session:
            ids = session.scalars(select(Incident.id).where(Incident.detector == "slowdown",
                                                            Incident.job_id == diagnosis.job_id,
                                                            Incident.state != "resolved")).all()
        for incident_id in ids:
            incidents.annotate(incident_id, f"experiment {experiment.id} ({experiment.kind}) {experiment.summary}")

    return write
