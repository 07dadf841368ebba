"""What detectors find and what incidents are opened from: the one vocabulary the detection → incidents →
notifiers/remediation chain shares. A `Finding` is one condition seen now; an incident is keyed by its
fingerprint; `OpenIncident` is the in-memory view of one not yet resolved. Severities are ordered here."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

SEVERITY_ORDER = {"info": 0, "warning": 1, "critical": 2}


@dataclass(frozen=True)
class Subject:
    """What an incident is about; any combination may be set."""

    node: str | None = None
    accelerator: str | None = None
    job_id: int | None = None
    rank: int | None = None

    def describe(self) -> str:
        parts = []
        if self.job_id is not None:
            parts.append(f"job {self.job_id}" + (f" rank {self.rank}" if self.rank is not None else ""))
        if self.node is not None:
            parts.append(f"node {self.node}")
        if self.accelerator is not None:
            parts.append(f"accelerator {self.accelerator}")
        return ", ".join(parts) or "the fleet"


@dataclass
class Finding:
    """One condition a detector sees now. The same finding seen again updates its incident."""

    detector: str
    key: str  # what makes it distinct within the detector, e.g. "node=n1|xid=79"
    severity: str  # info | warning | critical
    title: str  # one line: what happened, where
    layer: str  # hardware | interconnect | compute | input_pipeline | checkpoint_io | software | unknown
    subject: Subject
    seen: str  # what was seen, in a sentence or two with the numbers
    comparison: str = ""  # compared with what: peers, the job's baseline, the accelerator's history
    evidence: dict[str, Any] = field(default_factory=dict)  # the window and the raw events
    next_steps: list[str] = field(default_factory=list)
    action: str = "record"  # the recommended action: record | restart_task | reset_accelerator | ...
    observed_at: float | None = None  # when the signal was first observed (detection latency is from here)
    latched: bool = False  # stays open until a person or remediation resolves it
    occurrences: int = 1  # how many times it was seen (an agent folds repeats of an event into one, counted)

    @property
    def fingerprint(self) -> str:
        return f"{self.detector}|{self.key}"[:255]


@dataclass(frozen=True)
class OpenIncident:
    """The engine's in-memory view of an incident that is not resolved."""

    id: int
    fingerprint: str
    detector: str
    latched: bool
    subject: Subject
    opened_at: float

    @property
    def job_id(self) -> int | None:
        return self.subject.job_id
