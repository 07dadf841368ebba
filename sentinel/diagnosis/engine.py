"""The diagnosis engine: each job's baseline per component, its current diagnosis, and the experiments run for it.

Fed by the report pipeline (task telemetry → `ComponentStore`, host memory, experiment results) and driven by
the `slowdown` detector's evaluations (sentinel/detection/detectors/slowdown.py), which turn its diagnoses
into incidents. The REST API and the MCP server read it and start experiments through it.

A job's baseline is learnt from `baseline_seconds` of telemetry once `warmup_seconds` have passed since its
first report (compilation, caches, the loader starting), every rank reporting; it is then followed slowly
(a 10% step every 10 s) while the job stays within half the margin of it, and learnt afresh after a restart.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from sentinel.diagnosis import experiments as catalog
from sentinel.diagnosis.attribution import Attribution, Thresholds, attribute, iteration_of
from sentinel.diagnosis.components import COMPONENTS, ComponentStore, RankProfile
from sentinel.diagnosis.dispatch import Dispatch
from sentinel.diagnosis.schemas import Diagnosis, DiagnosisOut, ExperimentOut, ExperimentProposal
from sentinel.diagnosis.signals import gather
from sentinel.telemetry.schemas import ExperimentResult, NodeReport, TaskTelemetry

if TYPE_CHECKING:
    from sentinel.diagnosis.context import LiveContext as DetectionContext
    from sentinel.nodes.commands import CommandQueue

log = logging.getLogger("sentinel.diagnosis")


@dataclass
class Options:
    warmup_seconds: float = 10.0
    baseline_seconds: float = 20.0
    recent_seconds: float = 10.0
    persist_seconds: float = 4.0
    thresholds: Thresholds = field(default_factory=Thresholds)


@dataclass
class Baseline:
    profiles: dict[int, RankProfile]
    clocks: dict[str, float]
    learnt_at: float
    updated_at: float
    attempts: dict[int, int]  # rank → attempt it was learnt on


class Diagnoser:
    def __init__(self, store: ComponentStore, commands: CommandQueue | None = None,
                 attributes: Callable[[int], dict[str, Any]] = lambda job_id: {}):
        self.store = store
        self.book = catalog.ExperimentBook()
        self.dispatch = Dispatch(self.book, commands, attributes)
        self.hosts: dict[str, float] = {}  # node → host memory used ÷ total, from its last report
        self.baselines: dict[int, Baseline] = {}
        self.onsets: dict[int, float] = {}
        self.current: dict[int, Diagnosis] = {}
        self.status: dict[int, DiagnosisOut] = {}
        self.ctx: DetectionContext | None = None
        self.on_verdict: list[Callable[[Diagnosis, ExperimentOut], None]] = []
        self._lock = threading.RLock()

    # -- fed by the report pipeline ---------------------------------------------------------------------------

    def reported(self, node: str, tasks: list[TaskTelemetry], report: NodeReport, now: float) -> None:
        """`tasks`: the report's task telemetry the server accepts as this node's."""
        if tasks:
            self.store.add(node, tasks, now)
        if report.host is not None and report.host.memory_total_bytes:
            self.hosts[node] = report.host.memory_used_bytes / report.host.memory_total_bytes
        for result in report.experiments:
            self.result(result, now)

    def result(self, result: ExperimentResult, now: float) -> None:
        item = self.book.agent_result(result, now)
        if item is None:
            log.info("experiment result ignored: id=%s (unknown here, or already finished)", result.id)
            return
        log.info("experiment finished: id=%s job=%d kind=%s %s", item.out.id, item.out.job_id, item.out.kind,
                 item.out.summary)
        self._apply(item.out)

    # -- evaluation (the slowdown detector's schedule) --------------------------------------------------------

    def evaluate(self, ctx: DetectionContext, now: float, options: Options) -> list[Diagnosis]:
        self.ctx = ctx
        with self._lock:
            self._server_experiments(now)
            for item in self.book.expire(now):
                log.warning("experiment timed out: id=%s job=%d kind=%s node=%s", item.out.id, item.out.job_id,
                            item.out.kind, item.out.node)
                self._apply(item.out)
            found = []
            for job_id in self.store.job_ids():
                diagnosis = self._evaluate_job(ctx, job_id, now, options)
                if diagnosis is not None:
                    found.append(diagnosis)
            return found

    def _evaluate_job(self, ctx: DetectionContext, job_id: int, now: float, o: Options) -> Diagnosis | None:
        recent = self.store.profile(job_id, now - o.recent_seconds, now)
        first = self.store.first_seen(job_id)
        if not recent or first is None:
            self.status.pop(job_id, None)
            newest = self.store.newest(job_id)
            if newest is None or now - newest > self.store.window_seconds:  # ended long ago: let it go
                self.forget(job_id)
            return None
        base = self.baselines.get(job_id)
        attempts = self.store.attempts(job_id)
        if base is not None and base.attempts != attempts:  # a restart: the new attempt's pace is learnt anew
            del self.baselines[job_id]
            self.onsets.pop(job_id, None)
            self.current.pop(job_id, None)
            base = None
        if base is None:
            base = self._learn(ctx, job_id, now, first, o)
            if base is None:
                return None
        signals = gather(ctx, job_id, {r: p.node for r, p in recent.items()}, self.hosts, now)
        found = attribute(base.profiles, recent, signals, base.clocks, o.thresholds)
        components = {str(r): {c: round(v, 6) for c, v in p.components.items()} for r, p in recent.items()}
        before, after = iteration_of(base.profiles), iteration_of(recent)
        if found is None:
            self.onsets.pop(job_id, None)
            self.current.pop(job_id, None)
            if after < before * (1 + o.thresholds.margin / 2) and now - base.updated_at >= 10.0:
                self._follow(base, recent, now)
            self.status[job_id] = DiagnosisOut(job_id=job_id, state="healthy", components=components,
                                               detail=f"iteration {after:.3f} s against a baseline of {before:.3f} s",
                                               baseline_iteration_seconds=before, current_iteration_seconds=after)
            return None
        onset = self.onsets.setdefault(job_id, now)
        diagnosis = self.current.get(job_id) if now - onset >= o.persist_seconds else None
        if now - onset >= o.persist_seconds:
            diagnosis = self._diagnosis(job_id, found, onset, now, diagnosis)
            self.current[job_id] = diagnosis
        self.status[job_id] = DiagnosisOut(
            job_id=job_id, state="slowdown", components=components, diagnosis=diagnosis,
            baseline_iteration_seconds=before, current_iteration_seconds=after,
            detail=found.title if diagnosis else f"{found.title} (for {now - onset:.0f} s; diagnosed after "
                                                 f"{o.persist_seconds:.0f} s)")
        return diagnosis

    def _learn(self, ctx: DetectionContext, job_id: int, now: float, first: float, o: Options) -> Baseline | None:
        waited = now - first
        if waited < o.warmup_seconds + o.baseline_seconds:
            self.status[job_id] = DiagnosisOut(job_id=job_id, state="learning",
                                               detail=f"learning the job's baseline: {waited:.0f} of "
                                                      f"{o.warmup_seconds + o.baseline_seconds:.0f} s")
            return None
        profiles = self.store.profile(job_id, now - o.baseline_seconds, now)
        clocks = {}
        for signals in gather(ctx, job_id, {r: p.node for r, p in profiles.items()}, self.hosts, now).values():
            clocks.update(signals.clocks_hz)
        base = self.baselines[job_id] = Baseline(profiles, clocks, now, now, self.store.attempts(job_id))
        means = {c: sum(p.components[c] for p in profiles.values()) / len(profiles) for c in COMPONENTS}
        log.info("baseline learnt: job=%d ranks=%d iteration=%.4f s %s", job_id, len(profiles), iteration_of(profiles),
                 " ".join(f"{c}={v:.4f}" for c, v in means.items()))
        self.dispatch.calibrate(ctx, job_id, profiles, now)
        return base

    @staticmethod
    def _follow(base: Baseline, recent: dict[int, RankProfile], now: float) -> None:
        for rank, profile in recent.items():
            old = base.profiles.get(rank)
            if old is None:
                continue
            old.iteration = 0.9 * old.iteration + 0.1 * profile.iteration
            for c in COMPONENTS:
                old.components[c] = 0.9 * old.components[c] + 0.1 * profile.components[c]
            if profile.cpu_wait is not None:
                old.cpu_wait = profile.cpu_wait if old.cpu_wait is None else 0.9 * old.cpu_wait + 0.1 * profile.cpu_wait
        base.updated_at = now

    def _diagnosis(self, job_id: int, found: Attribution, onset: float, now: float,
                   previous: Diagnosis | None) -> Diagnosis:
        same = previous is not None and previous.component == found.component and previous.layer == found.layer
        d = Diagnosis(job_id=job_id, layer=found.layer, component=found.component,  # type: ignore[arg-type]
                      title=found.title, straggler=found.straggler, ranks=found.ranks, nodes=found.nodes,
                      slowdown=round(found.slowdown, 4), iteration_before_seconds=round(found.before, 6),
                      iteration_after_seconds=round(found.after, 6), onset_at=onset,
                      diagnosed_at=previous.diagnosed_at if same and previous else now,
                      changes=found.changes, signals=found.signals, ruled_out=found.ruled_out,
                      proposed_experiment=found.experiment, next_steps=_next_steps(job_id, found))
        if same and previous is not None:
            d.status, d.confirmation = previous.status, previous.confirmation
        elif previous is None:
            log.warning("slowdown diagnosed: job=%d layer=%s component=%s ranks=%s %s", job_id, d.layer, d.component,
                        d.ranks, d.title)
        d.experiments = [e for e in self.book.of_job(job_id) if not e.calibration and e.created_at >= onset]
        return d

    # -- experiments ------------------------------------------------------------------------------------------

    def run(self, job_id: int, proposal: ExperimentProposal, now: float,
            index_of: Callable[[str], int | None] = lambda uuid: None) -> ExperimentOut:
        """Start an experiment (raises LookupError / ValueError naming what is wrong with it)."""
        ctx = self.ctx
        if ctx is None:
            raise LookupError("the diagnosis engine has not run yet on this server (is it the leader?)")
        base = self.baselines.get(job_id)
        cpu_wait = None
        if base is not None and proposal.rank is not None and proposal.rank in base.profiles:
            cpu_wait = base.profiles[proposal.rank].cpu_wait
        item = self.dispatch.start(ctx, job_id, proposal, now, index_of=index_of, baseline_cpu_wait=cpu_wait)
        return item.out

    def experiment(self, ident: str) -> ExperimentOut | None:
        item = self.book.get(ident)
        return item.out.model_copy() if item else None

    def _server_experiments(self, now: float) -> None:
        for item in self.book.pending():
            if item.proposal.kind in catalog.SERVER_KINDS and now - item.out.created_at >= catalog.FRESH_WINDOW_SECONDS:
                base = self.baselines.get(item.out.job_id)
                self.dispatch.finish_server_side(item, self.store.profile(item.out.job_id, item.out.created_at, now),
                                                 base.profiles if base else {}, now)
                self._apply(item.out)

    def _apply(self, out: ExperimentOut) -> None:
        """A finished experiment updates the job's current diagnosis when it tested it."""
        with self._lock:
            d = self.current.get(out.job_id)
            if d is None or out.calibration:
                return
            d.experiments = [e for e in self.book.of_job(out.job_id)
                             if not e.calibration and e.created_at >= d.onset_at]
            if out.kind == d.proposed_experiment.kind and out.verdict in ("confirmed", "refuted"):
                d.status = "confirmed" if out.verdict == "confirmed" else "refuted"
                d.confirmation = out.summary
                for listener in self.on_verdict:
                    try:
                        listener(d, out)
                    except Exception:
                        log.exception("diagnosis verdict listener failed: job=%d", out.job_id)

    def report(self, job_id: int) -> DiagnosisOut | None:
        with self._lock:
            status = self.status.get(job_id)
            return status.model_copy(deep=True) if status else None

    def forget(self, job_id: int) -> None:
        with self._lock:
            for table in (self.baselines, self.onsets, self.current, self.status):
                table.pop(job_id, None)
            self.store.forget(job_id)


def _next_steps(job_id: int, found: Attribution) -> list[str]:
    e = found.experiment
    where = ", ".join(x for x in (f"node {e.node}" if e.node else "", f"accelerator {e.accelerator}"
                                   if e.accelerator else "", f"peer {e.peer}" if e.peer else "",
                                   f"rank {e.rank}" if e.rank is not None else "") if x)
    return [f"Run the proposed experiment `{e.kind}` ({where or 'the job'}): {e.why}; {e.expect}. "
            f"`POST /api/v1/jobs/{job_id}/experiments` (or the MCP tool run_experiment)",
            f"The step decomposition per rank: `GET /api/v1/jobs/{job_id}/diagnosis`; the timeline: "
            f"`GET /api/v1/jobs/{job_id}/timeline`",
            "Compare with a profile from before the onset (torch.profiler, or `py-spy dump --pid <pid>`) on the ranks "
            f"named: {', '.join(map(str, found.ranks)) or 'all'}"]
