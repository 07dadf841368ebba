"""Periodic jobs on APScheduler. A failing job is logged and counted, and never stops the others."""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

from apscheduler.schedulers.background import BackgroundScheduler

from sentinel.live.liveness import check_liveness, flush_liveness, prune_receipts
from sentinel.runtime import Runtime

log = logging.getLogger("sentinel.scheduler")


def guarded(runtime: Runtime, name: str, fn: Callable[[], Any]) -> Callable[[], None]:
    def run() -> None:
        if not runtime.leading:  # a standby's view is not live: liveness, detection and sends are the leader's
            return
        try:
            fn()
        except Exception:
            runtime.plugin_errors[name] = runtime.plugin_errors.get(name, 0) + 1
            log.exception("scheduled job failed: job=%s", name)

    return run


def liveness(runtime: Runtime) -> None:
    """Mark silent nodes down; when some went down, judge heartbeat loss now rather than at the next round."""
    s = runtime.settings
    if check_liveness(runtime.factory, runtime.fleet, runtime.clock, s.missed_intervals_down):
        runtime.detection.evaluate(only="heartbeat")


def build_scheduler(runtime: Runtime) -> BackgroundScheduler:
    s = runtime.settings
    scheduler = BackgroundScheduler(job_defaults={"coalesce": True, "max_instances": 1, "misfire_grace_time": 30})
    jobs: list[tuple[str, float, Callable[[], Any]]] = [
        ("liveness", s.liveness_check_seconds, lambda: liveness(runtime)),
        ("detect", s.detection_interval_seconds, runtime.detection.evaluate),
        ("remediation", 1.0, runtime.remediation.tick),
        ("alert_refresh", s.alert_resend_seconds, lambda: runtime.dispatcher.refresh_alertmanager(runtime.clock_now())),
        ("liveness_flush", s.liveness_flush_seconds, lambda: flush_liveness(runtime.factory, runtime.fleet)),
        ("receipt_prune", 300.0,
         lambda: prune_receipts(runtime.factory, runtime.clock, s.receipt_retention_seconds)),
    ]
    for name, seconds, fn in jobs:
        scheduler.add_job(guarded(runtime, name, fn), "interval", seconds=seconds, id=name, name=name)
    return scheduler
