"""Retry or scale down: what Sentinel tells a serving engine whose engine core failed and waits for an instruction.

vLLM (`--enable-fault-tolerance`) and SGLang (PR #40078) leave that choice to an outside orchestrator, because it
needs what the engine cannot see: whether the failure is transient or the hardware under the rank is going
bad. Sentinel has that evidence. Pure: the engine_fault detector gathers the evidence, `decide` rules on it.

- scale_down when the hardware of a waiting rank's node is suspect — an XID, ECC, thermal, power or offline
  fault on its accelerators (or the node) within `hardware_seconds`, an open hardware incident on them, or an
  accelerator out of service (quarantined, suspect);
- scale_down when an engine core is `dead` (vLLM refuses any instruction but on an `unhealthy` core; a dead
  rank is what scale-down is for, vLLM PR #46370);
- scale_down when the job's engines were already told to retry `max_retries` times within `retry_seconds`
  and failed again: the fault does not go away;
- retry otherwise: a transient software fault (a collective timeout, a network blip), all ranks survive.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Literal

Instruction = Literal["retry", "scale_down"]


@dataclass(frozen=True)
class RankEvidence:
    """What Sentinel knows of one waiting engine core's hardware."""

    replica: str
    rank: int  # the engine core's id (its DP rank)
    state: str  # unhealthy | paused | dead
    node: str = ""
    accelerators: tuple[str, ...] = ()
    faults: tuple[str, ...] = ()  # recent hardware faults, described ("XID 79 on GPU-2 4 min ago")
    incidents: tuple[str, ...] = ()  # open hardware incidents on them ("#12 hardware: XID 79 ...")
    out_of_service: tuple[str, ...] = ()  # "GPU-2 quarantined"
    fault: str = ""  # what the engine says failed
    error: str = ""  # why its last instruction failed, as the engine says

    @property
    def suspect(self) -> bool:
        return bool(self.faults or self.incidents or self.out_of_service)

    @property
    def where(self) -> str:
        accs = ",".join(self.accelerators) or "unknown accelerators"
        return f"node {self.node or '?'}'s accelerators {accs}"


@dataclass(frozen=True)
class Verdict:
    instruction: Instruction
    reasons: list[str] = field(default_factory=list)  # why, first the deciding one

    @property
    def because(self) -> str:
        return "; ".join(self.reasons)


def decide(ranks: Sequence[RankEvidence], *, retries: int, max_retries: int, retry_seconds: float,
           hardware_seconds: float) -> Verdict:
    """`ranks`: the job's waiting engine cores; `retries`: retries Sentinel ordered for the job within
    `retry_seconds`. Deterministic; every reason says what was looked at, found or not."""
    window = f"{retry_seconds / 60:g} min"
    against: list[str] = []
    for r in ranks:
        if r.suspect:
            found = [*r.faults, *r.incidents, *r.out_of_service]
            against.append(f"hardware evidence on {r.where} (replica {r.replica}): {', '.join(found[:4])}")
        if r.state == "dead":
            against.append(f"the engine core of replica {r.replica} (rank {r.rank}) is dead: it cannot take a retry")
    if retries >= max_retries:
        against.append(f"{retries} retr{'y' if retries == 1 else 'ies'} in the last {window} did not hold "
                       f"(max_retries {max_retries})")
    if against:
        return Verdict("scale_down", against)
    clean = "; ".join(f"no hardware evidence on {r.where} (no XID/ECC/thermal fault in the last "
                      f"{hardware_seconds / 60:g} min, no open hardware incident, none out of service)" for r in ranks)
    tried = (f"no retry in the last {window}" if retries == 0 else
             f"{retries} retr{'y' if retries == 1 else 'ies'} in the last {window}, under max_retries {max_retries}")
    return Verdict("retry", [clean or "no engine core named", tried])
