"""What an executor is: the part that makes a remediation happen in the world the job runs in.

The remediation engine decides (quarantine this accelerator, drain that node, move these jobs, restart
that job as a new attempt); an executor carries it out in its own terms and says what it did in one line.
Every order goes through one: the launcher executor delivers it to the job's launcher (long-poll and
signed webhook, always on); the local executor (`sentinel launch`, sentinel/launcher/local.py) carries it
out on this machine's processes; Slurm drains and requeues; Kubernetes cordons and evicts. Each declares
the action kinds it `handles` and gets only those. Executors are plugins: `register` a class, name it in
`settings.executors` (the launcher executor needs no naming).
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass, field
from typing import Any, ClassVar, Literal

ActionKind = Literal["drain_node", "release_node", "move_work", "order"]
ACTION_KINDS: frozenset[str] = frozenset({"drain_node", "release_node", "move_work", "order"})


def adjust_purpose(params: dict[str, Any] | None) -> str:
    """What an `adjust` order changes: an instruction to the engines (engine_fault), or the batch limit. The
    newest pending adjust of each purpose counts (server and launcher alike)."""
    return "fault_tolerance" if "fault_tolerance" in (params or {}) else "batch_limit"


@dataclass(frozen=True)
class JobRef:
    """A job as an executor needs it: Sentinel's id and name, and the scheduler's own handles from the
    job's attributes (e.g. `slurm_job_id`, `k8s_namespace` + `k8s_pods`)."""

    id: int
    name: str
    kind: str = "training"
    attributes: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class Action:
    """drain_node: stop new work landing on `node` (Slurm DRAIN, Kubernetes cordon).
    release_node: undo that. move_work: get `jobs` off `accelerators` on `node` (requeue, evict).
    order: restart the one job in `jobs` as the new attempt `order` describes (its placement, its kind:
    `restart`, or `replace_replica` for serving); `node` is the first node of its placement."""

    kind: ActionKind
    node: str
    reason: str
    accelerators: tuple[str, ...] = ()
    jobs: tuple[JobRef, ...] = ()
    incident_id: int | None = None
    order: dict[str, Any] | None = None  # for `order`: the order as its launcher gets it (orders.order_dict)


@dataclass(frozen=True)
class Outcome:
    ok: bool
    detail: str  # one line for the incident timeline and the log: what was done, or why not


class Executor(ABC):
    name: ClassVar[str] = ""
    handles: ClassVar[frozenset[str]] = frozenset()  # the action kinds it carries out

    def __init__(self, options: dict[str, Any] | None = None):
        self.options = options or {}

    @abstractmethod
    def execute(self, action: Action) -> Outcome:
        """Carry out `action`; never raise for an expected failure (say it in the Outcome)."""


EXECUTORS: dict[str, type[Executor]] = {}


def register(cls: type[Executor]) -> type[Executor]:
    if not cls.name:
        raise ValueError(f"{cls.__name__} has no name")
    if not cls.handles or not cls.handles <= ACTION_KINDS:
        raise ValueError(f"{cls.__name__} must handle some of {', '.join(sorted(ACTION_KINDS))}")
    EXECUTORS[cls.name] = cls
    return cls
