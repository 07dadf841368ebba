"""The agent's engine targets: which serving engine's /metrics speaks for which task of which job.

A target is `JOB/RANK=KIND@URL`, optionally `#REPLICA:STAGE` (`sentinel collector --engine
7/0=vllm@http://127.0.0.1:8000/metrics#d0:decode`). Each report interval the agent scrapes every target once
(timeout 1 s, so a hung engine delays a report by at most that) and adds the interval's sums to the task's
telemetry, as if the task's SDK had sent them. The task's pid comes from its assignment: a target whose task
the server has not placed on this node is skipped (and said so once), because the server drops telemetry for
tasks placed elsewhere.

Each target also gets an active canary (canary.py) on the same host and port, every `canary_seconds` (0: none):
its latest result rides in the target's stats, or alone when the /metrics page did not answer.

Each target's fault-tolerance status (fault_tolerance.py: `GET /fault_tolerance/status`, where the engine
exposes it) is read once per interval too and rides in the same stats, or alone, like the canary's result.

Targets also come from the server: a launcher that runs serving replicas (`sentinel launch --serve … --engine
vllm`) registers each replica's task with its engine (`KIND@URL#REPLICA`, loopback only), and the report's ack
hands it to this node's agent with the task's assignment. Such a target lives as long as its assignment: a
replaced replica's engine on its new port is scraped from the next report, its old one is dropped. A target
given with `--engine` for the same job and rank wins.
"""

from __future__ import annotations

import logging
import re
from dataclasses import dataclass, field

from collectors.engines import ENGINES, EngineScraper
from collectors.engines.canary import Canary
from collectors.engines.fault_tolerance import FaultToleranceReader
from sentinel.telemetry.schemas import Assignment, SdkBatch
from sentinel.telemetry.serving import ServingStats

log = logging.getLogger("sentinel.agent.engines")
SPEC = re.compile(r"^(?P<job>[0-9]+)/(?P<rank>[0-9]+)=(?P<kind>[a-z]+)@(?P<url>https?://[^#\s]+)"
                  r"(?:#(?P<replica>[A-Za-z0-9][A-Za-z0-9._-]*)(?::(?P<stage>encode|prefill|decode|mixed))?)?$")


@dataclass
class EngineTarget:
    job_id: int
    rank: int
    scraper: EngineScraper
    canary: Canary | None = None
    fault_tolerance: FaultToleranceReader | None = None
    unplaced_said: bool = field(default=False)

    @classmethod
    def parse(cls, spec: str, timeout_seconds: float = 1.0, canary_seconds: float = 0.0) -> EngineTarget:
        m = SPEC.match(spec.strip())
        if m is None or m["kind"] not in ENGINES:
            raise ValueError(f"engine target {spec!r}: expected JOB/RANK=KIND@URL[#REPLICA[:STAGE]], KIND one of "
                             f"{', '.join(sorted(ENGINES))}")
        scraper = EngineScraper(m["kind"], m["url"], replica=m["replica"], stage=m["stage"] or "mixed",  # type: ignore[arg-type]
                                timeout_seconds=timeout_seconds)
        canary = Canary(m["url"], every_seconds=canary_seconds) if canary_seconds > 0 else None
        return cls(int(m["job"]), int(m["rank"]), scraper, canary, FaultToleranceReader(m["url"]))


class EngineWatch:
    def __init__(self, specs: list[str], canary_seconds: float = 0.0):
        self.targets = [EngineTarget.parse(s, canary_seconds=canary_seconds) for s in specs]
        self.canary_seconds = canary_seconds
        # from the server's assignments; None for one this agent cannot scrape (said once)
        self.assigned: dict[tuple[int, int, str], EngineTarget | None] = {}

    def _follow(self, assignments: list[Assignment]) -> list[EngineTarget]:
        """The targets the assignments name (made on first sight, dropped with their assignment), after the
        `--engine` ones."""
        static = {(t.job_id, t.rank) for t in self.targets}
        wanted = {(a.job_id, a.rank, a.engine) for a in assignments
                  if a.engine is not None and (a.job_id, a.rank) not in static}
        for key in [k for k in self.assigned if k not in wanted]:
            log.info("engine target dropped: job=%d rank=%d engine=%s (no longer assigned here)", *key)
            del self.assigned[key]
        for job_id, rank, engine in sorted(wanted - self.assigned.keys()):
            try:
                self.assigned[(job_id, rank, engine)] = EngineTarget.parse(f"{job_id}/{rank}={engine}",
                                                                          canary_seconds=self.canary_seconds)
                log.info("engine target from the server: job=%d rank=%d engine=%s", job_id, rank, engine)
            except ValueError as exc:  # the server validated it; a newer server's kind this agent lacks
                log.warning("engine target skipped: job=%d rank=%d: %s", job_id, rank, exc)
                self.assigned[(job_id, rank, engine)] = None
        return self.targets + [t for t in self.assigned.values() if t is not None]

    def poll(self, assignments: list[Assignment]) -> list[SdkBatch]:
        """One scrape per target; the batches of those whose task is placed here with a pid."""
        pids = {(a.job_id, a.rank): a.pid for a in assignments if a.pid}
        out = []
        for t in self._follow(assignments):
            pid = pids.get((t.job_id, t.rank))
            if pid is None:
                if not t.unplaced_said:
                    log.warning("engine target skipped: job=%d rank=%d url=%s: no task with a pid placed here yet",
                                t.job_id, t.rank, t.scraper.url)
                    t.unplaced_said = True
                continue
            t.unplaced_said = False
            stats = t.scraper.scrape()
            probed = t.canary.tick() if t.canary is not None else None
            status = t.fault_tolerance.read() if t.fault_tolerance is not None else None
            if probed is not None or status is not None:
                stats = stats or ServingStats(source=t.scraper.engine.source, replica=t.scraper.replica,
                                              stage=t.scraper.stage)
                stats.canary, stats.fault_tolerance = probed, status
            if stats is not None:
                out.append(SdkBatch(job_id=t.job_id, rank=t.rank, pid=pid, serving=stats))
        return out
