"""Per-replica and per-job serving signals, from the request sums the agents relay (sentinel/telemetry/serving.py).

Kept in memory over a sliding window (`window_seconds`, 60 s by default: a p99 that answers within a minute);
the good/total request counts of each interval are kept six hours, for the SLO burn rates. Definitions:

- p50/p95/p99 of TTFT, inter-token latency, TPOT, end to end, queue, KV transfer and each stage: from the
  summed histograms (within 9%: sentinel/sdk/buckets.py).
- KV-transfer share = KV-transfer seconds ÷ TTFT seconds (the part of the first token spent moving the cache);
  stage share = the stage's seconds ÷ end-to-end seconds.
- SLO attainment (DistServe): of the requests finished, the share that met both the TTFT and the TPOT target
  the job registered (`attributes.slo`); a failed request meets neither. Where a source has only marginals (an
  engine's /metrics page) it is the Fréchet lower bound max(0, a + b − 1), and says `basis: "bound"`.
- Goodput: requests per second finished within the SLO.
- MBU = (weight bytes ÷ TPOT) ÷ peak memory bandwidth: a lower bound (the KV cache read is not counted).
- Requests queued (`queued`): the engines' own queues (`waiting`) and the router's in front of them, where the
  router holds an engine to its batch limit (vLLM takes none) and so the engine says 0 (sentinel/serving/router.py).
"""

from __future__ import annotations

import threading
from collections import deque
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from sentinel.sdk import buckets
from sentinel.telemetry.serving import SIGNALS, STAGES, CanaryResult, ServingStats, add_stats

HISTORY_SECONDS = 6 * 3600.0
STALE_SECONDS = 600.0  # a replica silent this long is no longer one of the job's
ROUTER_STALE_SECONDS = 30.0  # a router's queue not said again for this long is not counted (its launcher is gone)
CANARIES_KEPT = 8  # the latest canary results per replica (collectors/engines/canary.py)
QUANTILES = (0.5, 0.95, 0.99)
# peak HBM bandwidth per accelerator model, bytes/s (vendor data sheets), matched on the model name
PEAK_MEMORY_BANDWIDTH = (("H200", 4.8e12), ("H100", 3.35e12), ("H800", 3.35e12), ("A100", 2.039e12),
                         ("MI300X", 5.3e12), ("L40S", 8.64e11))


@dataclass
class Slo:
    ttft_seconds: float
    tpot_seconds: float
    objective: float = 0.99  # the share of requests that must meet both targets (the burn rate's budget is 1 − it)

    @classmethod
    def of(cls, attributes: dict[str, Any] | None) -> Slo | None:
        """The SLO a job registered (`attributes.slo`), validated on creation (sentinel/jobs/schemas.py)."""
        slo = (attributes or {}).get("slo")
        if not isinstance(slo, dict):
            return None
        return cls(float(slo["ttft_seconds"]), float(slo["tpot_seconds"]), float(slo.get("objective", 0.99)))

    def met(self, stats: ServingStats) -> tuple[int, str]:
        """Requests of `stats` that met both targets, and whether that count is exact or a lower bound."""
        if stats.requests <= 0:
            return 0, "joint"
        if stats.joint:
            good = 0
            for key, n in stats.joint.items():
                i, j = (int(x) for x in key.split(":"))
                if buckets.upper(i) <= self.ttft_seconds * (1 + 1e-9) and buckets.upper(j) <= self.tpot_seconds * (
                        1 + 1e-9):
                    good += n
            return min(good, stats.requests), "joint"
        a = buckets.share_at_most(stats.histograms.get("ttft", {}), self.ttft_seconds)
        b = buckets.share_at_most(stats.histograms.get("tpot", {}), self.tpot_seconds)
        if a is None:
            return 0, "bound"
        ok = stats.requests - sum(stats.failed.values())
        share = a if b is None else max(0.0, a + b - 1.0)
        return max(0, min(stats.requests, int(share * ok))), "bound"


def peak_bandwidth(accelerator_model: str | None) -> float | None:
    for name, bandwidth in PEAK_MEMORY_BANDWIDTH:
        if accelerator_model and name in accelerator_model.upper():
            return bandwidth
    return None


@dataclass
class ReplicaStats:
    replica: str
    rank: int
    node: str = ""
    stage: str = "mixed"
    source: str = "sdk"
    intervals: deque[tuple[float, ServingStats]] = field(default_factory=deque)
    history: deque[tuple[float, int, int]] = field(default_factory=deque)  # (at, requests, of them within the SLO)
    last_seen: float = 0.0
    first_seen: float = 0.0
    pid: int = 0  # the process it runs in, as its task says: a replica of the same name in another is another one
    last_token_at: float | None = None
    oldest_inflight_seconds: float | None = None
    streaming: int | None = None  # requests in flight past their first token, where the source says
    running: int | None = None
    waiting: int | None = None
    kv_cache_usage_ratio: float | None = None
    batch_limit: int | None = None
    canaries: deque[CanaryResult] = field(default_factory=lambda: deque(maxlen=CANARIES_KEPT))  # oldest first
    requests_total: int = 0  # since this server took the lead
    failed_total: dict[str, int] = field(default_factory=dict)

    @property
    def label(self) -> str:
        """How an incident names it: "decode replica d1", or "replica r1" where one replica does every stage."""
        return f"replica {self.replica}" if self.stage == "mixed" else f"{self.stage} replica {self.replica}"


class ServingView:
    """Thread-safe: ingest adds, the API, /metrics and the detectors read."""

    def __init__(self, window_seconds: float = 60.0):
        self.window_seconds = window_seconds
        self._jobs: dict[int, dict[str, ReplicaStats]] = {}
        self._slos: dict[int, Slo] = {}
        self._totals: dict[int, tuple[dict[str, int], dict[str, int]]] = {}  # job → ({"": requests}, failed)
        # job → (replica, pid) another replica took the rank of: a replacement may take the same name, not the process
        self._retired: dict[int, set[tuple[str, int]]] = {}
        self._router: dict[int, tuple[float, int, int | None]] = {}  # job → (when, waiting in its router, its limit)
        self._lock = threading.Lock()

    def load(self, jobs: Iterable[tuple[int, dict[str, Any]]]) -> None:
        """The SLOs serving jobs registered, as (job id, attributes) (on taking the lead: sentinel/live/view.py)."""
        for job_id, attributes in jobs:
            self.set_slo(job_id, Slo.of(attributes))

    def set_slo(self, job_id: int, slo: Slo | None) -> None:
        with self._lock:
            if slo is None:
                self._slos.pop(job_id, None)
            else:
                self._slos[job_id] = slo

    def slo(self, job_id: int) -> Slo | None:
        with self._lock:
            return self._slos.get(job_id)

    def add(self, node: str, job_id: int, rank: int, stats: ServingStats, now: float, pid: int = 0) -> None:
        name = stats.replica or f"r{rank}"
        with self._lock:
            retired = self._retired.setdefault(job_id, set())
            if (name, pid) in retired:  # a replaced replica's report that came after its replacement's: not the rank's
                return
            replicas = self._jobs.setdefault(job_id, {})
            r = replicas.get(name)
            if r is not None and r.pid != pid:  # the same name in another process: a replacement that kept the name
                del replicas[name]
                retired.add((name, r.pid))
                r = None
            if r is None:
                # a task runs one replica: another name on its rank is the one it replaced, whose window must
                # not speak for the rank any more (its last frozen report would stall the replacement's), nor
                # may its reports still on their way take the rank back
                for other in [n for n, x in replicas.items() if x.rank == rank and x.node == node]:
                    retired.add((other, replicas.pop(other).pid))
                r = replicas[name] = ReplicaStats(name, rank, first_seen=now, pid=pid)
            r.rank, r.node, r.stage, r.source, r.last_seen = rank, node, stats.stage, stats.source, now
            r.intervals.append((now, stats))
            slo = self._slos.get(job_id)
            good = slo.met(stats)[0] if slo is not None else stats.requests - sum(stats.failed.values())
            r.history.append((now, stats.requests, max(good, 0)))
            for attr in ("last_token_at", "running", "waiting", "kv_cache_usage_ratio", "batch_limit"):
                value = getattr(stats, attr)
                if value is not None:
                    setattr(r, attr, value)
            r.oldest_inflight_seconds, r.streaming = stats.oldest_inflight_seconds, stats.streaming
            if stats.canary is not None:
                r.canaries.append(stats.canary)
            r.requests_total += stats.requests
            totals = self._totals.setdefault(job_id, ({"": 0}, {}))
            totals[0][""] += stats.requests
            for reason, n in stats.failed.items():
                r.failed_total[reason] = r.failed_total.get(reason, 0) + n
                totals[1][reason] = totals[1].get(reason, 0) + n
            self._trim(r, now)

    def _trim(self, r: ReplicaStats, now: float) -> None:
        while r.intervals and r.intervals[0][0] < now - self.window_seconds:
            r.intervals.popleft()
        while r.history and r.history[0][0] < now - HISTORY_SECONDS:
            r.history.popleft()

    def job_ids(self) -> list[int]:
        with self._lock:
            return sorted(self._jobs)

    def replicas(self, job_id: int, now: float) -> list[ReplicaStats]:
        """The job's replicas that reported within STALE_SECONDS; a replica silent longer (replaced, stopped) is
        forgotten, so the API and /metrics stop naming it."""
        with self._lock:
            replicas = self._jobs.get(job_id, {})
            for name in [n for n, r in replicas.items() if r.last_seen < now - STALE_SECONDS]:
                del replicas[name]
            return sorted(replicas.values(), key=lambda r: (r.stage, r.replica))

    def in_flight(self, job_id: int, rank: int, now: float) -> int:
        """The requests the job's replica on `rank` said it had in flight, in a report of the last window (0 when
        it never said, or said it longer ago)."""
        with self._lock:
            for r in self._jobs.get(job_id, {}).values():
                if r.rank == rank and r.last_seen >= now - self.window_seconds:
                    return max(r.running or 0, 1 if r.oldest_inflight_seconds else 0)
        return 0

    def set_router_waiting(self, job_id: int, waiting: int, now: float, limit: int | None = None) -> None:
        """The job's router holds `waiting` requests for admission, and its replicas to `limit` where it holds
        them to one (its launcher says so, each time it changes and every few seconds)."""
        with self._lock:
            self._router[job_id] = (now, max(int(waiting), 0), limit)

    def router_limit(self, job_id: int, now: float) -> int | None:
        """The limit the job's router holds its replicas to, as last said within ROUTER_STALE_SECONDS."""
        with self._lock:
            at, _, limit = self._router.get(job_id, (0.0, 0, None))
            return limit if at >= now - ROUTER_STALE_SECONDS else None

    def router_waiting(self, job_id: int, now: float) -> int:
        """The requests waiting in the job's router, as last said within ROUTER_STALE_SECONDS (else 0)."""
        with self._lock:
            at, waiting, _ = self._router.get(job_id, (0.0, 0, None))
            if at < now - ROUTER_STALE_SECONDS:
                self._router.pop(job_id, None)
                return 0
            return waiting

    def queued(self, job_id: int, now: float, seconds: float | None = None) -> int:
        """Requests waiting for admission across the job: each replica's engine queue, of the replicas that
        reported within `seconds` (the window by default), and the router's in front of them."""
        fresh = self.window_seconds if seconds is None else seconds
        engines = sum(r.waiting or 0 for r in self.replicas(job_id, now) if now - r.last_seen <= fresh)
        return engines + self.router_waiting(job_id, now)

    def fresh(self, now: float, seconds: float) -> list[tuple[int, ReplicaStats]]:
        """(job, replica) for every replica that reported within `seconds`: what a detector may judge (one
        silent longer is the heartbeat detector's)."""
        return [(job_id, r) for job_id in self.job_ids() for r in self.replicas(job_id, now)
                if now - r.last_seen <= seconds]

    def totals(self, job_id: int) -> tuple[int, dict[str, int]]:
        """Requests finished and failed (by reason) since this server took the lead, across replicas."""
        with self._lock:
            requests, failed = self._totals.get(job_id, ({"": 0}, {}))
            return requests[""], dict(failed)

    def replaced(self, job_id: int, ranks: Iterable[int], before: float) -> list[str]:
        """The launcher replaced the replicas on `ranks` (its order, made at `before`, is done): those first heard
        before then are retired, so that a late report of theirs, still frozen, neither judges the rank nor
        takes it back before the replacement's first report does. The names retired."""
        wanted = set(ranks)
        with self._lock:
            replicas = self._jobs.get(job_id, {})
            names = [n for n, r in replicas.items() if r.rank in wanted and r.first_seen < before]
            retired = self._retired.setdefault(job_id, set())
            for name in names:
                retired.add((name, replicas.pop(name).pid))
            return names

    def window(self, job_id: int, replica: str | None, now: float, seconds: float | None = None) -> ServingStats:
        """The sums over the window (or the last `seconds` of it) of one replica, or of them all (a fresh object:
        the caller may keep it)."""
        out = ServingStats()
        since = now - min(seconds or self.window_seconds, self.window_seconds)
        with self._lock:
            for r in self._jobs.get(job_id, {}).values():
                if replica is None or r.replica == replica:
                    for at, stats in r.intervals:
                        if at >= since:
                            add_stats(out, stats)
        return out

    def error_ratio(self, job_id: int, now: float, seconds: float) -> tuple[int, float | None]:
        """Over the last `seconds`, across replicas: requests finished, and the share that missed the SLO."""
        total = good = 0
        with self._lock:
            for r in self._jobs.get(job_id, {}).values():
                for at, requests, ok in reversed(r.history):
                    if at < now - seconds:
                        break
                    total, good = total + requests, good + ok
        return total, (1.0 - good / total) if total else None

    def peak_running(self, job_id: int, now: float, seconds: float) -> int:
        """The most requests any one replica of the job had running at once in a report of the last `seconds`
        (each report's reading: a peak between two readings is not seen)."""
        with self._lock:
            return max((int(stats.running or 0) for r in self._jobs.get(job_id, {}).values()
                        for at, stats in r.intervals if at >= now - seconds), default=0)


def summary(stats: ServingStats, *, seconds: float, slo: Slo | None, model_bytes: float | None = None,
            accelerator_model: str | None = None) -> dict[str, Any]:
    """What the API, `sentinel jobs` and /metrics say of a window's sums."""
    hists: dict[str, dict[int, int]] = {str(k): v for k, v in stats.histograms.items()}
    quantiles = {signal: {f"p{round(q * 100)}": buckets.quantile(hists[signal], q) for q in QUANTILES}
                 for signal in SIGNALS if hists.get(signal)}
    failed = sum(stats.failed.values())
    out: dict[str, Any] = {
        "requests": stats.requests, "requests_per_second": round(stats.requests / seconds, 4) if seconds else None,
        "failed": dict(stats.failed), "failed_ratio": round(failed / stats.requests, 4) if stats.requests else None,
        "output_tokens_per_second": round(stats.output_tokens / seconds, 3) if seconds else None,
        "latency_seconds": quantiles, "kv_transfer_ratio": _share(stats, "kv_transfer", "ttft"),
        "stage_ratio": {s: v for s in STAGES if (v := _share(stats, s, "e2e")) is not None},
        "kv_transfer_bytes": stats.kv_transfer_bytes, "kv_transfer_failures": stats.kv_transfer_failures,
        "preemptions": stats.preemptions, "slo": None, "slo_attainment_ratio": None, "goodput_per_second": None,
        "mbu_ratio": None}
    if slo is not None and stats.requests:
        good, basis = slo.met(stats)
        out.update(slo={"ttft_seconds": slo.ttft_seconds, "tpot_seconds": slo.tpot_seconds, "basis": basis},
                   slo_attainment_ratio=round(good / stats.requests, 4),
                   goodput_per_second=round(good / seconds, 4) if seconds else None)
    tpot = quantiles.get("tpot", {}).get("p50")
    bandwidth = peak_bandwidth(accelerator_model)
    if model_bytes and tpot and bandwidth:
        out["mbu_ratio"] = round(min(1.0, model_bytes / tpot / bandwidth), 4)
    return out


def _share(stats: ServingStats, part: str, whole: str) -> float | None:
    sums: dict[str, float] = {str(k): v for k, v in stats.sums.items()}
    total = sums.get(whole)
    if not total or part not in sums:
        return None
    return round(min(1.0, sums[part] / total), 4)


BURN_WINDOWS = ("5m", "30m", "1h", "6h")
BURN_SECONDS = (300.0, 1800.0, 3600.0, 21600.0)


def burn_rates(view: ServingView, job_id: int, now: float) -> list[float | None]:
    """How fast each window spends the error budget (Google SRE workbook): missed share ÷ (1 − objective).
    Without a registered SLO the budget is 1% of requests failed."""
    slo = view.slo(job_id)
    budget = 1.0 - (slo.objective if slo is not None else 0.99)
    out: list[float | None] = []
    for seconds in BURN_SECONDS:
        _, missed = view.error_ratio(job_id, now, seconds)
        out.append(None if missed is None else round(missed / budget, 4))
    return out
