"""Periodic jobs on APScheduler, on the leader only. A failing job is logged and counted, and never stops the
others. Which jobs run, and how often, is the composition root's list (runtime.py: `Runtime.periodic`)."""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from apscheduler.schedulers.background import BackgroundScheduler

log = logging.getLogger("sentinel.scheduler")


@dataclass(frozen=True)
class Periodic:
    name: str
    every_seconds: float
    run: Callable[[], Any]


def guarded(job: Periodic, *, leading: Callable[[], bool], errors: dict[str, int]) -> Callable[[], None]:
    def run() -> None:
        if not leading():  # a standby's view is not live: liveness, detection and sends are the leader's
            return
        try:
            job.run()
        except Exception:
            errors[job.name] = errors.get(job.name, 0) + 1
            log.exception("scheduled job failed: job=%s", job.name)

    return run


def build_scheduler(jobs: Sequence[Periodic], *, leading: Callable[[], bool],
                    errors: dict[str, int]) -> BackgroundScheduler:
    scheduler = BackgroundScheduler(job_defaults={"coalesce": True, "max_instances": 1, "misfire_grace_time": 30})
    for job in jobs:
        scheduler.add_job(guarded(job, leading=leading, errors=errors), "interval", seconds=job.every_seconds,
                          id=job.name, name=job.name)
    return scheduler
