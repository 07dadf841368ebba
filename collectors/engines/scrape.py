"""Read a serving engine's Prometheus `/metrics` page as Sentinel's `ServingStats`, one interval at a time.

An engine exposes cumulative counters and cumulative `le` histograms; Sentinel wants what happened in an
interval. So each reading is kept, and the next one is reported as its difference: per series, so that one
series restarting (or a new one appearing) does not hide the others. A series that went down was reset (the
engine restarted): its new value is the delta, as Prometheus' rate() takes it. A series that was not in the
previous reading was born since, and counts in full. A histogram's `_sum` gives its signal's seconds (`sums`),
restarting with its buckets. Gauges are the latest reading.

The first reading only sets the baseline: it gives a `ServingStats` with the gauges and no counts, so a caller
can tell an engine that answers (stats) from one that does not (None).

What each engine's names mean lives in an `EngineMap` (collectors/engines/vllm.py, sglang.py, dynamo.py).
`joint` (a request's TTFT and TPOT together) is always empty here: engines expose only the marginals.
"""

from __future__ import annotations

import http.client
import logging
import math
import time
import urllib.error
import urllib.request
from collections import defaultdict
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Literal

from prometheus_client.parser import text_string_to_metric_families
from pydantic import ValidationError

from sentinel.sdk.buckets import rebucket
from sentinel.telemetry.serving import FAILURE_REASONS, SIGNALS, ServingStats, Stage

log = logging.getLogger("sentinel.agent.engines")

Source = Literal["vllm", "sglang", "dynamo"]
Kind = Literal["histogram", "sum", "counter", "gauge"]
Labels = Mapping[str, str]
LabelKey = tuple[tuple[str, str], ...]
SeriesKey = tuple[int, LabelKey]  # (rule index, labels without `le`)
Pairs = dict[str, list[tuple[float, int]]]  # signal → [(le in seconds, count in the bucket)]

COUNTS = ("requests", "output_tokens", "prompt_tokens", "kv_transfer_bytes", "kv_transfer_failures", "preemptions")
GAUGES = ("running", "waiting", "kv_cache_usage_ratio")
RATIO_GAUGES = frozenset({"kv_cache_usage_ratio"})  # a share: the worst series, never a sum of shares
MAX_BODY_BYTES = 32 * 2**20  # a /metrics page is kilobytes; anything this big is not one


@dataclass(frozen=True)
class Rule:
    """One engine metric read into one Sentinel field.

    kind: `histogram` (its `_bucket` series onto the signal `target`, its `_sum` as that signal's seconds),
    `sum` (a histogram's `_sum` as a counter), `counter` (`metric` or `metric_total`) or `gauge`.
    target: a signal for a histogram; a count of ServingStats or `failed:<reason>` for a counter or a sum; a
    gauge field for a gauge. Where rules share a target, only the lowest `rank` present on the page is read:
    an older name is a fallback, never added to its successor. scale: multiplies a histogram's bounds and sum
    (into seconds) or a sum (into bytes). when: reads only the series whose labels it accepts.
    """

    metric: str
    kind: Kind
    target: str
    rank: int = 0
    scale: float = 1.0
    when: Callable[[Labels], bool] | None = None

    def sample_names(self) -> tuple[str, ...]:
        if self.kind == "histogram":
            return (f"{self.metric}_bucket", f"{self.metric}_sum")
        if self.kind == "sum":
            return (f"{self.metric}_sum",)
        if self.kind == "counter":
            base = self.metric.removesuffix("_total")
            return (base, f"{base}_total")
        return (self.metric,)


def _valid_target(rule: Rule) -> bool:
    if rule.kind == "histogram":
        return rule.target in SIGNALS
    if rule.kind == "gauge":
        return rule.target in GAUGES
    reason = rule.target.removeprefix("failed:")
    return rule.target in COUNTS or (rule.target.startswith("failed:") and reason in FAILURE_REASONS)


@dataclass(frozen=True)
class EngineMap:
    """An engine's names. `is_rank_label` marks the labels that repeat one count per parallel rank (SGLang's
    tp_rank): of series that differ only in those, the lowest rank's is read for counters and histograms, and
    the largest value for gauges."""

    source: Source
    rules: tuple[Rule, ...]
    is_rank_label: Callable[[str], bool] | None = None
    by_sample: dict[str, tuple[int, ...]] = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        wrong = [r for r in self.rules if not _valid_target(r)]
        if wrong:
            raise ValueError(f"{self.source}: rules with an unknown target: {wrong}")
        index: dict[str, list[int]] = defaultdict(list)
        for i, rule in enumerate(self.rules):
            for name in rule.sample_names():
                index[name].append(i)
        object.__setattr__(self, "by_sample", {name: tuple(ids) for name, ids in index.items()})


@dataclass
class Reading:
    """One page, cumulative: counters, sums and gauges by series; histograms as {le: cumulative count}, and
    their `_sum` (in the engine's unit) in `seconds`."""

    values: dict[SeriesKey, float] = field(default_factory=dict)
    buckets: dict[SeriesKey, dict[float, float]] = field(default_factory=dict)
    seconds: dict[SeriesKey, float] = field(default_factory=dict)

    def series(self) -> list[SeriesKey]:
        return list(dict.fromkeys([*self.values, *self.buckets, *self.seconds]))

    def drop(self, key: SeriesKey) -> None:
        self.values.pop(key, None)
        self.buckets.pop(key, None)
        self.seconds.pop(key, None)


class PageError(ValueError):
    """The page is not exposition text this adapter can read."""


def _label_key(labels: Labels, without: str = "le") -> LabelKey:
    return tuple(sorted((k, v) for k, v in labels.items() if k != without))


def parse(engine: EngineMap, text: str) -> Reading:
    """The page's known series. Raises PageError for text that is not exposition format."""
    reading = Reading()
    seen = 0
    try:
        for family in text_string_to_metric_families(text):
            for sample in family.samples:
                seen += 1
                _take(engine, reading, sample.name, sample.labels, float(sample.value))
    except Exception as exc:  # the parser's errors on hostile text are not all ValueError: none may escape
        raise PageError(f"not Prometheus exposition text: {type(exc).__name__}: {str(exc)[:200]}") from exc
    if not seen:
        raise PageError("no samples on the page")
    if not reading.series():
        raise PageError(f"no known {engine.source} metric on the page")
    _keep_best_rank(engine, reading)
    _drop_rank_duplicates(engine, reading)
    return reading


def _take(engine: EngineMap, reading: Reading, name: str, labels: Labels, value: float) -> None:
    for i in engine.by_sample.get(name, ()):
        rule = engine.rules[i]
        if rule.when is not None and not rule.when(labels):
            continue
        if math.isnan(value) or (rule.kind != "histogram" and math.isinf(value)):
            continue
        if rule.kind == "histogram" and name.endswith("_sum"):
            if math.isfinite(value):
                reading.seconds[(i, _label_key(labels))] = value
        elif rule.kind == "histogram":
            if "le" in labels:
                reading.buckets.setdefault((i, _label_key(labels)), {})[float(labels["le"])] = value
        else:
            reading.values[(i, _label_key(labels))] = value


def _keep_best_rank(engine: EngineMap, reading: Reading) -> None:
    """Where rules share a target, keep only the lowest-ranked rule that has a series on the page."""
    best: dict[str, int] = {}
    for i, _ in reading.series():
        rule = engine.rules[i]
        best[rule.target] = min(best.get(rule.target, rule.rank), rule.rank)
    for key in [k for k in reading.series() if engine.rules[k[0]].rank > best[engine.rules[k[0]].target]]:
        reading.drop(key)


def _rank_split(engine: EngineMap, labels: LabelKey) -> tuple[LabelKey, tuple[tuple[int, str], ...]]:
    """(the labels that say which requests, the rank labels as a sort key: tp_rank first, then by name)."""
    assert engine.is_rank_label is not None
    rest = tuple((k, v) for k, v in labels if not engine.is_rank_label(k))
    ranks = sorted(((k != "tp_rank", k), v) for k, v in labels if engine.is_rank_label(k))
    return rest, tuple((int(v) if v.isdigit() else 1 << 30, v) for _, v in ranks)


def _drop_rank_duplicates(engine: EngineMap, reading: Reading) -> None:
    """Counters and histograms: every rank counts the same requests, so only the lowest rank's series stays."""
    if engine.is_rank_label is None:
        return
    lowest: dict[tuple[int, LabelKey], tuple[tuple[int, str], ...]] = {}
    for i, labels in reading.series():
        if engine.rules[i].kind != "gauge":
            rest, rank = _rank_split(engine, labels)
            lowest[(i, rest)] = min(lowest.get((i, rest), rank), rank)
    for key in list(reading.series()):
        i, labels = key
        if engine.rules[i].kind != "gauge":
            rest, rank = _rank_split(engine, labels)
            if rank != lowest[(i, rest)]:
                reading.drop(key)


def counter_delta(now: float, before: float | None) -> float:
    """What a cumulative value gained; a value that went down was reset, and all of it is new."""
    if before is None or now < before:
        return now
    return now - before


def restarted(now: Mapping[float, float], before: Mapping[float, float] | None) -> bool:
    """Whether a cumulative `le` histogram starts afresh: new, a bucket that went down, or bounds that changed."""
    return before is None or before.keys() != now.keys() or any(now[le] < before[le] for le in now)


def bucket_delta(now: Mapping[float, float], before: Mapping[float, float] | None) -> list[tuple[float, int]]:
    """A cumulative `le` histogram's gain as [(le, count in (previous le, le])]; after a restart, all of it."""
    fresh = restarted(now, before)
    gained = dict(now) if fresh or before is None else {le: now[le] - before[le] for le in now}
    out: list[tuple[float, int]] = []
    below = 0.0
    for le in sorted(gained):
        out.append((le, round(gained[le] - below)))
        below = gained[le]
    return out


def _gauges(engine: EngineMap, reading: Reading) -> dict[str, float]:
    """Rank copies of one gauge give their largest; other series (models, engines, dp ranks) add up, except a
    ratio, which gives its largest."""
    per_series: dict[tuple[str, LabelKey], float] = {}
    for (i, labels), value in reading.values.items():
        rule = engine.rules[i]
        if rule.kind != "gauge":
            continue
        rest = _rank_split(engine, labels)[0] if engine.is_rank_label else labels
        key = (rule.target, (("__rule__", str(i)), *rest))
        per_series[key] = max(per_series.get(key, value), value)
    out: dict[str, float] = {}
    for (target, _), value in per_series.items():
        if target in RATIO_GAUGES:
            out[target] = max(out.get(target, value), value)
        else:
            out[target] = out.get(target, 0.0) + value
    return out


def _deltas(engine: EngineMap, now: Reading, before: Reading) -> tuple[dict[str, float], Pairs, dict[str, float]]:
    """(counts, histogram pairs, seconds per signal) gained since `before`."""
    counts: dict[str, float] = defaultdict(float)
    histograms: Pairs = defaultdict(list)
    seconds: dict[str, float] = defaultdict(float)
    for key, value in now.values.items():
        rule = engine.rules[key[0]]
        if rule.kind != "gauge":
            counts[rule.target] += counter_delta(value, before.values.get(key)) * rule.scale
    for key, cumulative in now.buckets.items():
        rule = engine.rules[key[0]]
        earlier = before.buckets.get(key)
        histograms[rule.target].extend((le * rule.scale, n) for le, n in bucket_delta(cumulative, earlier))
        if key in now.seconds:  # the sum restarts with its buckets, so that a mean stays one of the same requests
            previous = None if restarted(cumulative, earlier) else before.seconds.get(key)
            seconds[rule.target] += counter_delta(now.seconds[key], previous) * rule.scale
    return counts, histograms, seconds


def build(engine: EngineMap, now: Reading, before: Reading | None, *, replica: str | None,
          stage: Stage) -> ServingStats:
    """The interval between two readings as ServingStats (gauges only, without an earlier reading)."""
    counts, histograms, seconds = _deltas(engine, now, before) if before is not None else ({}, {}, {})
    gauges = _gauges(engine, now)
    hists = {signal: h for signal, pairs in histograms.items() if (h := rebucket(pairs))}
    sums = {signal: total for signal, total in seconds.items() if total > 0}
    failed = {t.removeprefix("failed:"): round(n) for t, n in counts.items() if t.startswith("failed:") and round(n)}
    ratio = gauges.get("kv_cache_usage_ratio")
    return ServingStats.model_validate({
        "source": engine.source, "replica": replica, "stage": stage,
        "failed": failed, "histograms": hists, "sums": sums,
        **{name: round(counts.get(name, 0.0)) for name in COUNTS},
        "running": round(gauges["running"]) if "running" in gauges else None,
        "waiting": round(gauges["waiting"]) if "waiting" in gauges else None,
        "kv_cache_usage_ratio": None if ratio is None else min(max(ratio, 0.0), 1.0),
    })


class Scraper:
    """Scrapes one engine endpoint and reports each interval's deltas. Never raises on a bad page or a dead
    endpoint: it returns None and says why in `last_error`, and keeps its last good reading as the baseline."""

    def __init__(self, engine: EngineMap, url: str, *, replica: str | None = None, stage: Stage = "mixed",
                 timeout_seconds: float = 2.0) -> None:
        self.engine = engine
        self.url = url
        self.replica = replica
        self.stage: Stage = stage
        self.timeout_seconds = timeout_seconds
        self.last_error: str | None = None
        self.last_reading_at: float | None = None  # when the baseline was read (the caller's clock)
        self._before: Reading | None = None

    def scrape(self, now: float | None = None) -> ServingStats | None:
        """Fetch the page and report the interval since the previous good reading (None: no good page)."""
        text = self._fetch()
        if text is None:
            return None
        return self.from_text(text, time.time() if now is None else now)

    def from_text(self, text: str, now: float) -> ServingStats | None:
        """The interval since the previous good reading, from a page's text (None: the page is no good)."""
        try:
            reading = parse(self.engine, text)
            stats = build(self.engine, reading, self._before, replica=self.replica, stage=self.stage)
        except (PageError, ValidationError, OverflowError) as exc:
            self._fail(f"{self.url}: {exc}")
            return None
        self._before, self.last_reading_at, self.last_error = reading, now, None
        return stats

    def _fail(self, error: str) -> None:
        if error != self.last_error:  # once per new failure, not once per scrape
            log.warning("engine scrape failed: %s", error)
        self.last_error = error

    def _fetch(self) -> str | None:
        body, error = fetch(self.url, self.timeout_seconds)
        if error is not None:
            self._fail(f"{self.url}: {error}")
        return body


def fetch(url: str, timeout_seconds: float, *, max_bytes: int = MAX_BODY_BYTES,
          accept: str = "text/plain;version=0.0.4") -> tuple[str | None, str | None]:
    """(the page's text, None) or (None, why not): stdlib only, the agent adds no HTTP client for this."""
    request = urllib.request.Request(url, headers={"Accept": accept})
    try:
        with urllib.request.urlopen(request, timeout=timeout_seconds) as response:
            if response.status != 200:
                return None, f"HTTP {response.status}"
            body: bytes = response.read(max_bytes + 1)
    except urllib.error.HTTPError as exc:
        return None, f"HTTP {exc.code}"
    except (urllib.error.URLError, http.client.HTTPException, OSError, ValueError) as exc:
        return None, f"{type(exc).__name__}: {exc}"
    if len(body) > max_bytes:
        return None, f"page over {max_bytes} bytes"
    return body.decode("utf-8", errors="replace"), None
