"""The experiment catalog: probes that confirm or refute a diagnosis, each a number against an expectation.

| kind               | runs on   | measures                                            | confirmed when               |
| ------------------ | --------- | --------------------------------------------------- | ---------------------------- |
| `gemm`             | the agent | GEMM rate ÷ the accelerator's expected rate          | < 0.8                        |
| `cpu`              | the agent | the task's run-queue wait share, and who else runs   | ≥ max(0.2, baseline + 0.15)  |
| `memory_bandwidth` | the agent | copy bandwidth                                       | < 0.5× its calibration       |
| `disk_write`       | the agent | write + fsync throughput of the checkpoint directory | < 0.5× its calibration       |
| `collective`       | the agent | bus bandwidth of a 2-rank exchange with a peer       | < 0.5× its calibration       |
| `data_loader`      | server    | the loader's batches/s from the SDK, fresh window    | < 0.5× at the baseline       |
| `rank_compare`     | server    | a rank's compute ÷ its peers' median, fresh window   | ≥ 1.3                        |

A reference ("calibration") is what the same experiment measured on the same target while the job was
healthy: the engine runs `disk_write` and `collective` once when a job's baseline is learnt. Without a
reference the result is reported with no verdict ("inconclusive"), never guessed. A result that does not
arrive in `timeout_seconds` is `timed_out`; an agent's error is `failed`, with its reason.
"""

from __future__ import annotations

import itertools
import statistics
import threading
from dataclasses import dataclass, field

from sentinel.diagnosis.components import RankProfile
from sentinel.diagnosis.schemas import ExperimentOut, ExperimentProposal
from sentinel.telemetry.schemas import ExperimentResult

AGENT_KINDS = {"gemm", "cpu", "memory_bandwidth", "disk_write", "collective"}
SERVER_KINDS = {"data_loader", "rank_compare"}
TIMEOUT_SECONDS = 60.0
FRESH_WINDOW_SECONDS = 6.0  # server-side experiments read telemetry received after the request
MAX_KEPT = 500


def reference_key(kind: str, node: str | None, target: str) -> str:
    return f"{kind}|{node}|{target}"


@dataclass
class Running:
    out: ExperimentOut
    proposal: ExperimentProposal
    baseline_cpu_wait: float | None = None
    reference_key: str = ""


@dataclass
class ExperimentBook:
    """Experiments asked for, their results and the references calibrations left; in memory, bounded."""

    timeout_seconds: float = TIMEOUT_SECONDS
    _ids: itertools.count[int] = field(default_factory=lambda: itertools.count(1))
    _items: dict[str, Running] = field(default_factory=dict)
    references: dict[str, tuple[float, float]] = field(default_factory=dict)  # key → (value, measured at)
    _lock: threading.Lock = field(default_factory=threading.Lock)

    def open(self, job_id: int, proposal: ExperimentProposal, target: str, now: float, *, calibration: bool = False,
             baseline_cpu_wait: float | None = None, key: str = "") -> Running:
        with self._lock:
            ident = f"exp-{next(self._ids)}"
            item = Running(ExperimentOut(id=ident, job_id=job_id, kind=proposal.kind, node=proposal.node,
                                         target=target, state="pending", calibration=calibration, created_at=now),
                           proposal, baseline_cpu_wait, key)
            self._items[ident] = item
            while len(self._items) > MAX_KEPT:
                self._items.pop(next(iter(self._items)))
            return item

    def get(self, ident: str) -> Running | None:
        with self._lock:
            return self._items.get(ident)

    def of_job(self, job_id: int) -> list[ExperimentOut]:
        with self._lock:
            return [i.out.model_copy() for i in self._items.values() if i.out.job_id == job_id]

    def pending(self) -> list[Running]:
        with self._lock:
            return [i for i in self._items.values() if i.out.state == "pending"]

    def agent_result(self, result: ExperimentResult, now: float) -> Running | None:
        """An agent's result for an experiment still pending here; None for an unknown or finished one."""
        item = self.get(result.id)
        if item is None or item.out.state != "pending":
            return None
        out = item.out
        out.finished_at, out.detail = now, result.detail
        if result.error is not None or result.value is None:
            out.state, out.error = "failed", result.error or "no value"
            out.summary = f"failed: {out.error}"
            return item
        out.state, out.value, out.unit = "done", result.value, result.unit
        self._judge(item)
        return item

    def finish(self, item: Running, value: float | None, unit: str, detail: str, now: float,
               error: str | None = None) -> None:
        out = item.out
        out.finished_at, out.detail = now, detail
        if error is not None or value is None:
            out.state, out.error, out.summary = "failed", error or "no value", f"failed: {error or 'no value'}"
            return
        out.state, out.value, out.unit = "done", value, unit
        self._judge(item)

    def expire(self, now: float) -> list[Running]:
        late = [i for i in self.pending() if now - i.out.created_at > self.timeout_seconds
                and i.proposal.kind in AGENT_KINDS]
        for item in late:
            item.out.state, item.out.finished_at = "timed_out", now
            item.out.error = f"no result from {item.out.node} within {self.timeout_seconds:.0f} s"
            item.out.summary = f"timed out: {item.out.error}"
        return late

    def _judge(self, item: Running) -> None:
        out = item.out
        value = out.value
        assert value is not None
        if out.calibration:
            self.references[item.reference_key] = (value, out.finished_at or 0.0)
            out.summary = f"calibration: {out.target} {_show(value, out.unit)}"
            return
        kind = out.kind
        if kind == "gemm":
            out.expected, out.expected_from, out.ratio = 1.0, "the accelerator's expected rate", value
            out.verdict = "confirmed" if value < 0.8 else "refuted"
        elif kind == "cpu":
            limit = max(0.2, (item.baseline_cpu_wait or 0.0) + 0.15)
            out.expected, out.expected_from = item.baseline_cpu_wait, "the rank's CPU wait at baseline"
            out.verdict = "confirmed" if value >= limit else "refuted"
        elif kind in ("disk_write", "collective", "memory_bandwidth"):
            ref = self.references.get(item.reference_key)
            if ref is None:
                out.verdict, out.expected_from = "inconclusive", "no calibration of this target yet"
            else:
                out.expected, out.expected_from = ref[0], "its calibration while the job was healthy"
                out.ratio = value / ref[0] if ref[0] > 0 else None
                out.verdict = "confirmed" if out.ratio is not None and out.ratio < 0.5 else "refuted"
        elif kind == "data_loader":  # value: loader batches/s now; expected: at the job's baseline
            out.ratio = value / out.expected if out.expected else None
            out.verdict = "confirmed" if out.ratio is not None and out.ratio < 0.5 else "refuted"
        elif kind == "rank_compare":
            out.expected, out.expected_from, out.ratio = 1.0, "the peers' median compute", value
            out.verdict = "confirmed" if value >= 1.3 else "refuted"
        ratio = f", {out.ratio:.2f}× {out.expected_from}" if out.ratio is not None else ""
        out.summary = f"{out.verdict}: {out.target} {_show(value, out.unit)}{ratio}"


def loader_rate(profiles: dict[int, RankProfile], base: dict[int, RankProfile], rank: int
                ) -> tuple[float, float | None, str] | None:
    """(batches/s the loop got from its loader per second it waited, the same at the job's baseline, detail)."""
    p, was = profiles.get(rank), base.get(rank)
    if p is None or p.components["data_wait"] <= 0:
        return None
    delivered = 1.0 / p.components["data_wait"]
    before = 1.0 / was.components["data_wait"] if was is not None and was.components["data_wait"] > 0 else None
    return delivered, before, (f"rank {rank}: the loop waits {p.components['data_wait'] * 1000:.1f} ms per batch "
                               f"({delivered:.1f} batches/s)" + (f", {1000 / before:.1f} ms at baseline"
                                                                 if before else "") +
                               f"; the rest of the step takes {(p.iteration - p.components['data_wait']) * 1000:.1f}"
                               " ms")


def compute_ratio(profiles: dict[int, RankProfile], rank: int) -> tuple[float, str] | None:
    p = profiles.get(rank)
    peers = [q.components["compute"] for r, q in profiles.items() if r != rank]
    if p is None or not peers or statistics.median(peers) <= 0:
        return None
    ratio = p.components["compute"] / statistics.median(peers)
    return ratio, (f"rank {rank} computes {p.components['compute'] * 1000:.1f} ms per step, its peers "
                   f"{statistics.median(peers) * 1000:.1f} ms (median of {len(peers)})")


def _show(value: float, unit: str) -> str:
    if unit == "bytes/s":
        return f"{value / 1e6:.1f} MB/s"
    if unit == "ratio":
        return f"{value:.2f}"
    return f"{value:.3g} {unit}".strip()
