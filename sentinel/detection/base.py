"""What a detector is, what it finds, and what it may read.

A detector is a small plugin. Event-driven detectors look at each accepted report as it arrives
(`on_report`); statistical ones run on APScheduler (`evaluate`) and return every condition that
holds now. An open incident is auto-resolved when its detector says the condition no longer
holds (`holds`) for the hysteresis period; latched incidents (hardware faults) wait for a person
or for remediation.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, ClassVar

from sentinel.incidents.findings import SEVERITY_ORDER, Finding, OpenIncident, Subject

if TYPE_CHECKING:
    from sentinel.clock import Clock
    from sentinel.config import Settings
    from sentinel.detection.catalog import FaultCatalog
    from sentinel.diagnosis.engine import Diagnoser
    from sentinel.jobs.service import ClosedTask
    from sentinel.live.checkpoints import CheckpointLedger
    from sentinel.live.faults import FaultHistory
    from sentinel.live.fleet import Fleet, NodeLive
    from sentinel.live.jobs import JobTelemetry
    from sentinel.live.samples import SampleStore
    from sentinel.network.view import NetworkView
    from sentinel.serving.signals import ServingView
    from sentinel.telemetry.schemas import Assignment, NodeReport

log = logging.getLogger("sentinel.detection")

@dataclass
class Evaluation:
    """What a periodic detector returns: the findings that hold now, out of how many subjects it looked at."""

    findings: list[Finding]
    subjects: int


@dataclass
class DetectionContext:
    """Everything a detector may read. Detectors never write; the engine opens and resolves incidents."""

    settings: Settings
    clock: Clock
    fleet: Fleet
    samples: SampleStore
    jobs: JobTelemetry
    catalog: FaultCatalog
    history: FaultHistory
    assignments: Callable[[], dict[int, list[Assignment]]]  # node id → tasks placed there
    # (job, attempt) → True when Sentinel ordered a newer attempt: that attempt's exits are expected
    restarting: Callable[[int, int], bool] = lambda job_id, attempt: False
    checkpoints: CheckpointLedger | None = None  # recent commits per job (the catalog keeps it current)
    network: NetworkView | None = None  # the probe mesh and RDMA ports (sentinel/network/)
    diagnosis: Diagnoser | None = None  # step-time decomposition and slowdown attribution (sentinel/diagnosis/)
    serving: ServingView | None = None  # serving replicas' request signals (sentinel/serving/)
    open_incidents: Callable[[], list[OpenIncident]] = list  # the incidents not resolved (the lifecycle's view)
    # of these accelerators, those out of service: uuid → health (quarantined, suspect); asked rarely (SQL)
    out_of_service: Callable[[list[str]], dict[str, str]] = lambda uuids: {}

    def node_of(self, uuid: str) -> str | None:
        for live in self.fleet.all():
            if uuid in live.accelerators:
                return live.name
        return None

    def placement(self, job_id: int, rank: int) -> tuple[str | None, list[str]]:
        """(node name, accelerator uuids) of a job's rank, from current assignments."""
        for node_id, tasks in self.assignments().items():
            for task in tasks:
                if task.job_id == job_id and task.rank == rank:
                    live = self.fleet.by_id(node_id)
                    return (live.name if live else None), list(task.accelerators)
        return None, []


class Detector:
    """Base class. Subclasses set `name`, and override `on_report`, `evaluate`, or both."""

    name: ClassVar[str] = ""
    periodic: ClassVar[bool] = False  # True: the engine calls evaluate() on its schedule
    every: ClassVar[float] = 0.0  # at most this often (seconds; `every` option overrides); 0: every round

    def __init__(self, settings: Settings):
        self.settings = settings
        self.active: set[str] = set()  # fingerprints that held at the last evaluation

    @property
    def cadence(self) -> float:
        return self.option("every", self.every)

    def option(self, key: str, default: float) -> float:
        """A tunable from `detector_options[<name>][<key>]` in the settings, else the default."""
        return float(self.settings.detector_options.get(self.name, {}).get(key, default))

    def on_report(self, ctx: DetectionContext, live: NodeLive, report: NodeReport,
                  exits: list[ClosedTask]) -> list[Finding]:
        return []

    def wants_evaluation(self, ctx: DetectionContext, live: NodeLive, report: NodeReport) -> bool:
        """A periodic detector whose condition this report may just have made true: evaluated now, off the
        request, rather than at its next turn of the schedule. Runs on every report: a cheap look only."""
        return False

    def evaluate(self, ctx: DetectionContext, now: float) -> Evaluation:
        return Evaluation([], 0)

    def fleet_wide(self, findings: list[Finding], subjects: int) -> Finding:
        """One finding in place of many: when a share of the fleet trips at once, a shared cause
        (network, storage, scheduler, a deploy) is likelier than many independent faults."""
        worst = max(findings, key=lambda f: SEVERITY_ORDER.get(f.severity, 0))
        layers = [f.layer for f in findings]
        layer = max(set(layers), key=layers.count)
        subjects_seen = [f.subject.describe() for f in findings[:50]]
        return Finding(
            detector=self.name, key="fleet-wide", severity=worst.severity,
            title=f"{self.name}: {len(findings)} of {subjects} subjects at once",
            layer=layer, subject=Subject(),
            seen=f"{len(findings)} of {subjects} subjects tripped {self.name} in the same evaluation, e.g. "
                 f"{worst.title}",
            comparison=f"{len(findings) / max(1, subjects):.0%} of what this detector watches; independent faults "
                       "rarely line up like this",
            evidence={"subjects": subjects_seen, "example": worst.evidence,
                      # what remediation's fleet-wide flow weighs against the breaker (it drains nothing itself)
                      "nodes": sorted({f.subject.node for f in findings if f.subject.node})},
            next_steps=["Look for a shared cause before touching single nodes: network fabric, shared storage, "
                        "the scheduler, a recent deploy or configuration change",
                        "Individual incidents are not opened while this holds; `sentinel incidents` lists "
                        "any opened before"],
            action="page", observed_at=min((f.observed_at for f in findings if f.observed_at is not None),
                                           default=None))

    def holds(self, ctx: DetectionContext, incident: OpenIncident, now: float) -> bool | None:
        """Does the condition behind an open incident still hold? None: not for the engine to decide."""
        if incident.latched:
            return None
        if self.periodic:
            return incident.fingerprint in self.active
        return None


DETECTORS: dict[str, type[Detector]] = {}


def register(cls: type[Detector]) -> type[Detector]:
    if not cls.name:
        raise ValueError(f"{cls.__name__} has no name")
    DETECTORS[cls.name] = cls
    return cls
