"""The discrete-event replay: a trace's faults, in time order, onto the modelled cluster under one policy.

Time advances from fault to fault (and to each recovery's end); between events a training job either runs
(checkpointing every interval, each save stalling it) or recovers (detection, waiting for a node, restart,
restore). A running stretch of length L keeps floor(L / (interval + stall)) intervals of work; the rest is
recomputed. Serving availability is integrated per minute against the request rate after the replay.
"""

from __future__ import annotations

import heapq
import math
from typing import Any

import numpy as np

from sentinel.policy.features import Fault
from sentinel.simulate.cluster import Scenario, ServingJob, TrainingJob, serving_load
from sentinel.simulate.costs import Costs
from sentinel.simulate.policies import Policy
from sentinel.simulate.report import summarise
from sentinel.simulate.trace import DAY, Trace, TraceFault

REVIEW_SECONDS = 6 * 3600.0  # how often a policy that moves work pre-emptively looks at the nodes in use


class Simulation:
    def __init__(self, trace: Trace, policy: Policy, costs: Costs, scenario: Scenario, *, first_day: float,
                 last_day: float):
        scenario.validate(len(trace.nodes))
        self.trace, self.policy, self.costs, self.scenario = trace, policy, costs, scenario
        self.start, self.end = first_day * DAY, last_day * DAY
        self.now = self.start
        self.nodes = list(trace.nodes)
        self.history: dict[str, list[Fault]] = {}
        self.down: set[str] = set()
        self.role: dict[str, tuple[str, int] | None] = dict.fromkeys(self.nodes)
        self.spares: set[str] = set()
        self.spare_time = 0.0  # spare node-seconds held idle
        self._spare_since = self.start
        self.takeouts: list[float] = []
        self.training = [TrainingJob(i, n) for i, n in enumerate(scenario.training_nodes)]
        self.serving = [ServingJob(i, n, [None] * n) for i, n in enumerate(scenario.serving_replicas)]
        self.repairs: list[float] = []
        self.rng = np.random.default_rng(scenario.seed)
        # where each node sits in the scheduler's order: unrelated to its faults (the trace's ids come first)
        self.position = {n: int(p) for n, p in zip(self.nodes, self.rng.permutation(len(self.nodes)), strict=True)}
        self.events: list[tuple[float, int, str, Any]] = []
        self._seq = 0
        minutes = max(1, int((self.end - self.start) // 60))
        self.loads = [serving_load(self.start, minutes, scenario, self.rng) for _ in self.serving]
        self.decisions: list[str] = []  # a few explained placements, for the summary
        self.migrations = 0  # planned moves off risky nodes
        self._borrowed: dict[str, tuple[int, int]] = {}  # scale-out node → (serving job, its extra entry)

    # -- what policies read ----------------------------------------------------------------------
    def fleet_rate_per_node_second(self, window_days: float = 30.0) -> float:
        a = max(self.now - window_days * DAY, 0.0)
        starts = sum(1 for fs in self.history.values() for f in fs if a <= f.start <= self.now)
        return starts / max(1.0, len(self.nodes) * max(self.now - a, DAY))

    def mean_repair_seconds(self) -> float:
        recent = self.repairs[-50:]
        return float(np.mean(recent)) if recent else DAY

    def free_nodes(self) -> list[str]:
        """Healthy nodes that take work and run nothing (spares included)."""
        return self._free() + sorted(self.spares)

    def free_count(self) -> int:
        return sum(1 for n in self.nodes if self.role[n] is None and n not in self.down)

    # -- the replay --------------------------------------------------------------------------------
    def push(self, at: float, what: str, data: Any) -> None:
        self._seq += 1
        heapq.heappush(self.events, (at, self._seq, what, data))

    def run(self) -> dict[str, Any]:
        for f in self.trace.faults:
            if f.start < self.start:
                self._learn_start(f)
                if f.end is not None and f.end <= self.start:
                    self._learn_end(f)
                else:
                    self.down.add(f.node)
                    if f.end is not None and f.end < self.end:
                        self.push(f.end, "end", f)
            elif f.start < self.end:
                self.push(f.start, "start", f)
                if f.end is not None and f.end < self.end:
                    self.push(f.end, "end", f)
        self._place_all()
        if self.policy.reviews:
            for k in range(1, int((self.end - self.start) // REVIEW_SECONDS) + 1):
                self.push(self.start + k * REVIEW_SECONDS, "review", None)
        if self.policy.sentinel:
            for serve, load in zip(self.serving, self.loads, strict=True):
                for a, b in load.spikes:
                    self.push(a, "spike", (serve.index, b))
        while self.events and self.events[0][0] < self.end:
            at, _, what, data = heapq.heappop(self.events)
            self._advance(at)
            getattr(self, f"_on_{what}")(data)
        self._advance(self.end)
        for job in self.training:
            self._close(job, self.end)
        return summarise(self)

    def _advance(self, at: float) -> None:
        self.spare_time += len(self.spares) * (at - self._spare_since)
        self._spare_since = self.now = at

    def _learn_start(self, f: TraceFault) -> None:
        self.history.setdefault(f.node, []).append(Fault(f.start, None, f.kind))

    def _learn_end(self, f: TraceFault) -> None:
        faults = self.history[f.node]
        faults[-1] = Fault(faults[-1].start, f.end, faults[-1].kind)
        if f.end is not None:
            self.repairs.append(f.end - f.start)

    # -- placement -----------------------------------------------------------------------------------
    def _free(self) -> list[str]:
        return [n for n in self.nodes if self.role[n] is None and n not in self.down and n not in self.spares
                and self.policy.usable(self, n)]

    def _take(self, count: int, *, spares_first: bool) -> list[tuple[str, bool]]:
        """`count` nodes as (node, warm): spares first when the policy keeps them, then free nodes."""
        out: list[tuple[str, bool]] = []
        if spares_first:
            for n in self.policy.order(self, [s for s in self.spares if self.policy.usable(self, s)])[:count]:
                self.spares.discard(n)
                out.append((n, True))
        if len(out) < count:
            out += [(n, False) for n in self.policy.order(self, self._free())[: count - len(out)]]
        return out

    def _place_all(self) -> None:
        for job in sorted(self.training, key=lambda j: -j.size):
            got = self._take(job.size, spares_first=False)
            if len(got) < job.size:
                for n, _ in got:
                    self.role[n] = None
                job.waiting_since = self.now
                continue
            for n, _ in got:
                self.role[n] = ("train", job.index)
            job.nodes = {n for n, _ in got}
            job.stall = self.policy.stall_seconds(self)
            job.interval = self.policy.interval_seconds(self, job)
            job.running, job.run_start = True, self.now
        for serve in self.serving:
            for r, (n, _) in enumerate(self._take(serve.replicas, spares_first=False)):
                serve.nodes[r] = n
                self.role[n] = ("serve", serve.index)
            for r in range(serve.replicas):
                if serve.nodes[r] is None:
                    serve.down.append((self.now, math.inf, 1.0))
                    serve.pending.append(self.now)
        self._refill_spares()

    def _refill_spares(self) -> None:
        target = self.policy.spare_target(self)
        while len(self.spares) > target:
            self.spares.discard(self.policy.order(self, sorted(self.spares))[-1])
        if len(self.spares) < target:
            self.spares.update(self.policy.order(self, self._free())[: target - len(self.spares)])

    # -- faults --------------------------------------------------------------------------------------
    def _on_start(self, f: TraceFault) -> None:
        self._learn_start(f)
        self.down.add(f.node)
        self.spares.discard(f.node)
        role, self.role[f.node] = self.role[f.node], None
        if role is not None and role[0] == "train":
            self._interrupt(self.training[role[1]], f.node, f.kind)
        elif role is not None:
            self._replica_lost(self.serving[role[1]], f.node)
        self._refill_spares()

    def _on_end(self, f: TraceFault) -> None:
        self._learn_end(f)
        self.down.discard(f.node)
        self._fill_pending()
        self._refill_spares()

    def _on_ready(self, data: tuple[int, int]) -> None:
        job = self.training[data[0]]
        if job.ready_at is None or data[1] != job.attempt:
            return  # a recovery overtaken by another fault
        self._account_plan(job, self.now)
        job.plan, job.ready_at = [], None
        job.running, job.run_start = True, self.now
        job.interval = self.policy.interval_seconds(self, job)

    def _interrupt(self, job: TrainingJob, node: str, kind: str) -> None:
        if job.running:
            length = self.now - job.run_start
            cycle = job.interval + job.stall
            kept = math.floor(length / cycle)
            job.productive += kept * job.interval
            job.lost["checkpoint_stall"] += kept * job.stall
            job.lost["recompute"] += length - kept * cycle
            job.running = False
        else:
            self._account_plan(job, self.now)
        job.interruptions += 1
        job.attempt += 1
        job.nodes.discard(node)
        job.kind, job.plan, job.ready_at, job.warm = kind, [], None, True
        self.takeouts.append(self.now)
        self._recover(job)

    def _account_plan(self, job: TrainingJob, now: float) -> None:
        """Book the recovery time that passed: waiting for nodes, then the plan's steps in order."""
        if job.waiting_since is not None:
            job.lost["waiting_for_node"] += now - job.waiting_since
            job.waiting_since = now
        elapsed = now - job.plan_start
        for cause, seconds in job.plan:
            spent = min(seconds, max(0.0, elapsed))
            job.lost[cause] += spent
            elapsed -= spent
        job.plan_start = now
        job.plan = [(c, s) for c, s in job.plan if s > 0] if elapsed < 0 else []

    def _breaker_allows(self, count: int) -> bool:
        if not self.policy.sentinel:
            return True
        self.takeouts = [t for t in self.takeouts if self.now - t < 3600.0]
        return len(self.takeouts) <= math.ceil(self.scenario.breaker_share * len(self.nodes)) or count == 0

    def _recover(self, job: TrainingJob) -> None:
        need = job.size - len(job.nodes)
        got = self._take(need, spares_first=self.policy.sentinel) if self._breaker_allows(need) else []
        for n, _ in got:
            self.role[n] = ("train", job.index)
            job.nodes.add(n)
            if self.policy.name == "learned" and len(self.decisions) < 12:
                self.decisions.append(f"day {self.now / DAY:.2f} job {job.index}: {n} {self.policy.explain(self, n)}")
        job.warm = job.warm and all(w for _, w in got)
        if len(job.nodes) < job.size:
            if job.waiting_since is None:
                job.waiting_since = self.now
                self.push(self.now + 3600.0, "retry", job.index)  # the breaker's window, or a node back
            return
        self._start_plan(job)

    def _start_plan(self, job: TrainingJob) -> None:
        if job.waiting_since is not None:
            job.lost["waiting_for_node"] += self.now - job.waiting_since
            job.waiting_since = None
        job.stall = self.policy.stall_seconds(self)
        job.plan = [("detection_restart", self.policy.detect_and_restart_seconds(self, job.kind, job.warm)),
                    ("restore", self.policy.restore_seconds(self))]
        job.plan_start = self.now
        job.ready_at = self.now + sum(s for _, s in job.plan)
        self.push(job.ready_at, "ready", (job.index, job.attempt))

    def _on_retry(self, index: int) -> None:
        self._fill_pending()

    def _fill_pending(self) -> None:
        for job in sorted(self.training, key=lambda j: -j.size):
            if job.waiting_since is not None and not job.running and job.ready_at is None:
                if not job.nodes and job.interruptions == 0:
                    self._first_start(job)
                else:
                    self._recover(job)
        for serve in self.serving:
            for r in range(serve.replicas):
                if serve.nodes[r] is None:
                    self._replace_replica(serve, r)

    def _first_start(self, job: TrainingJob) -> None:
        got = self._take(job.size, spares_first=True)
        if len(got) < job.size:
            self.spares.update(n for n, warm in got if warm)  # not enough yet: the spares stay spares
            return
        for n, _ in got:
            self.role[n] = ("train", job.index)
        job.nodes = {n for n, _ in got}
        job.lost["waiting_for_node"] += self.now - (job.waiting_since or self.now)
        job.waiting_since = None
        job.stall = self.policy.stall_seconds(self)
        job.interval = self.policy.interval_seconds(self, job)
        job.running, job.run_start = True, self.now

    # -- moving work before it fails ---------------------------------------------------------------
    def _on_review(self, _data: None) -> None:
        self.policy.review(self)

    def migrate(self, job: TrainingJob, leaving: list[str]) -> int:
        """A planned move at a checkpoint: save now, restart warm on safer nodes, restore; nothing recomputed."""
        if not job.running or not leaving:
            return 0
        got = self._take(len(leaving), spares_first=True)
        if len(got) < len(leaving):
            self.spares.update(n for n, warm in got if warm)
            return 0
        length = self.now - job.run_start
        job.productive += length / (job.interval + job.stall) * job.interval
        job.lost["checkpoint_stall"] += length / (job.interval + job.stall) * job.stall
        for old, (new, _) in zip(leaving, got, strict=True):
            job.nodes.discard(old)
            self.role[old] = None
            job.nodes.add(new)
            self.role[new] = ("train", job.index)
        job.running, job.attempt = False, job.attempt + 1
        job.plan = [("planned_migration", job.stall + self.costs.recover_gpu + self.policy.restore_seconds(self))]
        job.plan_start, job.ready_at = self.now, self.now + job.plan[0][1]
        self.push(job.ready_at, "ready", (job.index, job.attempt))
        self.migrations += 1
        return len(leaving)

    def move_replica(self, serve: ServingJob, node: str) -> bool:
        """Start the replica on a safer node, then stop the old one: no request sees the move."""
        got = self._take(1, spares_first=False)
        if not got or node not in serve.nodes:
            return False
        serve.nodes[serve.nodes.index(node)] = got[0][0]
        self.role[got[0][0]], self.role[node] = ("serve", serve.index), None
        self.migrations += 1
        return True

    # -- serving -------------------------------------------------------------------------------------
    def _replica_lost(self, serve: ServingJob, node: str) -> None:
        if node in serve.nodes:
            r = serve.nodes.index(node)
            serve.nodes[r] = None
            serve.pending.append(self.now)
            self._replace_replica(serve, r)
            return
        for k, (a, b, w) in enumerate(serve.extra):  # a scale-out replica: it serves no more
            if b > self.now and self._borrowed.get(node) == (serve.index, k):
                serve.extra[k] = (a, max(a, self.now), w)

    def _replace_replica(self, serve: ServingJob, r: int) -> None:
        got = self._take(1, spares_first=self.policy.sentinel)
        if not got:
            return
        node, _ = got[0]
        since = serve.pending.pop(0) if serve.pending else self.now
        serve.down.append((since, self.now + self.policy.serving_restart_seconds(self), 1.0))
        serve.nodes[r] = node
        self.role[node] = ("serve", serve.index)
        serve.failed_over += 1

    def _on_spike(self, data: tuple[int, float]) -> None:
        """Sentinel's policies add replicas on free nodes for the spike (a replica start later), then give
        them back; the baseline rides it out on what it has."""
        serve, until = self.serving[data[0]], data[1]
        peak = self.scenario.spike_factor * 1.3
        per_replica = 1.3 / (self.scenario.serving_peak_utilization * serve.replicas)
        extra = max(0, math.ceil(peak / per_replica) - serve.replicas)
        ready = self.now + self.policy.serving_restart_seconds(self)
        for node in self.policy.order(self, self._free())[:extra]:
            self._borrowed[node] = (serve.index, len(serve.extra))
            serve.extra.append((ready, until, 1.0))
            self.role[node] = ("serve", serve.index)
            self.push(until, "unspike", node)

    def _on_unspike(self, node: str) -> None:
        if self._borrowed.pop(node, None) is not None and self.role[node] is not None and node not in self.down:
            self.role[node] = None
            self._fill_pending()

    # -- the result -------------------------------------------------------------------------------------
    def _close(self, job: TrainingJob, now: float) -> None:
        if job.running:
            length = now - job.run_start
            cycle = job.interval + job.stall
            kept = length / cycle  # the work since the last save counts: the run is not interrupted
            job.productive += kept * job.interval
            job.lost["checkpoint_stall"] += kept * job.stall
        else:
            self._account_plan(job, now)
