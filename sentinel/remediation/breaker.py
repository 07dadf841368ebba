"""The circuit breaker: automatic quarantines and drains stop when too much would be out of service at
once. A partition that silences half the fleet must page a person, not drain half the fleet.

Trips when the accelerators taken out of service by automatic actions within `breaker_window_seconds`,
plus the ones the next action would take, exceed max(`breaker_min_accelerators`, `breaker_share` of the
fleet) — or, in one failure domain (the node label `breaker_domain_label`, e.g. a rack),
max(`breaker_min_accelerators`, `breaker_domain_share` of that domain). Once open it stays open, across
restarts, until an operator resets it.
"""

from __future__ import annotations

import threading
from datetime import datetime, timedelta

from sqlalchemy import func, select
from sqlalchemy.orm import Session

from sentinel.audit.service import record
from sentinel.config import Settings
from sentinel.events.service import record_event
from sentinel.remediation.models import BreakerState, Remediation
from sentinel.remediation.placement import Inventory
from sentinel.remediation.schemas import BreakerOut

TAKES_OUT = ("quarantine_accelerator", "drain_node")


class Breaker:
    def __init__(self, settings: Settings):
        self._settings = settings
        self._lock = threading.Lock()
        self.open = False

    def load(self, session: Session) -> None:
        row = session.get(BreakerState, 1)
        with self._lock:
            self.open = bool(row and row.open)

    def state(self, session: Session) -> BreakerState:
        row = session.get(BreakerState, 1)
        if row is None:
            row = BreakerState(id=1, open=False)
            session.add(row)
            session.flush()
        return row

    def taken_recently(self, session: Session, now: datetime) -> int:
        since = now - timedelta(seconds=self._settings.breaker_window_seconds)
        return int(session.scalar(select(func.coalesce(func.sum(Remediation.accelerators), 0)).where(
            Remediation.result == "done", Remediation.action.in_(TAKES_OUT), Remediation.created_at >= since)) or 0)

    def would_trip(self, session: Session, proposed: set[str], inventory: Inventory, now: datetime) -> tuple[str, str]:
        """(reason, domain) when taking `proposed` out would cross a limit; ('', '') when it would not."""
        s = self._settings
        total = len(inventory.slots)
        taken = self.taken_recently(session, now)
        limit = max(s.breaker_min_accelerators, s.breaker_share * total)
        if taken + len(proposed) > limit:
            return (f"{taken + len(proposed)} of {total} accelerators would be out of service within "
                    f"{s.breaker_window_seconds / 60:g} min ({taken} already, {len(proposed)} now): above the limit of "
                    f"{limit:g} ({s.breaker_share:.0%} of the fleet, at least {s.breaker_min_accelerators})", "fleet")
        label = s.breaker_domain_label
        if not label:
            return "", ""
        domains: dict[str, list[str]] = {}
        for slot in inventory.slots.values():
            domain = inventory.node_labels.get(slot.node, {}).get(label)
            if domain:
                domains.setdefault(domain, []).append(slot.uuid)
        for domain, members in sorted(domains.items()):
            hit = len(proposed & set(members))
            if not hit:
                continue
            cap = max(s.breaker_min_accelerators, s.breaker_domain_share * len(members))
            if hit > cap:
                return (f"{hit} of {len(members)} accelerators in {label}={domain} would go out of service at once: "
                        f"above the limit of {cap:g} for one failure domain", f"{label}={domain}")
        return "", ""

    def trip(self, session: Session, *, reason: str, domain: str, incident_id: int | None, now: datetime) -> None:
        row = self.state(session)
        row.open, row.reason, row.domain, row.incident_id, row.opened_at = True, reason[:1024], domain, incident_id, now
        record_event(session, kind="breaker_open", severity="critical", message=f"circuit breaker open: {reason}",
                     data={"domain": domain, "incident": incident_id})
        record(session, actor="sentinel", action="breaker.open", subject="breaker", reason=reason,
               detail={"domain": domain, "incident": incident_id})
        with self._lock:
            self.open = True

    def reset(self, session: Session, *, actor: str, reason: str, now: datetime) -> BreakerState:
        row = self.state(session)
        was_open = row.open
        row.open, row.reset_at, row.reset_by = False, now, actor
        if was_open:
            record_event(session, kind="breaker_reset", message=f"circuit breaker reset by {actor}: {reason}")
        record(session, actor=actor, action="breaker.reset", subject="breaker", reason=reason,
               detail={"was_open": was_open})
        with self._lock:
            self.open = False
        return row

    def status(self, session: Session, now: datetime) -> BreakerOut:
        """Open or closed, why it tripped, and how close the last window is to the limit."""
        s = self._settings
        row = self.state(session)
        total = len(Inventory.load(session).slots)
        return BreakerOut(open=row.open, reason=row.reason, domain=row.domain, incident_id=row.incident_id,
                          opened_at=row.opened_at, reset_at=row.reset_at, reset_by=row.reset_by,
                          taken_in_window=self.taken_recently(session, now),
                          limit=max(s.breaker_min_accelerators, s.breaker_share * total), accelerators=total,
                          window_seconds=s.breaker_window_seconds)
