"""A serving engine whose engine core failed and now waits for an instruction: retry, or scale down.

vLLM with `--enable-fault-tolerance` (data-parallel, external load balancer) and SGLang's fault-tolerance
framework (PR #40078) no longer exit when an engine core (a DP rank) fails: they abort its requests, say so on
`GET /fault_tolerance/status`, and wait — vLLM for 120 s, then it raises — for an outside orchestrator to
`POST /fault_tolerance/apply` an instruction. The agent reads that status (collectors/engines/fault_tolerance.py);
this detector decides (sentinel/serving/engine_faults.py) from Sentinel's own evidence, says what and why on
the incident, and remediation has the job's launcher apply it (an `adjust` order; the engine listens on the
node's loopback only).

One incident per fault episode of a job (all its waiting ranks: a DP group recovers together, every rank
takes the same instruction). A new episode, with its own decision, starts when the engines were healthy at the
last evaluation, when an engine says its last instruction failed (a new error), or when they still wait
`stuck_seconds` after the decision (the instruction did not hold).
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from sentinel.detection.base import DetectionContext, Detector, Evaluation, register
from sentinel.detection.detectors._common import EVIDENCE_POINTS, is_application, prune
from sentinel.incidents.findings import Finding, Subject
from sentinel.serving.engine_faults import RankEvidence, Verdict, decide

if TYPE_CHECKING:
    from sentinel.config import Settings
    from sentinel.serving.signals import ReplicaStats
    from sentinel.telemetry.serving import EngineRankState

HARDWARE_DETECTORS = frozenset({"hardware", "lemon", "throttle"})


@dataclass
class Episode:
    number: int
    since: float  # when the engines were first seen waiting in this episode
    errors: frozenset[str]
    verdict: Verdict
    ranks: list[RankEvidence] = field(default_factory=list)


@register
class EngineFault(Detector):
    """A serving replica's engine says an engine core failed and waits for an instruction (`unhealthy`,
    `paused`) or is `dead`, in a report within `fresh_seconds`. Decides `retry` or `scale_down`: scale_down
    on hardware evidence against the waiting ranks' accelerators (a non-application XID, ECC, thermal, power or
    offline fault within `hardware_seconds`, an open hardware / lemon / throttle incident, an accelerator out of
    service), on a dead core, or after `max_retries` retries within `retry_seconds`; retry otherwise. Clears
    once no engine of the job waits. One incident per fault episode of a job.

    Options (defaults): fresh_seconds 30, hardware_seconds 3600, max_retries 2, retry_seconds 600,
    stuck_seconds 45. Layer: hardware when the decision rests on hardware evidence, else software; action:
    instruct_engine (the job's launcher POSTs the instruction to each waiting replica).
    """

    name = "engine_fault"
    periodic = True

    def __init__(self, settings: Settings):
        super().__init__(settings)
        self.episodes: dict[int, Episode] = {}  # job → its current fault episode
        self.counter: dict[int, int] = {}  # job → episodes so far
        self.retries: dict[int, deque[float]] = {}  # job → when a retry was decided
        self.points: dict[int, deque[tuple[float, float]]] = {}  # job → (at, engine cores waiting)

    def evaluate(self, ctx: DetectionContext, now: float) -> Evaluation:
        view = ctx.serving
        if view is None:
            return Evaluation([], 0)
        fresh = self.option("fresh_seconds", 30.0)
        waiting: dict[int, list[tuple[ReplicaStats, EngineRankState]]] = {}
        subjects: set[int] = set()
        for job_id, r in view.fresh(now, fresh):
            status = view.window(job_id, r.replica, now, fresh).fault_tolerance
            if status is None:
                continue
            subjects.add(job_id)
            waiting.setdefault(job_id, []).extend((r, e) for e in status.waiting)
        findings = []
        for job_id in sorted(waiting):
            self.points.setdefault(job_id, deque(maxlen=EVIDENCE_POINTS)).append((now, float(len(waiting[job_id]))))
            if not waiting[job_id]:
                self.episodes.pop(job_id, None)
                continue
            findings.append(self._finding(job_id, self._episode(ctx, job_id, waiting[job_id], now), now))
        prune(self.episodes, set(waiting))
        prune(self.points, set(waiting))
        self.active = {f.fingerprint for f in findings}
        return Evaluation(findings, len(subjects))

    def _episode(self, ctx: DetectionContext, job_id: int, waiting: list[tuple[ReplicaStats, EngineRankState]],
                 now: float) -> Episode:
        """The job's current episode, or a new one (with its decision) where the last one ended or failed."""
        errors = frozenset(e.error for _, e in waiting if e.error)
        current = self.episodes.get(job_id)
        stuck = self.option("stuck_seconds", 45.0)
        if current is not None and errors <= current.errors and now - current.since < stuck:
            return current
        ranks = [self._evidence(ctx, job_id, r, e, now) for r, e in waiting]
        window = self.option("retry_seconds", 600.0)
        retried = self.retries.setdefault(job_id, deque(maxlen=32))
        while retried and retried[0] < now - window:
            retried.popleft()
        verdict = decide(ranks, retries=len(retried), max_retries=int(self.option("max_retries", 2)),
                         retry_seconds=window, hardware_seconds=self.option("hardware_seconds", 3600.0))
        if verdict.instruction == "retry":
            retried.append(now)
        self.counter[job_id] = self.counter.get(job_id, 0) + 1
        episode = Episode(self.counter[job_id], now, errors | (current.errors if current else frozenset()), verdict,
                          ranks)
        self.episodes[job_id] = episode
        return episode

    def _evidence(self, ctx: DetectionContext, job_id: int, r: ReplicaStats, e: EngineRankState,
                  now: float) -> RankEvidence:
        node, accelerators = ctx.placement(job_id, r.rank)
        node = node or r.node
        mine = set(accelerators)
        window = self.option("hardware_seconds", 3600.0)
        faults = [f"{f.kind}{' ' + str(f.xid) if f.xid is not None else ''} on {f.accelerator or node} "
                  f"{(now - f.at) / 60:.0f} min ago"
                  for f in ctx.history.recent(now, window_seconds=window, node=node)
                  if f.severity != "info" and (f.accelerator is None or f.accelerator in mine)
                  and not is_application(ctx, f.kind, f.xid)]
        incidents = [f"incident #{i.id} ({i.detector}" + (f" on {i.subject.accelerator})" if i.subject.accelerator
                                                           else f" on node {node})")
                     for i in ctx.open_incidents() if i.detector in HARDWARE_DETECTORS and i.subject.node == node
                     and (i.subject.accelerator is None or i.subject.accelerator in mine)
                     and not i.fingerprint.endswith("|application")]
        out = [f"{uuid} {health}" for uuid, health in sorted(ctx.out_of_service(sorted(mine)).items())]
        return RankEvidence(r.replica, e.rank, e.state, node or "", tuple(accelerators), tuple(faults[-4:]),
                            tuple(incidents[:4]), tuple(out[:4]), e.fault, e.error)

    def _finding(self, job_id: int, ep: Episode, now: float) -> Finding:
        v, ranks = ep.verdict, ep.ranks
        who = ", ".join(f"replica {r.replica} (DP rank {r.rank}, {r.state}"
                        + (f": {r.fault}" if r.fault else "") + ")" for r in ranks[:8])
        hardware = any(r.suspect for r in ranks)
        node = ranks[0].node if len({r.node for r in ranks}) == 1 and ranks[0].node else None
        title = f"serving job {job_id}: engine core failed on {who}; decided {v.instruction}: {v.reasons[0]}"
        errors = "; ".join(f"{r.replica}: {r.error}" for r in ranks if r.error)
        held = int(now - ep.since)
        points = list(self.points.get(job_id, ()))
        return Finding(
            detector=self.name, key=f"job={job_id}|fault={ep.number}", severity="critical",
            layer="hardware" if hardware else "software",
            subject=Subject(node=node, job_id=job_id, rank=ranks[0].rank if len(ranks) == 1 else None),
            title=title[:500],
            seen=f"{len(ranks)} engine core(s) of job {job_id} wait for an instruction for {held} s: {who}"
                 + (f"; the last instruction failed: {errors}" if errors else ""),
            comparison=f"decided {v.instruction} because {v.because}"[:1000],
            evidence={"decision": v.instruction, "reasons": v.reasons, "episode": ep.number,
                      "replicas": sorted({r.replica for r in ranks}),
                      "ranks": [{"replica": r.replica, "rank": r.rank, "state": r.state, "node": r.node,
                                 "accelerators": list(r.accelerators), "fault": r.fault, "error": r.error,
                                 "hardware_faults": list(r.faults), "hardware_incidents": list(r.incidents),
                                 "out_of_service": list(r.out_of_service)} for r in ranks[:16]],
                      "window": {"metric": "engine_cores_waiting", "times": [round(t - now, 3) for t, _ in points],
                                 "values": [v for _, v in points]}},
            next_steps=[f"Sentinel tells the engine of {', '.join(sorted({r.replica for r in ranks}))} to "
                        f"{v.instruction} (POST /fault_tolerance/apply through the job's launcher); the order's "
                        "result says what the engine answered",
                        "Read the engine's log around the fault (vLLM logs '[FT] Busy loop raised ...')",
                        "vLLM gives up after engine_recovery_timeout_sec (120 s) without an instruction and "
                        "raises: the replica then exits and is replaced"
                        + ("; check the hardware incident(s) named" if hardware else "")],
            action="instruct_engine", observed_at=min(ep.since, now))

