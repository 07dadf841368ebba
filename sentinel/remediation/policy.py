"""What remediation does about an incident, as data (DESIGN §4, §6). Pure: no session, no clock, no I/O.

The fault catalog gives every finding a recommended action (`Finding.action`); `DECISIONS` says how that
action is carried out and what it needs to be possible; `decide` applies it to what is known of one
incident. The other functions here are the rules a flow applies once it runs (remediation/service.py).

| recommended action                  | flow                 | needs                      |
| ----------------------------------- | -------------------- | -------------------------- |
| reset_accelerator, quarantine       | take out accelerator | the accelerator            |
| restart_node, drain_node            | take out node        | the node                   |
| page (a fleet-wide finding)         | fleet-wide (escalate)| nothing; weighs its nodes  |
| probe (statistical evidence)        | probe first          | the accelerator            |
| restart_task                        | restart the job      | the job                    |
| instruct_engine (engine_fault)      | instruct the engine  | the job (an adjust order)  |
| record, or anything else            | nothing              |                            |

A take-out whose latest observation is older than the breaker's window (a spool replayed after a partition,
events queued while the breaker was open) is `stale`: escalated to a person, never acted on.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Literal

from sentinel.jobs.models import FINISHED_STATES

Flow = Literal["take_out_accelerator", "take_out_node", "fleet_wide", "probe", "restart_job", "instruct_engine",
               "stale", "nothing"]
TAKES_OUT: frozenset[Flow] = frozenset({"take_out_accelerator", "take_out_node"})

DECISIONS: dict[str, Flow] = {
    "reset_accelerator": "take_out_accelerator",
    "quarantine": "take_out_accelerator",
    "restart_node": "take_out_node",
    "drain_node": "take_out_node",
    "page": "fleet_wide",
    "probe": "probe",
    "restart_task": "restart_job",
    "instruct_engine": "instruct_engine",  # retry / scale_down, as the incident's evidence decided (engine_fault)
    "record": "nothing",
}
SERVING_KINDS = frozenset({"serving"})
FINISHED_JOB_STATES = FINISHED_STATES


@dataclass(frozen=True)
class Facts:
    """What is known of an incident when remediation decides (read from SQL by the engine)."""

    action: str  # the finding's recommended action
    detector: str
    node: str | None = None
    accelerator: str | None = None
    job_id: int | None = None
    node_accelerators: tuple[str, ...] = ()  # present accelerators of `node`
    wide_nodes: tuple[str, ...] = ()  # the nodes a fleet-wide finding names
    wide_accelerators: tuple[str, ...] = ()  # their present accelerators
    age_seconds: float = 0.0  # since the latest observation behind the incident
    max_age_seconds: float = float("inf")  # older than this, nothing is taken out automatically


@dataclass(frozen=True)
class Decision:
    flow: Flow
    accelerators: tuple[str, ...] = ()
    drain: str | None = None  # the node to drain as well
    nodes: tuple[str, ...] = ()
    job_id: int | None = None
    after_failure: bool = False  # restart only if a task of the latest attempt failed (a task exit)


NOTHING = Decision("nothing")


def decide(facts: Facts) -> Decision:
    """The table applied: a flow whose subject is unknown (no accelerator, node or job) does nothing, except
    a page, which escalates whatever it names."""
    flow = DECISIONS.get(facts.action, "nothing")
    if flow in TAKES_OUT and facts.age_seconds > facts.max_age_seconds:
        return Decision("stale")  # a replayed or spooled event (NVSentinel #450): a person looks first
    if flow == "take_out_accelerator" and facts.accelerator:
        return Decision(flow, accelerators=(facts.accelerator,))
    if flow == "take_out_node" and facts.node:
        return Decision(flow, accelerators=facts.node_accelerators, drain=facts.node)
    if flow == "fleet_wide":  # pages a person in every case; the nodes it names are weighed for the breaker
        return Decision(flow, accelerators=facts.wide_accelerators, nodes=facts.wide_nodes)
    if flow == "probe" and facts.accelerator:
        return Decision(flow, accelerators=(facts.accelerator,))
    if flow == "restart_job" and facts.job_id is not None:
        return Decision(flow, job_id=facts.job_id, after_failure=facts.detector == "task_exit")
    if flow == "instruct_engine" and facts.job_id is not None:
        return Decision(flow, job_id=facts.job_id)
    return NOTHING


def ranks_to_replace(current: Mapping[int, Iterable[str]], bad: set[str], usable: set[str]) -> frozenset[int]:
    """Ranks that must move: on an accelerator being taken out, or on one no longer usable (not free)."""
    return frozenset(rank for rank, uuids in current.items()
                     if any(u in bad or u not in usable for u in uuids))


def order_kind(job_kind: str) -> str:
    """A serving replica is replaced (drain, start the replacement, stop the old); anything else restarts."""
    return "replace_replica" if job_kind in SERVING_KINDS else "restart"


def restart_wanted(*, after_failure: bool, failed_in_latest: int, newer_orders: int) -> bool:
    """Restart in place unless a newer attempt is already ordered, or (after a task exit) the exits are of an
    attempt being replaced (no task of the latest attempt failed)."""
    return not newer_orders and not (after_failure and not failed_in_latest)


def restart_storm(*, recent: int, limit: int, window_seconds: float, hourly: int, hourly_limit: int,
                  steps: list[int | None], next_step: int | None, without_progress: int) -> str:
    """Why the next automatic restart of a job must not happen (a restart storm), or ''. `recent`/`hourly`:
    its restarts within `window_seconds` / the last hour; `steps`: the checkpoint step each of its latest
    restarts resumed from, newest first; `next_step`: the one the next would resume from. A job that never
    committed a checkpoint is judged by the counts alone (NVRx nvrx-watch's patterns)."""
    if recent >= limit:
        return f"restarted {recent} times in the last {window_seconds / 60:g} min (restart_storm_restarts {limit})"
    if hourly >= hourly_limit:
        return f"restarted {hourly} times in the last hour, the limit (max_migrations_per_hour {hourly_limit})"
    last = steps[:without_progress]
    if next_step is not None and len(last) == without_progress and all(s == next_step for s in last):
        return (f"restarted {without_progress} times without checkpoint progress: each resumed from step "
                f"{next_step}, and the next would too (restart_storm_without_progress {without_progress})")
    return ""


def probe_verdict(value: float | None, threshold: float) -> Literal["quarantine", "healthy", "unavailable"]:
    """A probe below `threshold` of the accelerator's expected rate confirms the suspicion."""
    if value is None:
        return "unavailable"
    return "quarantine" if value < threshold else "healthy"
