"""Verify before acting on statistical evidence (DESIGN §4): a suspect accelerator is probed — a short GEMM
run by its agent — and only quarantined if the probe confirms it. Which probes are awaited lives here,
in memory: a probe lost to a restart times out and the accelerator stays suspect for a person."""

from __future__ import annotations

import threading

from sqlalchemy import select
from sqlalchemy.orm import Session

from sentinel.accelerators.models import Accelerator
from sentinel.accelerators.service import set_health
from sentinel.config import Settings
from sentinel.nodes.commands import CommandQueue
from sentinel.nodes.models import Node
from sentinel.remediation import service
from sentinel.remediation.service import Context, Outcome


class Probes:
    def __init__(self, settings: Settings, commands: CommandQueue | None):
        self.settings = settings
        self.commands = commands  # None: this server cannot reach agents
        self._awaited: dict[str, tuple[int, float]] = {}  # accelerator → (incident, asked at)
        self._lock = threading.Lock()

    def ask(self, session: Session, ctx: Context, incident_id: int, uuid: str, asked_at: float) -> Outcome:
        """Mark the accelerator suspect and ask its agent for a microbenchmark (once at a time)."""
        out = Outcome()
        acc = session.scalar(select(Accelerator).where(Accelerator.uuid == uuid))
        node = session.get(Node, acc.node_id) if acc is not None else None
        if acc is None or node is None or acc.health != "healthy" or self.awaits(uuid):
            return out
        if service.blocked_by_breaker(session, ctx, incident_id, out, "probe"):
            return out
        if ctx.settings.remediation_dry_run:
            service.record(session, ctx, incident_id, "probe", uuid, "dry_run", "")
            out.lines.append(f"dry run: would mark {uuid} suspect and probe it")
        elif self.commands is None:
            out.lines.append(f"accelerator {uuid} is suspect; this server cannot reach agents to probe it")
        else:
            set_health(session, acc, health="suspect", reason=f"incident #{incident_id}: probing", actor="sentinel",
                       incident_id=incident_id)
            self.commands.push(node.name, kind="probe", accelerator_index=acc.index, fault="probe", argument=None)
            with self._lock:
                self._awaited[uuid] = (incident_id, asked_at)
            service.record(session, ctx, incident_id, "probe", uuid, "done", f"asked {node.name}")
            out.lines.append(f"accelerator {uuid} is suspect: probing it (a short GEMM through the agent on "
                             f"{node.name}) before acting; below {ctx.settings.probe_threshold:.0%} of its "
                             "expected rate it is quarantined")
        return out

    def awaits(self, uuid: str | None) -> bool:
        with self._lock:
            return uuid in self._awaited

    def take(self, uuid: str) -> int | None:
        """The incident whose probe of `uuid` just answered, if one was awaited."""
        with self._lock:
            incident_id, _ = self._awaited.pop(uuid, (None, 0.0))
        return incident_id

    def expired(self, now: float) -> list[tuple[int, str]]:
        """Probes that did not answer in time: (incident, timeline line); the accelerator stays suspect."""
        late: list[tuple[int, str]] = []
        timeout = self.settings.probe_timeout_seconds
        with self._lock:
            for uuid, (incident_id, asked) in list(self._awaited.items()):
                if now - asked > timeout:
                    del self._awaited[uuid]
                    late.append((incident_id, f"no probe result for {uuid} within {timeout:g}s; it stays suspect"))
        return late


def clear_suspect(session: Session, incident_id: int, uuid: str, value: float | None) -> str:
    """A probe that passed (or could not run): back to healthy; returns the timeline line."""
    acc = session.scalar(select(Accelerator).where(Accelerator.uuid == uuid))
    if acc is not None and acc.health == "suspect":
        set_health(session, acc, health="healthy", reason="probe passed" if value is not None
                   else "probe unavailable", actor="sentinel", incident_id=incident_id)
    if value is None:
        return (f"{uuid} could not be probed by its source; it stays in service — a person should run "
                "`dcgmi diag -r 2` on it")
    return (f"probe passed: {uuid} reached {value:.0%} of its expected rate; not quarantined — look "
            "elsewhere: the rank's input pipeline, its network path, or the job itself")
