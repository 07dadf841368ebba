"""Shadow mode: the active placement or checkpoint-interval policy decides, and each decision is recorded
(`policy_decisions`) beside what a shadow policy would have chosen, so an operator can compare before switching
(`GET /api/v1/policy/shadow`). An active learned policy's decisions are recorded too, for their explanations.

The shadow never changes what happens: it runs after the active policy chose, on a copy of the inventory, its
reads in a savepoint on PostgreSQL (a failed statement there would end the active's transaction), and
whatever it raises is logged in one line, counted in `sentinel_plugin_errors_total{plugin="<kind>:<name>"}`
and recorded as its choice, never raised into the engine.
"""

from __future__ import annotations

import contextlib
import logging
import threading
from collections.abc import Iterator
from dataclasses import dataclass, replace
from datetime import datetime
from typing import Any

from sqlalchemy.orm import Session

from sentinel.checkpoints.interval import CheckpointIntervalPolicy, IntervalAsk
from sentinel.policy.interval import IntervalChoice, choose
from sentinel.policy.placement import LearnedPlacement, ranks_text
from sentinel.policy.scheduled import PendingDecisions
from sentinel.policy.service import Decision, record_decision
from sentinel.remediation.placement import Inventory, NoCapacity, Placement, PlacementPolicy, PlacementRequest

log = logging.getLogger("sentinel.policy")
INTERVAL_RECORD_SECONDS = 600.0  # at most one interval record per job this often, unless a choice changed
INTERVAL_CHANGE = 0.05  # a recommendation that moved by more than this share is a change
INTERVAL_AGREE = 0.10  # two recommendations within this share of each other agree


@contextlib.contextmanager
def isolated(session: Session) -> Iterator[None]:
    """A savepoint where a failed statement would abort the whole transaction (PostgreSQL)."""
    if session.get_bind().dialect.name == "postgresql":
        with session.begin_nested():
            yield
    else:
        yield


def shadow_failed(errors: dict[str, int], kind: str, name: str, exc: Exception, job_id: int,
                  incident_id: int | None) -> dict[str, Any]:
    errors[f"{kind}:{name}"] = errors.get(f"{kind}:{name}", 0) + 1
    why = f"{type(exc).__name__}: {(str(exc).splitlines() or [''])[0][:300]}"  # one line (SQL errors span several)
    log.warning("shadow policy failed: kind=%s policy=%s job=%d incident=%s %s", kind, name, job_id, incident_id,
                why)
    return {"error": why}


def placement_choice(placement: Placement | None, refused: NoCapacity | None,
                     moved: frozenset[int]) -> dict[str, Any]:
    if refused is not None or placement is None:
        return {"no_capacity": str(refused)}
    return {"ranks": {str(r): {"node": placement[r][0], "accelerators": list(placement[r][1])}
                      for r in sorted(moved) if r in placement}}


def same_placement(a: dict[str, Any], b: dict[str, Any]) -> bool:
    """The same node for every rank placed anew (or neither found capacity)."""
    if "ranks" in a and "ranks" in b:
        return {r: v["node"] for r, v in a["ranks"].items()} == {r: v["node"] for r, v in b["ranks"].items()}
    return "no_capacity" in a and "no_capacity" in b


class RecordingPlacement(PlacementPolicy):
    """The active placement policy with its decisions recorded and, when set, a shadow beside it."""

    name = "recording"

    def __init__(self, active: PlacementPolicy, shadow: PlacementPolicy | None, errors: dict[str, int]):
        self.active = active
        self.shadow = shadow
        self.errors = errors

    def prepare(self, session: Session, now: datetime, *, incident_id: int | None = None) -> PlacementPolicy:
        return PlacementDecision(self, session, now, incident_id)

    def place(self, request: PlacementRequest, inventory: Inventory) -> Placement:
        """Unprepared (no session to record in): the active policy alone."""
        return self.active.place(request, inventory)


class PlacementDecision(PlacementPolicy):
    """One decision: the active policy's placement, recorded in the caller's transaction with the shadow's."""

    name = "recording"

    def __init__(self, owner: RecordingPlacement, session: Session, now: datetime, incident_id: int | None):
        self.owner, self.session, self.now, self.incident_id = owner, session, now, incident_id
        self.active = owner.active.prepare(session, now, incident_id=incident_id)
        self.shadow: PlacementPolicy | None = None  # prepared once it ran
        self.lines: list[str] = []

    def place(self, request: PlacementRequest, inventory: Inventory) -> Placement:
        refused: NoCapacity | None = None
        try:
            placement: Placement | None = self.active.place(request, inventory)
        except NoCapacity as exc:
            placement, refused = None, exc
        if request.replace:  # a restart in place decides nothing
            self._record(request, inventory, placement_choice(placement, refused, request.replace))
        if placement is None:
            raise refused or NoCapacity("no placement")
        return placement

    def explanation(self) -> list[str]:
        return self.lines

    def _shadow(self, request: PlacementRequest, inventory: Inventory) -> dict[str, Any]:
        shadow = self.owner.shadow
        assert shadow is not None
        try:
            with isolated(self.session):
                self.shadow = shadow.prepare(self.session, self.now, incident_id=self.incident_id)
            return placement_choice(self.shadow.place(request, replace(inventory, free=set(inventory.free))),
                                    None, request.replace)
        except NoCapacity as exc:
            return placement_choice(None, exc, request.replace)
        except Exception as exc:
            self.shadow = None
            return shadow_failed(self.owner.errors, "placement", shadow.name, exc, request.job_id, self.incident_id)

    def _record(self, request: PlacementRequest, inventory: Inventory, chosen: dict[str, Any]) -> None:
        shadow_name = self.owner.shadow.name if self.owner.shadow is not None else ""
        shadow = self._shadow(request, inventory) if shadow_name else None
        agree = same_placement(chosen, shadow) if shadow is not None else None
        why = {role: p.last for role, p in (("active", self.active), ("shadow", self.shadow))
               if isinstance(p, LearnedPlacement) and p.last}
        record_decision(self.session, Decision(
            at=self.now, kind="placement", job_id=request.job_id, incident_id=self.incident_id,
            active_policy=self.active.name, active_choice=chosen, shadow_policy=shadow_name, shadow_choice=shadow,
            agree=agree, explanation=why))
        self.lines = self.active.explanation() if isinstance(self.active, LearnedPlacement) else []
        if shadow is not None and why:
            self.lines.append(self._shadow_line(shadow_name, shadow, chosen, agree))
        log.info("placement decided: job=%d incident=%s active=%s shadow=%s agree=%s", request.job_id,
                 self.incident_id, self.active.name, shadow_name or "-", agree)

    def _shadow_line(self, name: str, shadow: dict[str, Any], chosen: dict[str, Any], agree: bool | None) -> str:
        learned = next((p for p in (self.shadow, self.active) if isinstance(p, LearnedPlacement)), None)

        def told(policy: PlacementPolicy | None, choice: dict[str, Any]) -> str:
            if isinstance(policy, LearnedPlacement) and policy.describe():
                return policy.describe()
            if "ranks" not in choice:
                return f"nothing ({choice.get('no_capacity') or choice.get('error')})"
            nodes: dict[str, list[int]] = {}
            for rank, slot in choice["ranks"].items():
                nodes.setdefault(slot["node"], []).append(int(rank))
            return ", ".join(f"{ranks_text(rs)} → {n}" + (f" (risk {learned.risks.risk(n):.2f})" if learned else "")
                             for n, rs in nodes.items())

        return (f"shadow {name} would have placed {told(self.shadow, shadow)}; {self.active.name} placed "
                f"{told(self.active, chosen)}" + (" (they agree)" if agree else ""))


@dataclass(frozen=True)
class _Last:
    at: float
    active: float | None
    shadow: float | None


def interval_agree(a: float | None, b: float | None) -> bool:
    if a is None or b is None:
        return a is None and b is None
    return abs(a - b) <= INTERVAL_AGREE * max(a, b)


def interval_changed(before: float | None, now: float | None) -> bool:
    if before is None or now is None:
        return (before is None) != (now is None)
    return abs(now - before) > INTERVAL_CHANGE * max(abs(before), 1e-9)


class RecordingInterval(CheckpointIntervalPolicy):
    """The active checkpoint-interval policy with its recommendations recorded and, when set, a shadow's beside
    them. Recommendations are made on reads (a job's detail, a scrape): rows wait in `pending` for the periodic
    flush, at most one per job every INTERVAL_RECORD_SECONDS unless a recommendation moved by INTERVAL_CHANGE."""

    def __init__(self, active: CheckpointIntervalPolicy, shadow: CheckpointIntervalPolicy | None,
                 errors: dict[str, int], pending: PendingDecisions, *,
                 every_seconds: float = INTERVAL_RECORD_SECONDS):
        self.name = active.name
        self.active, self.shadow, self.errors, self.pending = active, shadow, errors, pending
        self.every_seconds = every_seconds
        self._last: dict[int, _Last] = {}
        self._lock = threading.Lock()

    def interval_seconds(self, session: Session, ask: IntervalAsk) -> float | None:
        active = choose(self.active, session, ask)
        shadow = self._shadow(session, ask) if self.shadow is not None else None
        if self._due(ask, active, shadow):
            self.pending.add(self._decision(ask, active, shadow))
        return active.seconds

    def _shadow(self, session: Session, ask: IntervalAsk) -> IntervalChoice | dict[str, Any]:
        assert self.shadow is not None
        try:
            with isolated(session):
                return choose(self.shadow, session, ask)
        except Exception as exc:
            return shadow_failed(self.errors, "checkpoint_interval", self.shadow.name, exc, ask.job_id, None)

    def _due(self, ask: IntervalAsk, active: IntervalChoice, shadow: IntervalChoice | dict[str, Any] | None) -> bool:
        shadow_seconds = shadow.seconds if isinstance(shadow, IntervalChoice) else None
        now = ask.now.timestamp()
        with self._lock:
            last = self._last.get(ask.job_id)
            if last is not None and now - last.at < self.every_seconds and not (
                    interval_changed(last.active, active.seconds) or interval_changed(last.shadow, shadow_seconds)):
                return False
            self._last[ask.job_id] = _Last(now, active.seconds, shadow_seconds)
            return True

    def _decision(self, ask: IntervalAsk, active: IntervalChoice,
                  shadow: IntervalChoice | dict[str, Any] | None) -> Decision:
        why: dict[str, Any] = {"inputs": {"stall_seconds": ask.stall_seconds, "mtbf_seconds": ask.mtbf_seconds,
                                          "accelerators": len(ask.accelerators)}}
        if active.explanation:
            why["active"] = active.explanation
        shadow_choice: dict[str, Any] | None = None
        agree: bool | None = None
        if isinstance(shadow, IntervalChoice):
            shadow_choice, agree = {"interval_seconds": shadow.seconds}, interval_agree(active.seconds, shadow.seconds)
            if shadow.explanation:
                why["shadow"] = shadow.explanation
        elif shadow is not None:
            shadow_choice, agree = shadow, False
        return Decision(at=ask.now, kind="checkpoint_interval", job_id=ask.job_id, incident_id=None,
                        active_policy=self.active.name, active_choice={"interval_seconds": active.seconds},
                        shadow_policy=self.shadow.name if self.shadow is not None else "", shadow_choice=shadow_choice,
                        agree=agree, explanation=why)
