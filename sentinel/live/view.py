"""The live layer as one object: every in-memory view the leader keeps, and how it is rebuilt on taking the lead.

| part          | module         | what it holds                                           | fed by               |
| ------------- | -------------- | ------------------------------------------------------- | -------------------- |
| `fleet`       | fleet.py       | each node's state, last seq and last report (liveness)  | registration, ingest |
| `samples`     | samples.py     | each accelerator's latest sample and a short window     | ingest               |
| `jobs`        | jobs.py        | each job's per-rank step windows, failures, lost steps  | task telemetry, exits|
| `assignments` | assignments.py | which tasks run on each node                            | task start and exit  |
| `checkpoints` | checkpoints.py | recent checkpoint commits per job                       | shard registration   |
| `faults`      | faults.py      | recent hardware faults per accelerator and node         | hardware events      |
| `network`     | network/view.py| the probe plan and matrix, RDMA ports, localisation     | registration, ingest |
| `serving`     | serving/signals| each serving replica's request sums, the jobs' SLOs      | task telemetry, jobs |

`liveness.py` is the periodic upkeep of `fleet` (silent nodes marked down, last-seen flushed in batches).
"""

from __future__ import annotations

from dataclasses import dataclass

from sqlalchemy import select
from sqlalchemy.orm import Session, sessionmaker

from sentinel.jobs.models import Job
from sentinel.live.assignments import Assignments
from sentinel.live.checkpoints import CheckpointLedger
from sentinel.live.faults import FaultHistory
from sentinel.live.fleet import Fleet
from sentinel.live.jobs import JobTelemetry
from sentinel.live.samples import SampleStore
from sentinel.network.localise import Thresholds
from sentinel.network.rules import load_rules
from sentinel.network.view import NetworkView
from sentinel.serving.signals import ServingView


@dataclass
class LiveView:
    fleet: Fleet
    samples: SampleStore
    jobs: JobTelemetry
    assignments: Assignments
    checkpoints: CheckpointLedger
    faults: FaultHistory
    network: NetworkView
    serving: ServingView

    @classmethod
    def empty(cls, factory: sessionmaker[Session], *, window_samples: int,
              network: NetworkView | None = None) -> LiveView:
        network = network or NetworkView.build(peers=8, round_seconds=10.0, window_seconds=60.0, rules=load_rules(),
                                               thresholds=Thresholds(), domain_labels=("rack", "switch"))
        return cls(fleet=Fleet(), samples=SampleStore(window_samples), jobs=JobTelemetry(),
                   assignments=Assignments(factory), checkpoints=CheckpointLedger(), faults=FaultHistory(),
                   network=network, serving=ServingView())

    def load(self, session: Session, now: float) -> None:
        """Rebuild every part from SQL (on taking the lead; the samples window refills from the next reports)."""
        self.fleet.load(session, now=now)
        self.assignments.load(session)
        self.jobs.load(session)
        self.faults.load(session, now=now)
        self.checkpoints.load(session)
        self.network.load(session)
        self.serving.load((job_id, attributes) for job_id, attributes in session.execute(
            select(Job.id, Job.attributes).where(Job.kind == "serving")))

    def shard_registered(self, job_id: int, step: int, rank: int, attempt: int, *, world_size: int, committed: bool,
                         at: float) -> None:
        """After a checkpoint shard's commit: the ledger learns it, and the rank's attempt got at least that far."""
        self.checkpoints.shard(job_id, step, rank, world_size=world_size, committed=committed, at=at)
        self.jobs.saved(job_id, rank, attempt, step)
