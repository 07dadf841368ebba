"""The probe-mesh matrix: what each agent measured to each peer, kept for a window.

Fed by reports (`NodeReport.probes`); read by the localisation (localise.py), the interconnect detectors,
`GET /api/v1/network/matrix` and `sentinel_network_probe_rtt_seconds`. Memory is O(pairs probed within the
window): with k peers per node and targets rotating every round, about N·k·(window ÷ round) pairs.
"""

from __future__ import annotations

import statistics
import threading
from dataclasses import dataclass

from sentinel.telemetry.schemas import ProbeResult

MAX_RESULTS_PER_PAIR = 64


@dataclass(frozen=True, slots=True)
class Sample:
    at: float  # when the window the agent measured ended (its wall clock)
    started: float  # and when it began: a prober cuts its window where a peer stops answering
    received_at: float  # when the server took it
    sent: int
    received: int
    p50: float | None
    p99: float | None


@dataclass(frozen=True, slots=True)
class PairStats:
    """One ordered pair (source probed target) over the window."""

    source: str
    target: str
    sent: int
    received: int
    rtt_p50_seconds: float | None  # median of the windows' medians
    rtt_p99_seconds: float | None  # the worst window's p99
    last_at: float
    last_lost: bool  # the newest window got nothing back
    # the newest window alone: the localisation names a link or node only while it is still bad now, so a pair
    # that recovered (a node back from a cut, ARP re-resolving) stops being named before its window ages out
    last_sent: int = 0  # 0: not known (then only the window counts)
    last_received: int = 0
    last_p50: float | None = None

    @property
    def loss_ratio(self) -> float:
        return 1.0 - self.received / self.sent if self.sent else 0.0


class ProbeMatrix:
    def __init__(self, window_seconds: float):
        self.window_seconds = window_seconds
        self._lock = threading.Lock()
        self._pairs: dict[tuple[str, str], list[Sample]] = {}  # oldest first (a list: most pairs hold 1-3)
        self._probers: dict[str, set[str]] = {}  # target → the sources with samples about it
        # each pair's stats over the whole window, kept until it gets a sample or loses one: in a round only
        # the pairs probed in it change (about window ÷ round of those held), so the rest are not recomputed
        self._stats: dict[tuple[str, str], PairStats] = {}
        self.results_total = 0

    def add(self, source: str, results: list[ProbeResult], now: float) -> None:
        with self._lock:
            for r in results:
                if r.target == source:
                    continue
                samples = self._pairs.get((source, r.target))
                if samples is None:
                    samples = self._pairs[(source, r.target)] = []
                    self._probers.setdefault(r.target, set()).add(source)
                samples.append(Sample(r.ended_at, r.started_at, now, r.sent, r.received, r.rtt_p50_seconds,
                                      r.rtt_p99_seconds))
                if len(samples) > MAX_RESULTS_PER_PAIR:
                    del samples[0]
                self._stats.pop((source, r.target), None)
                self.results_total += 1

    def forget(self, node: str) -> None:
        """A node left the fleet: its pairs go."""
        with self._lock:
            for pair in [p for p in self._pairs if node in p]:
                self._drop(pair)

    def prune(self, now: float) -> None:
        cutoff = now - self.window_seconds
        with self._lock:
            for pair in list(self._pairs):
                samples = self._pairs[pair]
                if samples and samples[0].received_at < cutoff:
                    self._stats.pop(pair, None)
                    samples[:] = [s for s in samples if s.received_at >= cutoff]
                if not samples:
                    self._drop(pair)

    def _drop(self, pair: tuple[str, str]) -> None:
        del self._pairs[pair]
        self._stats.pop(pair, None)
        sources = self._probers.get(pair[1])
        if sources is not None:
            sources.discard(pair[0])
            if not sources:
                del self._probers[pair[1]]

    def pairs(self, now: float, window_seconds: float | None = None) -> list[PairStats]:
        whole = window_seconds is None or window_seconds >= self.window_seconds
        cutoff = now - (self.window_seconds if window_seconds is None else window_seconds)
        out: list[PairStats] = []
        with self._lock:
            for pair, samples in self._pairs.items():
                if not samples:
                    continue
                inside = samples[0].received_at >= cutoff
                if whole and inside and (cached := self._stats.get(pair)) is not None:
                    out.append(cached)
                    continue
                kept = list(samples) if inside else [s for s in samples if s.received_at >= cutoff]
                if not kept:
                    continue
                stats = _stats(pair[0], pair[1], kept)
                if whole and inside:
                    self._stats[pair] = stats
                out.append(stats)
        return out

    def history(self, source: str, target: str) -> list[Sample]:
        """The windows `source` measured to `target`, oldest first."""
        with self._lock:
            return list(self._pairs.get((source, target), ()))

    def targets(self) -> list[str]:
        with self._lock:
            return list(self._probers)

    def towards(self, target: str, since: float) -> list[tuple[str, Sample]]:
        """(source, sample) of every probe result about `target` taken since `since`, oldest first."""
        with self._lock:
            found = [(source, s) for source in self._probers.get(target, ())
                     for s in self._pairs[(source, target)] if s.received_at >= since]
        return sorted(found, key=lambda item: item[1].received_at)


def _stats(source: str, target: str, samples: list[Sample]) -> PairStats:
    p50s = [s.p50 for s in samples if s.p50 is not None]
    p99s = [s.p99 for s in samples if s.p99 is not None]
    return PairStats(source=source, target=target, sent=sum(s.sent for s in samples),
                     received=sum(s.received for s in samples),
                     rtt_p50_seconds=statistics.median(p50s) if p50s else None,
                     rtt_p99_seconds=max(p99s) if p99s else None, last_at=samples[-1].at,
                     last_lost=samples[-1].received == 0, last_sent=samples[-1].sent,
                     last_received=samples[-1].received, last_p50=samples[-1].p50)


def unreachable(matrix: ProbeMatrix, target: str, since: float, min_probers: int) -> list[str]:
    """The probers that lost every probe sent to `target` since anyone last got an answer from it (within the
    samples since `since`), when at least `min_probers` did (else []).

    Windows are compared on the agents' clocks, not on arrival: the report that carries a prober's first loss
    also carries its window of answers before it. A loss that an answer came after (a prober that was cut off
    itself for a moment, replaying its spool) does not count."""
    found = matrix.towards(target, since)
    last_answer = max((s.at for _, s in found if s.received > 0), default=float("-inf"))
    probers = sorted({source for source, s in found if s.received == 0 and s.started > last_answer})
    return probers if len(probers) >= min_probers else []
